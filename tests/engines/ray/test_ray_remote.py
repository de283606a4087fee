"""The Ray engine on the sources it refused before: ``http(s)://`` files and hub dataset ids /
``hf://`` paths (served by the range server, ``tests.support.range_server``, on 127.0.0.1: no
network), read by the actors with the local engine's readers; and the length cache, which the two
engines now share. Each against the local engine's audit of the same source, row for row."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv  # noqa: F401 (pa.csv)
import pyarrow.parquet as pq
import pytest

import lengthscan
from lengthscan import audit_ray, clean_ray
from tests.support.range_server import RangeServer, hub_env

pytest.importorskip("ray", reason='the Ray engine tests need Ray: pip install "lengthscan[ray]"')
pytestmark = pytest.mark.ray

SCHEMA = pa.schema([("text", pa.string()), ("summary", pa.string())])
KW = dict(input="text", target="summary", cache=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory, corpus_rows):
    """The corpus as three Parquet shards (row groups of 100 rows), JSON Lines and CSV, over HTTP."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "parquet").mkdir()
    cuts = [0, 700, 1900, len(corpus_rows)]
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(corpus_rows[cuts[i]:cuts[i + 1]], schema=SCHEMA),
                       folder / "parquet" / f"part-{i}.parquet", row_group_size=100)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus_rows),
                                         encoding="utf-8")
    pa.csv.write_csv(pa.Table.from_pylist(corpus_rows, schema=SCHEMA), folder / "corpus.csv")
    with RangeServer(folder) as srv:
        yield srv


def _same(tmp_path, spec: str, server, bpe_dir, num_blocks=None, **kw) -> dict:
    """The local engine's audit of ``spec`` and the Ray engine's: the same lengths.parquet (its
    source_file column too: the same URLs) and statistics; every byte the server sent to the Ray
    run (its driver and its actors) counted in its report."""
    local = lengthscan.audit(spec, tokenizer=str(bpe_dir), out=tmp_path / "local", **KW, **kw)
    server.reset_counts()
    ray = audit_ray(spec, tokenizer=str(bpe_dir), out=tmp_path / "ray", num_blocks=num_blocks, **KW, **kw)
    a, b = (pq.read_table(tmp_path / side / "lengths.parquet") for side in ("local", "ray"))
    assert b.schema == a.schema and b.to_pylist() == a.to_pylist()
    assert a.num_rows == local.rows_measured > 0
    assert [s.to_dict() for s in ray.splits] == [s.to_dict() for s in local.splits]
    report = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert report["source"]["location"] == "remote"
    assert report["source"]["bytes_read"] == server.bytes_served > 0
    return report


@pytest.mark.parametrize("how", [{"full": True}, {"sample": "10%", "sample_unit": "block", "seed": 3},
                                 {"sample": 300, "seed": 5}], ids=["full", "block-sample", "row-sample"])
def test_http_parquet_same_rows_as_the_local_engine(cluster, tmp_path, served, bpe_dir, how):
    _same(tmp_path, f"{served.url}/files/parquet/*.parquet", served, bpe_dir, num_blocks=5, **how)


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.csv"])
def test_http_jsonl_and_csv_same_rows_as_the_local_engine(cluster, tmp_path, served, bpe_dir, name):
    _same(tmp_path, f"{served.url}/files/{name}", served, bpe_dir, full=True, num_blocks=3)


def test_http_clean_same_as_local(cluster, tmp_path, served, bpe_dir):
    """Both clean modes on an http source: one pass (absolute limits), two passes (a percentile)."""
    spec = f"{served.url}/files/parquet/*.parquet"
    for limits in (["input_tokens<=96"], ["input_tokens<=p90"]):
        out = tmp_path / limits[0].replace("<=", "-")
        kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", cache=False, limits=limits)
        local = lengthscan.clean(spec, out=out / "local", **kw)
        ray = clean_ray(spec, out=out / "ray", num_blocks=4, **kw)
        decisions = local.decisions.to_dict()
        assert ray.decisions.to_dict() == decisions and decisions["splits"][0]["dropped"]
        lengths = [pq.read_table(out / side / "lengths.parquet").to_pylist() for side in ("local", "ray")]
        assert lengths[1] == lengths[0]
        from datasets import load_from_disk

        assert load_from_disk(str(out / "ray" / "dataset")).to_list() == \
            load_from_disk(str(out / "local" / "dataset")).to_list()


