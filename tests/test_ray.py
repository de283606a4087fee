"""The Ray engine on a real two-node cluster (one machine) gives the local engine's answers, row for row."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray", reason='the Ray engine tests need Ray: pip install "lengthscan[ray]"')

import lengthscan
from lengthscan.engines.ray.api import audit_ray
from lengthscan.engines.ray.session import EngineError

#: Report fields that differ between any two runs (clock, command, output folder).
VOLATILE = {"created", "seconds", "command"}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory, corpus_rows):
    """The corpus as three Parquet shards of unequal size, several row groups each."""
    folder = tmp_path_factory.mktemp("shards")
    cuts = [0, 700, 1900, len(corpus_rows)]
    for i in range(3):
        table = pa.Table.from_pylist(corpus_rows[cuts[i]:cuts[i + 1]],
                                     schema=pa.schema([("text", pa.string()), ("summary", pa.string())]))
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=300)
    return str(folder / "part-*.parquet")


@pytest.fixture(scope="module")
def disk_dict(tmp_path_factory, corpus_rows):
    from datasets import Dataset, DatasetDict

    path = tmp_path_factory.mktemp("disk") / "dd"
    DatasetDict({"train": Dataset.from_list(corpus_rows[:1800]),
                 "validation": Dataset.from_list(corpus_rows[1800:])}).save_to_disk(str(path))
    return str(path)


def _stable(result) -> dict:
    d = result.to_dict()
    for k in VOLATILE:
        d.pop(k, None)
    return json.loads(json.dumps(d))


def _compare(tmp_path, source, **kw):
    local = lengthscan.audit(source, out=tmp_path / "local", **kw)
    distributed = audit_ray(source, out=tmp_path / "ray", num_blocks=7, **kw)
    a = pq.read_table(tmp_path / "local" / "lengths.parquet")
    b = pq.read_table(tmp_path / "ray" / "lengths.parquet")
    assert a.schema == b.schema
    assert a.num_rows == b.num_rows == local.rows_measured
    assert a.to_pylist() == b.to_pylist()
    want, got = _stable(local), _stable(distributed)
    for ls, rs in zip(want["splits"], got["splits"]):
        assert rs["fields"] == ls["fields"]
        assert rs["pair"] == ls["pair"]
        assert rs["limits"] == ls["limits"]
    want.pop("splits"), got.pop("splits")
    assert got == want
    report = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert report["splits"] == distributed.to_dict()["splits"]
    assert (tmp_path / "ray" / "report.html").stat().st_size > 0
    return local, distributed


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_jsonl_same_answers(cluster, tmp_path, corpus_jsonl, bpe_dir, how):
    _, result = _compare(tmp_path, str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                         **how)
    assert result.splits[0].sample.rows_measured == (300 if "sample" in how else result.splits[0].sample.rows_total)


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_parquet_shards_same_answers(cluster, tmp_path, parquet_glob, marian_dir, how):
    _compare(tmp_path, parquet_glob, tokenizer=str(marian_dir), input="text", target="summary", **how)


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_save_to_disk_dict_same_answers(cluster, tmp_path, disk_dict, bpe_dir, how):
    _, result = _compare(tmp_path, disk_dict, tokenizer=str(bpe_dir), input="text", target="summary", **how)
    assert [s.split for s in result.splits] == ["train", "validation"]


def test_limits_and_decisions_match(cluster, tmp_path, parquet_glob, bpe_dir):
    local, distributed = _compare(tmp_path, parquet_glob, tokenizer=str(bpe_dir), input="text", target="summary",
                                  full=True, limits=["input_tokens<=p99", "target_tokens<=40"])
    assert distributed.decisions == local.decisions


def test_hub_id_is_refused(cluster, bpe_dir):
    with pytest.raises(EngineError, match="distributed"):
        audit_ray("someone/some-dataset", tokenizer=str(bpe_dir), input="text")


def test_missing_ray_gives_the_install_command(monkeypatch, corpus_jsonl, bpe_dir):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(EngineError, match=r'pip install "lengthscan\[ray\]"'):
        audit_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text")
    from lengthscan.engines.ray.api import clean_ray

    with pytest.raises(EngineError, match=r'pip install "lengthscan\[ray\]"'):
        clean_ray(str(corpus_jsonl), out="never-written", tokenizer=str(bpe_dir), input="text")


def test_core_package_never_imports_ray():
    import subprocess
    import sys

    code = ("import sys, lengthscan, lengthscan.engines.ray.api, lengthscan.engines.ray.engine, "
            "lengthscan.engines.ray.sources, lengthscan.engines.ray.write, lengthscan.write.parquet, lengthscan.cli.main; "
            "print('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
