"""``clean`` on the Ray engine, on a real two-node cluster (one machine), against the local engine:
the same dataset/, rejects/, lengths.parquet and report, row for row, also when a worker process
is killed mid-job; CSV sources; object storage (s3:// on moto's server, offline)."""

from __future__ import annotations

import csv
import json
import os
import signal
import traceback
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import lengthscan
from lengthscan import audit_ray, clean_ray
from lengthscan.cli.main import main
from lengthscan.measure.text.counter import TokenCounter

# The two-node cluster and the parquet_glob and disk_dict sources are conftest.py's fixtures.
pytest.importorskip("ray", reason='the Ray engine tests need Ray: pip install "lengthscan[ray]"')
pytestmark = pytest.mark.ray

#: Report fields that differ between any two runs (clock, command, output folder).
VOLATILE = {"created", "seconds", "command"}


# -- comparing the two engines' outputs ------------------------------------------------------------

def _load(path: Path, fmt: str):
    import datasets

    if fmt == "arrow":
        return datasets.load_from_disk(str(path))
    loaded = datasets.load_dataset("parquet", data_dir=str(path))
    return loaded if (path / "dataset_dict.json").exists() else loaded["train"]


def _rows(ds) -> dict:
    """split -> (features, rows) of a Dataset or DatasetDict."""
    if hasattr(ds, "features"):
        return {"train": (ds.features, ds.to_list())}
    return {name: (d.features, d.to_list()) for name, d in ds.items()}


def _report(path: Path) -> dict:
    data = json.loads((path / "report.json").read_text())
    for k in VOLATILE:
        data.pop(k, None)
    data["clean"].pop("out_dir")
    return data


def _same_outputs(local: Path, distributed: Path, fmt: str = "arrow", rename=None) -> None:
    """Every output of the two runs equal, row for row. ``rename`` maps the Ray run's file names to the
    local run's (a source in object storage read locally from a copy: ``source`` differs too)."""
    remote, rename = rename is not None, rename or (lambda value: value)
    for sub in ("dataset", "rejects"):
        want, got = _rows(_load(local / sub, fmt)), _rows(_load(distributed / sub, fmt))
        assert list(got) == list(want)
        for split in want:
            assert got[split][0] == want[split][0], f"{sub}/{split}: features"
            rows = [{k: rename(v) if k == "source_file" else v for k, v in r.items()} for r in got[split][1]]
            assert rows == want[split][1], f"{sub}/{split}: rows"
    a, b = pq.read_table(local / "lengths.parquet"), pq.read_table(distributed / "lengths.parquet")
    assert b.schema == a.schema
    b_rows = [{k: rename(v) if k == "source_file" else v for k, v in r.items()} for r in b.to_pylist()]
    assert b_rows == a.to_pylist()
    want, got = _report(local), _report(distributed)
    if remote:
        want.pop("source"), got.pop("source")
    assert got == want


def _only_shards(out: Path, fmt: str = "arrow") -> None:
    """The published folders hold the shards and the metadata, nothing a killed attempt left."""
    for sub in ("dataset", "rejects"):
        top = out / sub
        splits = [p for p in top.iterdir() if p.is_dir()]
        for folder in splits or [top]:
            names = sorted(p.name for p in folder.iterdir())
            shards = [n for n in names if n.startswith("data-")]
            assert shards == [f"data-{k:05d}-of-{len(shards):05d}.{fmt}" for k in range(len(shards))] and shards
            assert set(names) - set(shards) <= ({"state.json", "dataset_info.json"} if fmt == "arrow" else set())
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "staging left behind"


_LOCAL: dict = {}


def _local_clean(tmp_path_factory, source, **kw) -> Path:
    """The local engine's clean of ``source`` (run once per module for the same options)."""
    key = json.dumps([str(source), kw], sort_keys=True, default=str)
    if key not in _LOCAL:
        out = tmp_path_factory.mktemp("local") / "out"
        lengthscan.clean(source, out=out, cache=False, **kw)  # the Ray engine has no length cache
        _LOCAL[key] = out
    return _LOCAL[key]


# -- same answers ----------------------------------------------------------------------------------

def test_jsonl_drop_same_as_local(cluster, tmp_path, tmp_path_factory, corpus_jsonl, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary",
              limits=["input_tokens<=128", "target_tokens<=16"])
    local = _local_clean(tmp_path_factory, str(corpus_jsonl), **kw)
    result = clean_ray(str(corpus_jsonl), out=tmp_path / "ray", num_blocks=7, **kw)
    assert result.published and result.decisions.to_dict()["splits"][0]["dropped"] > 0
    _same_outputs(local, tmp_path / "ray")
    _only_shards(tmp_path / "ray")
    # absolute limits: one pass, the rows written on the driver by the local writer, its shards as locally
    assert sorted(p.name for p in (tmp_path / "ray" / "dataset").iterdir()) == \
        sorted(p.name for p in (local / "dataset").iterdir())


