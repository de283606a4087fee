"""Remote sources on the local engine, against the same audit of the local files: HTTP through
fsspec (the range server counts what it sends), S3 on moto's server through pyarrow, with block
and row samples, full passes, retries, failures and files that change during the run."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from lengthscan import audit
from lengthscan.cli.main import main
from lengthscan.sources.opener import open_source
from lengthscan.sources.scan import iter_batches
from lengthscan.sources.source import SourceError
from tests.support.range_server import RangeServer

KW = dict(input="text", target="summary", cache=False)


def _lengths(out) -> list[dict]:
    """lengths.parquet's rows without the file column (a URL on one side, a path on the other)."""
    table = pq.read_table(out / "lengths.parquet")
    if "source_file" in table.column_names:
        table = table.drop_columns(["source_file"])
    return table.to_pylist()


def _report(out) -> dict:
    return json.loads((out / "report.json").read_text())


def _same_stats(a: dict, b: dict) -> None:
    for sa, sb in zip(a["splits"], b["splits"], strict=True):
        assert sa["fields"] == sb["fields"]
        assert {k: v for k, v in sa["sample"].items()} == {k: v for k, v in sb["sample"].items()}
        assert sa["limits"] == sb["limits"]


def _pair(tmp_path, remote_spec, local_spec, bpe_dir, **kw):
    remote = audit(remote_spec, tokenizer=str(bpe_dir), out=tmp_path / "remote", **KW, **kw)
    local = audit(local_spec, tokenizer=str(bpe_dir), out=tmp_path / "local", **KW, **kw)
    return remote, local


def test_http_block_sample_reads_its_blocks_only_and_equals_the_local_audit(tmp_path, server, corpus_dir, bpe_dir):
    server.reset_counts()
    remote, local = _pair(tmp_path, f"{server.url}/files/parquet/*.parquet", str(corpus_dir / "parquet/*.parquet"),
                          bpe_dir, sample="10%", sample_unit="block", seed=3)
    assert _lengths(tmp_path / "remote") == _lengths(tmp_path / "local")
    rep, loc = _report(tmp_path / "remote"), _report(tmp_path / "local")
    _same_stats(rep, loc)
    source = rep["source"]
    assert source["location"] == "remote" and loc["source"]["location"] == "local"
    assert source["bytes_read"] == server.bytes_served  # every byte the server sent, and nothing else
    total = sum(os.path.getsize(p) for p in (corpus_dir / "parquet").glob("*.parquet"))
    assert source["bytes_total"] == total
    assert source["bytes_read"] < 0.3 * total
    sample = rep["splits"][0]["sample"]
    assert source["sampling"] == {"unit": "block", "seed": 3, "blocks_drawn": sample["blocks_drawn"],
                                  "blocks_total": 26}
    assert sample["unit"] == "block" and sample["blocks_drawn"] >= 2
    # whole row groups: every measured row's group is measured whole
    rows = [r["row"] for r in _lengths(tmp_path / "remote")]
    assert len(rows) == sample["rows_measured"] >= 0.1 * sample["rows_total"]
    design = rep["splits"][0]["fields"]["input_tokens"]["design"]
    assert design["blocks"] == sample["blocks_drawn"]
    if design["blocks"] < 10:  # too few blocks to bound anything: open intervals, said in a finding
        assert design["too_few_blocks"] and all(hi is None for _, hi in
                                                rep["splits"][0]["fields"]["input_tokens"]["intervals"].values())
    else:
        assert 1 <= design["effective_rows"] <= design["rows"]
    assert "url" not in json.dumps(source).lower() or source["spec"].startswith("http")
    assert remote.to_dict()["source"]["bytes_read"] == source["bytes_read"]


def test_http_full_audit_equals_the_local_one(tmp_path, server, corpus_dir, bpe_dir):
    server.reset_counts()
    _pair(tmp_path, f"{server.url}/files/parquet/", str(corpus_dir / "parquet"), bpe_dir, full=True)
    assert _lengths(tmp_path / "remote") == _lengths(tmp_path / "local")
    rep = _report(tmp_path / "remote")
    _same_stats(rep, _report(tmp_path / "local"))
    assert rep["source"]["bytes_read"] == server.bytes_served
    assert rep["source"]["bytes_read"] <= rep["source"]["bytes_total"]  # each byte once: no read-ahead, no re-read