def test_the_length_cache_serves_both_engines(cluster, tmp_path, corpus_jsonl, bpe_dir, monkeypatch):
    """The same split fingerprint on both engines: what one measured, the other reads from the cache."""
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", full=True, cache=True)
    first = audit_ray(str(corpus_jsonl), out=tmp_path / "ray-1", **kw)  # measured on the actors, cached
    assert first.to_dict()["cache_hits"] == 0
    local = lengthscan.audit(str(corpus_jsonl), out=tmp_path / "local", **kw)
    again = audit_ray(str(corpus_jsonl), out=tmp_path / "ray-2", **kw)
    assert local.to_dict()["cache_hits"] == again.to_dict()["cache_hits"] == 2
    assert again.to_dict()["tokenizer"]["methods"] == {"input": "cached lengths", "target": "cached lengths"}
    tables = [pq.read_table(tmp_path / side / "lengths.parquet") for side in ("ray-1", "local", "ray-2")]
    assert tables[1].to_pylist() == tables[0].to_pylist() == tables[2].to_pylist()
    assert [s.to_dict() for s in again.splits] == [s.to_dict() for s in first.splits]


# -- hub dataset ids and hf:// paths --------------------------------------------------------------

SHA = "a" * 40

#: A Ray run in a process of its own (huggingface_hub reads HF_HUB_OFFLINE, which tests/conftest.py sets,
#: at import): the hub id, then the hf:// glob of its train files, each audited on a local Ray.
HUB_RUN = """
import sys, ray
ray.init(address="local", num_cpus=2, log_to_driver=False, include_dashboard=False)
from lengthscan import audit_ray
tok, out = sys.argv[1], sys.argv[2]
for spec, name in (("lsc/corpus", "hub"), ("hf://datasets/lsc/corpus/data/train-*.parquet", "hf")):
    audit_ray(spec, tokenizer=tok, input="text", target="summary", full=True, cache=False, out=f"{out}/{name}")
"""


@pytest.mark.slow  # a process of its own, with a Ray of its own
def test_a_hub_id_and_hf_paths_same_rows_as_the_local_files(tmp_path, corpus_rows, bpe_dir):
    root = tmp_path / "hub"
    for name, rows in (("train-00000-of-00002", corpus_rows[:900]), ("train-00001-of-00002", corpus_rows[900:2000]),
                       ("test-00000-of-00001", corpus_rows[2000:])):
        (root / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), root / "data" / f"{name}.parquet",
                       row_group_size=100)
    (root / "README.md").write_text("# corpus\n")
    with RangeServer(root) as srv:
        srv.add_dataset("lsc/corpus", {"main": (root, SHA)})
        env = hub_env(srv, tmp_path / "hf-home")
        env["LENGTHSCAN_CACHE"] = str(tmp_path / "cache")
        run = subprocess.run([sys.executable, "-c", HUB_RUN, str(bpe_dir), str(tmp_path / "ray")], env=env,
                             text=True, capture_output=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", full=True, cache=False)
    train = lengthscan.audit(str(root / "data" / "train-*.parquet"), out=tmp_path / "train", **kw)
    test = lengthscan.audit(str(root / "data" / "test-*.parquet"), out=tmp_path / "test", **kw)

    def lengths(out, split=None, drop=("source_file",)):
        """The rows of lengths.parquet without the file column (URLs on one side, paths on the other)."""
        table = pq.read_table(out / "lengths.parquet")
        if split is not None:
            table = table.filter(pa.compute.equal(table["split"], split)).drop_columns(["split"])
        return table.drop_columns([c for c in drop if c in table.column_names]).to_pylist()

    hub = json.loads((tmp_path / "ray" / "hub" / "report.json").read_text())
    assert hub["source"]["revision"] == SHA and [s["split"] for s in hub["splits"]] == ["train", "test"]
    assert lengths(tmp_path / "ray" / "hub", "train") == lengths(tmp_path / "train")
    # the test split's one file: its file_row is its row (the hub source has several files)
    assert lengths(tmp_path / "ray" / "hub", "test", ("source_file", "file_row")) == lengths(tmp_path / "test")
    assert hub["splits"][0]["fields"] == train.to_dict()["splits"][0]["fields"]
    assert hub["splits"][1]["fields"] == test.to_dict()["splits"][0]["fields"]
    assert lengths(tmp_path / "ray" / "hf") == lengths(tmp_path / "train")
    files = pq.read_table(tmp_path / "ray" / "hf" / "lengths.parquet")["source_file"].to_pylist()
    assert all(f.startswith(f"hf://datasets/lsc/corpus@{SHA}/data/train-") for f in files)