def test_parquet_shards_truncate_and_tokenize_same_as_local(cluster, tmp_path, tmp_path_factory, parquet_glob,
                                                            bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", action="truncate", tokenize=True,
              limits=["input_tokens<=96", "target_tokens<=p90"])
    local = _local_clean(tmp_path_factory, parquet_glob, **kw)
    result = clean_ray(parquet_glob, out=tmp_path / "ray", num_blocks=5, **kw)
    assert result.decisions.to_dict()["splits"][0]["truncated"] > 100
    _same_outputs(local, tmp_path / "ray")
    _only_shards(tmp_path / "ray")
    # a percentile limit: two passes, the second written by the actors, one shard per read task
    assert len(list((tmp_path / "ray" / "dataset").glob("data-*.arrow"))) > 1
    rejects = pq.read_table(local / "lengths.parquet").column("source_file").unique().to_pylist()
    assert len(rejects) == 3  # a multi-file source: rows located by file


def test_dataset_dict_parquet_format_same_as_local(cluster, tmp_path, tmp_path_factory, disk_dict, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", format="parquet",
              limits=["input_tokens<=p95", "target_tokens/input_tokens<=z4"])
    local = _local_clean(tmp_path_factory, disk_dict, **kw)
    clean_ray(disk_dict, out=tmp_path / "ray", num_blocks=4, **kw)
    _same_outputs(local, tmp_path / "ray", fmt="parquet")
    _only_shards(tmp_path / "ray", fmt="parquet")
    assert sorted(p.name for p in (tmp_path / "ray" / "dataset").iterdir()) == ["dataset_dict.json", "train",
                                                                                 "validation"]


def test_decide_only_same_as_local(cluster, tmp_path, tmp_path_factory, corpus_jsonl, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", limits=["input_tokens<=64"])
    local = _local_clean(tmp_path_factory, str(corpus_jsonl), **kw)
    result = clean_ray(str(corpus_jsonl), out=tmp_path / "ray", num_blocks=6, **kw)
    decide_only = result.decisions.to_dict()["decide_only"]
    assert decide_only["on"] and decide_only["proof"]["input"]
    _same_outputs(local, tmp_path / "ray")


def test_gate_failure_publishes_nothing(cluster, tmp_path, corpus_jsonl, bpe_dir):
    result = clean_ray(str(corpus_jsonl), out=tmp_path / "ray", tokenizer=str(bpe_dir), input="text",
                       limits=["input_tokens<=32"], fail_over="1%")
    assert result.gate_failed and not result.published
    assert list(tmp_path.iterdir()) == []  # neither --out nor a staging folder


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 900, "seed": 3}], ids=["full", "sample"])
def test_one_block_spread_over_actors(cluster, tmp_path, corpus_rows, bpe_dir, how):
    """A Parquet file of one row group: its rows go to several actors in read tasks of row spans."""
    import pyarrow as pa

    from lengthscan.sources.formats import read_tasks
    from lengthscan.sources.opener import open_source

    source = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist(corpus_rows), source)
    assert pq.ParquetFile(source).metadata.num_row_groups == 1
    assert len(read_tasks(open_source(str(source)).splits[0], 3, 256)) == 3
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", **how)
    local = lengthscan.audit(str(source), out=tmp_path / "local", cache=False, **kw)
    distributed = audit_ray(str(source), out=tmp_path / "ray", batch_rows=256, **kw)
    lengths = [pq.read_table(tmp_path / name / "lengths.parquet") for name in ("local", "ray")]
    assert lengths[1].equals(lengths[0])
    assert [s.to_dict() for s in distributed.splits] == [s.to_dict() for s in local.splits]


# -- a worker killed mid-job -----------------------------------------------------------------------

class DiesOnce(TokenCounter):
    """A token counter (a user function Ray ships to its workers) that SIGKILLs the Ray worker process
    running it the first time it counts in ``phase`` ("measure": the measuring pass; "write": the
    verified truncation of the writing pass), once for all workers (an exclusive marker file)."""

    def __init__(self, path, marker: Path, phase: str):
        super().__init__(str(path))
        self.marker, self.phase, self.driver = str(marker), phase, os.getpid()

    def count(self, texts, role):
        if os.getpid() != self.driver and self._in_phase():
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().count(texts, role)

    def _in_phase(self) -> bool:
        files = [Path(f.filename) for f in traceback.extract_stack()]
        stage = ("write", "truncate.py") if self.phase == "write" else ("measure", "batch.py")
        return any(f.parent.name == stage[0] and f.name == stage[1] for f in files)