@pytest.mark.slow
def test_remote_parquet_samples_by_block_by_default_and_by_row_when_asked(tmp_path, server, corpus_dir, bpe_dir):
    url = f"{server.url}/files/parquet/*.parquet"
    by_default = audit(url, tokenizer=str(bpe_dir), sample=300, **KW)
    assert by_default.splits[0].sample.unit == "block"
    assert "default for remote Parquet" in by_default.splits[0].sample.reason
    server.reset_counts()
    rows = audit(url, tokenizer=str(bpe_dir), sample=300, sample_unit="row", out=tmp_path / "rows", **KW)
    local = audit(str(corpus_dir / "parquet/*.parquet"), tokenizer=str(bpe_dir), sample=300, out=tmp_path / "local",
                  **KW)
    assert rows.splits[0].sample.unit == "row" == local.splits[0].sample.unit
    assert _lengths(tmp_path / "rows") == _lengths(tmp_path / "local")
    # 300 rows of 2,600 touch most row groups of 100 rows: a row sample reads most of the bytes
    read = _report(tmp_path / "rows")["source"]
    assert read["bytes_read"] > 0.6 * read["bytes_total"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt,name", [("jsonl", "jsonl/corpus.jsonl"), ("csv", "csv/corpus.csv")])
def test_http_jsonl_and_csv_equal_the_local_files(tmp_path, server, corpus_dir, bpe_dir, fmt, name):
    _pair(tmp_path, f"{server.url}/files/{name}", str(corpus_dir / name), bpe_dir, full=True)
    assert _lengths(tmp_path / "remote") == _lengths(tmp_path / "local")
    _same_stats(_report(tmp_path / "remote"), _report(tmp_path / "local"))
    block = audit(f"{server.url}/files/{name}", tokenizer=str(bpe_dir), sample=200, sample_unit="block", **KW)
    assert block.splits[0].sample.unit == "row"  # no row groups: rows sampled while streaming, and said
    assert "no row groups" in block.splits[0].sample.reason


def test_failed_requests_are_retried_and_counted(tmp_path, server, corpus_dir, bpe_dir):
    server.fail_next(2)
    try:
        audit(f"{server.url}/files/parquet/part-0.parquet", tokenizer=str(bpe_dir), full=True, out=tmp_path / "o",
              **KW)
    finally:
        server.clear_faults()
    assert _report(tmp_path / "o")["source"]["retries"] == 2


@pytest.mark.slow
def test_a_request_that_keeps_failing_exits_2_naming_the_file_and_range(tmp_path, server, bpe_dir, capsys,
                                                                         monkeypatch):
    from lengthscan.sources.remote import network

    server.fail_path("part-2.parquet", status=503)
    monkeypatch.setattr(network, "BACKOFF", 0.01)  # the retries themselves, without their waits
    try:
        code = main(["audit", f"{server.url}/files/parquet/*.parquet", "--tokenizer", str(bpe_dir), "--input", "text",
                     "--full", "--no-cache", "--out", str(tmp_path / "out"), "--quiet"])
    finally:
        server.clear_faults()
    err = capsys.readouterr().err
    assert code == 2
    assert "part-2.parquet: bytes " in err and "failed 5 times" in err and "503" in err
    assert not (tmp_path / "out").exists()


def test_a_file_rewritten_during_the_run_is_refused(tmp_path, corpus_dir):
    import shutil

    from tests.support.range_server import RangeServer

    folder = tmp_path / "served"
    shutil.copytree(corpus_dir / "parquet", folder)
    with RangeServer(folder) as srv:
        src = open_source(f"{srv.url}/files/*.parquet")
        data = (folder / "part-1.parquet").read_bytes()
        (folder / "part-1.parquet").write_bytes(data)  # same bytes, a new file: another ETag
        with pytest.raises(SourceError, match="part-1.parquet: the file changed during the run"):
            for _ in iter_batches(src.splits[0], ["text"]):
                pass


def test_a_missing_remote_file_or_empty_glob_is_a_source_error(server):
    with pytest.raises(SourceError, match="matches no data file"):
        open_source(f"{server.url}/files/parquet/*.arrow")
    with pytest.raises(SourceError, match="none.parquet: cannot be read"):
        open_source(f"{server.url}/files/parquet/none.parquet")
    with pytest.raises(SourceError, match="cannot be read .*(Connect|connect)"):
        open_source("http://127.0.0.1:9/x.parquet")  # nothing listens on port 9


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3(corpus_dir):
    """moto's S3 server on 127.0.0.1 holding the corpus; its endpoint and credentials in the environment."""
    server = pytest.importorskip("moto.server", reason='the s3:// tests need moto: pip install "moto[server]"')
    boto3 = pytest.importorskip("boto3")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="corpus")
        for path in sorted(corpus_dir.rglob("*.*")):
            client.upload_file(str(path), "corpus", path.relative_to(corpus_dir).as_posix())
        yield "s3://corpus"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()