@pytest.mark.parametrize("phase", ["measure", "write"])
def test_killed_worker_changes_nothing(cluster, tmp_path, tmp_path_factory, parquet_glob, bpe_dir, phase):
    # a percentile limit: two passes, the second (its truncation) on the actors
    kw = dict(input="text", target="summary", action="truncate", limits=["input_tokens<=96", "target_tokens<=p80"])
    local = _local_clean(tmp_path_factory, parquet_glob, tokenizer=str(bpe_dir), **kw)
    marker = tmp_path / "killed"
    result = clean_ray(parquet_glob, out=tmp_path / "ray", num_blocks=9, batch_rows=256,  # blocks in pieces
                       tokenizer=DiesOnce(bpe_dir, marker, phase), **kw)
    assert marker.exists(), "no worker was killed"
    assert result.published
    _same_outputs(local, tmp_path / "ray")
    _only_shards(tmp_path / "ray")


# -- CSV, object storage, the command line ---------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_csv(tmp_path_factory, corpus_rows) -> Path:
    path = tmp_path_factory.mktemp("csv") / "corpus.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ["id", "text", "summary"])
        w.writeheader()
        for i, r in enumerate(corpus_rows):
            w.writerow({"id": i, **r})
    return path


def test_csv_audit_and_clean_same_as_local(cluster, tmp_path, tmp_path_factory, corpus_csv, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary")
    a, b = lengthscan.audit(str(corpus_csv), out=tmp_path / "a-local", full=True, cache=False, **kw), \
        audit_ray(str(corpus_csv), out=tmp_path / "a-ray", full=True, num_blocks=5, cache=False, **kw)
    lengths = [pq.read_table(tmp_path / name / "lengths.parquet") for name in ("a-local", "a-ray")]
    assert lengths[1].equals(lengths[0])
    assert [s.to_dict() for s in b.splits] == [s.to_dict() for s in a.splits]
    limits = ["input_tokens<=128", "target_tokens<=16"]
    local = _local_clean(tmp_path_factory, str(corpus_csv), limits=limits, **kw)
    clean_ray(str(corpus_csv), out=tmp_path / "ray", num_blocks=5, limits=limits, **kw)
    _same_outputs(local, tmp_path / "ray")


@pytest.fixture(scope="module")
def s3_corpus(cluster, tmp_path_factory, parquet_glob, corpus_jsonl, corpus_csv):
    """moto's S3 server on a local port, holding the Parquet shards, the JSONL and the CSV corpus (its
    credentials in the environment since the session's cluster started: ``conftest.AWS_ENV``)."""
    server = pytest.importorskip("moto.server", reason='the s3:// tests need moto: pip install "moto[server]"')
    boto3 = pytest.importorskip("boto3", reason='the s3:// tests need boto3 (a dependency of moto[server])')
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    srv = server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="corpus")
        for path in sorted(Path(parquet_glob).parent.glob("part-*.parquet")):
            client.upload_file(str(path), "corpus", f"shards/{path.name}")
        client.upload_file(str(corpus_jsonl), "corpus", "jsonl/corpus.jsonl")
        client.upload_file(str(corpus_csv), "corpus", "csv/corpus.csv")
        yield {"parquet": ("s3://corpus/shards/part-*.parquet", parquet_glob),
               "jsonl": ("s3://corpus/jsonl/corpus.jsonl", str(corpus_jsonl)),
               "csv": ("s3://corpus/csv/", str(corpus_csv))}
    finally:
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved
        srv.stop()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_s3_clean_same_as_local_files(cluster, tmp_path, tmp_path_factory, s3_corpus, bpe_dir, fmt):
    uri, local_source = s3_corpus[fmt]
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", action="truncate",
              limits=["input_tokens<=96", "target_tokens<=12"])
    local = _local_clean(tmp_path_factory, local_source, **kw)
    result = clean_ray(uri, out=tmp_path / "ray", num_blocks=4, **kw)
    assert result.audit.source == uri
    folder = str(Path(local_source).parent)
    _same_outputs(local, tmp_path / "ray", rename=lambda v: v.replace("s3://corpus/shards", folder) if v else v)


def test_s3_file_rewritten_during_the_run_is_said_to_have_changed(cluster, s3_corpus):
    """Each file's size and modification time when listed, asked again once read (the engine's measuring
    and writing passes call ``check_unchanged`` after their reads, and when a read fails)."""
    import boto3
    import ray

    from lengthscan.engines.ray.pool import release_actors
    from lengthscan.engines.ray.session import EngineError
    from lengthscan.engines.ray.sources import check_unchanged, open_for_ray

    release_actors()  # the session's kept actors hold every CPU the layout's Ray tasks need
    src = open_for_ray(ray, s3_corpus["parquet"][0], None)
    check_unchanged(src.splits[0])  # as listed: nothing to say
    client, key = boto3.client("s3"), "shards/part-1.parquet"
    body = client.get_object(Bucket="corpus", Key=key)["Body"].read()
    client.put_object(Bucket="corpus", Key=key, Body=body[:-1])
    try:
        with pytest.raises(EngineError, match=rf"^s3://corpus/{key}: the file changed during the run \(size "
                                              rf"{len(body):,} -> {len(body) - 1:,}, modified "):
            check_unchanged(src.splits[0])
        client.delete_object(Bucket="corpus", Key=key)
        with pytest.raises(EngineError, match=rf"^s3://corpus/{key}: the file changed during the run \(it is gone"):
            check_unchanged(src.splits[0])
    finally:
        client.put_object(Bucket="corpus", Key=key, Body=body)


def test_s3_missing_object_exits_2(cluster, tmp_path, s3_corpus, bpe_dir, capsys):
    assert main(["audit", "s3://corpus/nothing-here/*.parquet", "--engine", "ray", "--tokenizer", str(bpe_dir),
                 "--input", "text", "--full", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "matches no data file" in capsys.readouterr().err


def test_cli_clean_engine_ray(cluster, tmp_path, corpus_jsonl, bpe_dir, capsys):
    args = [str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
            "--limit", "input_tokens<=128", "--format", "parquet", "--quiet", "--no-cache"]
    assert main(["clean", *args, "--out", str(tmp_path / "local")]) == 0
    assert main(["clean", *args, "--engine", "ray", "--out", str(tmp_path / "ray")]) == 0
    _same_outputs(tmp_path / "local", tmp_path / "ray", fmt="parquet")
    capsys.readouterr()
    hub = ["clean", "someone/some-dataset", "--tokenizer", str(bpe_dir), "--input", "text",
           "--out", str(tmp_path / "h")]
    assert main(hub) == 2  # offline here: the hub id cannot be resolved
    said = capsys.readouterr().err
    assert main([*hub, "--engine", "ray"]) == 2  # a hub id is opened as the local engine opens it
    assert capsys.readouterr().err == said and said.startswith("lengthscan: error: someone/some-dataset: ")


def test_one_cpu_ray_does_not_wait_forever(tmp_path, corpus_jsonl, bpe_dir):
    """A one-CPU Ray (a laptop, a small container): the actor must not hold the CPU the reads need."""
    import subprocess
    import sys

    code = ("import ray, sys; ray.init(address='local', num_cpus=1, log_to_driver=False, include_dashboard=False); "
            "from lengthscan import audit_ray; "
            "r = audit_ray(sys.argv[1], tokenizer=sys.argv[2], input='text', full=True, num_blocks=3); "
            "print(r.splits[0].sample.rows_measured)")
    done = subprocess.run([sys.executable, "-c", code, str(corpus_jsonl), str(bpe_dir)], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == sum(1 for _ in open(corpus_jsonl))


def test_conversations_drop_turns_and_tokenize_same_as_local(cluster, tmp_path, tmp_path_factory, chat_tok_dir,
                                                             docs):
    from tests.support.chat import conversations, trl_template, write_jsonl

    src = write_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl",
                      [{"id": r["id"], "messages": r["messages"]} for r in conversations(docs, 200, seed=9)])
    kw = dict(tokenizer=str(chat_tok_dir), messages="messages", chat_template=str(trl_template("qwen3_training")),
              limits=["sequence_tokens<=300:drop-turns", "completion_tokens>=1"], tokenize=True)
    local = _local_clean(tmp_path_factory, str(src), **kw)
    result = clean_ray(str(src), out=tmp_path / "ray", num_blocks=3, **kw)
    split = result.decisions.to_dict()["splits"][0]
    assert split["truncated"] > 10 and split["dropped"] > 0
    _same_outputs(local, tmp_path / "ray")


def test_conversations_with_images_same_as_local(cluster, tmp_path, tmp_path_factory, train_texts, docs):
    pytest.importorskip("PIL")
    from tests.support.chat import write_jsonl
    from tests.support.vision import image_conversations, template_of, vision_dir, write_pictures

    folder = vision_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl", train_texts[:400])
    pictures = write_pictures(tmp_path_factory.mktemp("pictures"))
    src = write_jsonl(pictures[0].parent / "vlm.jsonl", image_conversations(docs, pictures, 30, seed=4))
    kw = dict(tokenizer=str(folder), messages="messages", images="images", processor=str(folder),
              chat_template=str(template_of("qwen2_vl")), limits=["sequence_tokens<=1500"])
    local = _local_clean(tmp_path_factory, str(src), **kw)
    result = clean_ray(str(src), out=tmp_path / "ray", num_blocks=3, **kw)
    split = result.decisions.to_dict()["splits"][0]
    assert split["dropped"] > 0 and split["kept"] > 0
    _same_outputs(local, tmp_path / "ray")