@pytest.mark.slow
def test_s3_block_sample_and_jsonl_equal_the_local_audit(tmp_path, s3, corpus_dir, bpe_dir):
    _pair(tmp_path, f"{s3}/parquet/*.parquet", str(corpus_dir / "parquet/*.parquet"), bpe_dir, sample="10%",
          sample_unit="block", seed=9)
    assert _lengths(tmp_path / "remote") == _lengths(tmp_path / "local")
    report = _report(tmp_path / "remote")
    _same_stats(report, _report(tmp_path / "local"))
    assert 0 < report["source"]["bytes_read"] < 0.3 * report["source"]["bytes_total"]
    assert "testing" not in json.dumps(report)  # credentials are never written
    jsonl = audit(f"{s3}/jsonl/corpus.jsonl", tokenizer=str(bpe_dir), full=True, out=tmp_path / "jsonl", **KW)
    local = audit(str(corpus_dir / "jsonl/corpus.jsonl"), tokenizer=str(bpe_dir), full=True, out=tmp_path / "j2", **KW)
    assert jsonl.splits[0].fields == local.splits[0].fields
    assert _lengths(tmp_path / "jsonl") == _lengths(tmp_path / "j2")


@pytest.mark.slow
def test_clean_of_a_remote_source_writes_what_the_local_clean_writes(tmp_path, server, corpus_dir, bpe_dir):
    from datasets import load_from_disk

    from lengthscan import clean

    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", limits=["input_tokens<=64:truncate"],
              cache=False)
    server.reset_counts()
    remote = clean(f"{server.url}/files/parquet/*.parquet", out=tmp_path / "remote", **kw)
    clean(str(corpus_dir / "parquet/*.parquet"), out=tmp_path / "local", **kw)
    assert load_from_disk(str(tmp_path / "remote" / "dataset")).to_dict() == \
        load_from_disk(str(tmp_path / "local" / "dataset")).to_dict()
    assert remote.audit.to_dict()["source"]["bytes_read"] == server.bytes_served


@pytest.mark.slow  # megabytes of rows tokenized, and zstd bombs decompressed
def test_remote_json_lines_longer_than_a_reader_block_are_read_up_to_the_row_limit(tmp_path, bpe_dir, docs,
                                                                                    monkeypatch, capsys):
    """Rows of megabytes (a long document) were refused remotely with pyarrow's "straddling object
    straddles two block boundaries" (its 1 MiB block), although the row limit is 64 MiB: they are
    read with blocks that fit the longest line; a row over the limit is named by URL and line."""
    import zstandard

    folder = tmp_path / "served"
    folder.mkdir()
    long_text = "word " * 600_000  # a row of 3 MB, within no 1 MiB block
    rows = [{"text": docs[0], "summary": "a"}, {"text": long_text, "summary": "b"}, {"text": docs[1], "summary": "c"}]
    (folder / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = zstandard.ZstdCompressor().compressobj()
    (folder / "bomb.jsonl.zst").write_bytes(c.compress(b'{"text": "' + b"a" * (80 << 20) + b'"}\n') + c.flush())
    with RangeServer(folder) as srv:
        remote = audit(srv.file_url("long.jsonl"), tokenizer=str(bpe_dir), out=tmp_path / "remote", full=True, **KW)
        local = audit(str(folder / "long.jsonl"), tokenizer=str(bpe_dir), out=tmp_path / "local", full=True, **KW)
        assert remote is not None and local is not None
        assert len(_lengths(tmp_path / "remote")) == 3
        assert _lengths(tmp_path / "remote") == _lengths(tmp_path / "local")
        assert _lengths(tmp_path / "remote")[1]["input_tokens"] > 100_000
        url = srv.file_url("bomb.jsonl.zst")
        assert main(["audit", url, "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
                     "--out", str(tmp_path / "bomb"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"lengthscan: error: {url}: line 1 is longer than 64 MiB (67,108,864 bytes), the longest row "
                   "lengthscan reads (read no further); shorten or split that row, or raise the limit with "
                   "LENGTHSCAN_MAX_ROW_BYTES=BYTES if it is real\n")
