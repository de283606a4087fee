"""Servers that cannot be trusted, on the range server of tests/support: an answer with other bytes than
those asked, a server that stalls, a file rewritten under a server that ignores ``If-Match``, and URLs
holding credentials or a signed query string, which no output or message may repeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.sources.opener import open_source
from lengthscan.sources.source import SourceError
from tests.support.range_server import RangeServer

pytestmark = pytest.mark.slow  # servers that trickle, lie or leak: deadlines of seconds; the full run

GROUP_ROWS = 1024


@pytest.fixture
def even(tmp_path):
    """A Parquet file of three row groups of the same byte size (fixed-width texts of different token
    counts, no compression, dictionary or statistics) and the byte offset of each group."""
    folder = tmp_path / "served"
    folder.mkdir()
    texts = [("ab " * (1 + (i * 7919) % 90)).ljust(300, "x") for i in range(3 * GROUP_ROWS)]
    pq.write_table(pa.table({"text": texts}), folder / "even.parquet", row_group_size=GROUP_ROWS,
                   compression="none", use_dictionary=False, write_statistics=False)
    meta = pq.read_metadata(folder / "even.parquet")
    offsets = [meta.row_group(g).column(0).data_page_offset for g in range(3)]
    sizes = {meta.row_group(g).column(0).total_compressed_size for g in range(3)}
    assert len(sizes) == 1  # another group's bytes read as this one's would parse
    with RangeServer(folder) as srv:
        yield srv, offsets


def _run(command: str, url: str, out: Path, bpe_dir, *extra: str) -> int:
    rule = ["--full"] if command == "audit" else ["--limit", "input_tokens<=60"]
    return main([command, url, "--tokenizer", str(bpe_dir), "--input", "text", *rule, "--out", str(out), "--quiet",
                 *extra])


@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_range_answered_with_other_bytes_exits_2_and_writes_nothing(even, tmp_path, bpe_dir, capsys, command):
    srv, offsets = even
    url = srv.file_url("even.parquet")
    assert _run(command, url, tmp_path / "good", bpe_dir, "--no-cache") == 0  # the same run, served right
    capsys.readouterr()

    srv.misbehave("even.parquet", moved={offsets[2]: offsets[1]})  # the third group asked, the second sent
    assert _run(command, url, tmp_path / "moved", bpe_dir, "--no-cache") == 2
    err = capsys.readouterr().err
    assert f"{url}: bytes {offsets[2]}-" in err
    assert f"sent bytes {offsets[1]}-" in err and "Content-Range" in err
    assert not (tmp_path / "moved").exists()  # no report, no dataset/, no rejects/

    size = srv.root.joinpath("even.parquet").stat().st_size
    # 200 with as many bytes as asked from the file's start; 200 with the whole file (no Range support)
    for how, sent in (("whole", "8 bytes"), ("no_ranges", f"{size:,} bytes")):  # 8: the footer's length, asked first
        srv.misbehave("even.parquet", **{how: True})
        assert _run(command, url, tmp_path / how, bpe_dir, "--no-cache") == 2
        err = capsys.readouterr().err
        assert f"{url}: bytes " in err and f"answered 200 with {sent}" in err and "does not serve byte ranges" in err
        assert not (tmp_path / how).exists()


@pytest.mark.slow
@pytest.mark.parametrize("stalled", ["GET", "GET HEAD"])
def test_a_stalling_server_exits_2_naming_the_url_within_the_timeout(even, tmp_path, bpe_dir, stalled):
    srv, _ = even
    srv.misbehave("even.parquet", stall=stalled)  # accepted, never answered (HEAD too: while listing)
    url = srv.file_url("even.parquet")
    env = {**os.environ, "LENGTHSCAN_HTTP_TIMEOUT": "0.3", "PYTHONPATH": os.getcwd()}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", url, "--tokenizer", str(bpe_dir), "--input",
                           "text", "--full", "--no-cache", "--out", str(tmp_path / "out"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert f"lengthscan: error: {url}: " in proc.stderr
    assert "no answer within 0.3 s" in proc.stderr and "LENGTHSCAN_HTTP_TIMEOUT" in proc.stderr
    assert "failed 3 times" in proc.stderr  # retried before giving up
    # 3 attempts of 0.3 s and 0.75 s of backoff between them, plus the start of the interpreter
    assert took < 45
    asked = [r for r in srv.requests if r.method == stalled.split()[-1]]
    assert len(asked) == 3


@pytest.mark.slow
@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_server_that_trickles_exits_2_naming_the_url_within_its_deadline(tmp_path, bpe_dir, command):
    """A server that sends a few bytes every tenth of a second is never silent for a read timeout:
    without a deadline for the whole answer, the run would wait for days."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "slow.jsonl").write_text("".join(json.dumps({"text": f"row {i} " * 20}) + "\n" for i in range(5000)))
    with RangeServer(folder) as srv:
        srv.misbehave("slow.jsonl", drip=0.1)
        url = srv.file_url("slow.jsonl")
        env = {**os.environ, "LENGTHSCAN_HTTP_TIMEOUT": "0.5", "PYTHONPATH": os.getcwd()}
        rule = ["--full"] if command == "audit" else ["--limit", "input_tokens<=60"]
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "lengthscan", command, url, "--tokenizer", str(bpe_dir),
                               "--input", "text", *rule, "--no-cache", "--out", str(tmp_path / "out"), "--quiet"],
                              env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"lengthscan: error: {url}: bytes 0-" in proc.stderr and "failed 3 times" in proc.stderr
    assert "the answer came slower than 1 MiB per 0.5 s" in proc.stderr
    # 3 attempts of at most 0.5 + 0.5 * (1 + size / 1 MiB) s, 0.75 s of backoff, the interpreter's start
    assert took < 60
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("head_status", [403, 405])
def test_a_file_the_server_refuses_to_head_is_listed_by_a_one_byte_get(even, tmp_path, bpe_dir, head_status):
    """S3 answers 403 to a HEAD of a URL signed for GET; some servers have no HEAD (405)."""
    srv, _ = even
    url = srv.file_url("even.parquet")
    assert _run("audit", url, tmp_path / "plain", bpe_dir, "--no-cache") == 0
    srv.misbehave("even.parquet", head_status=head_status)
    srv.reset_counts()
    assert _run("audit", url, tmp_path / "no-head", bpe_dir, "--no-cache") == 0
    first = [(r.method, r.range, r.status) for r in srv.requests][:2]
    assert first == [("HEAD", None, head_status), ("GET", "bytes=0-0", 206)]
    assert pq.read_table(tmp_path / "no-head" / "lengths.parquet") == pq.read_table(tmp_path / "plain" /
                                                                                     "lengths.parquet")


def test_a_weak_etag_is_not_sent_in_if_match_and_still_tells_a_rewrite(tmp_path, bpe_dir, capsys):
    """``If-Match`` compares strongly: with a weak ETag it would refuse every read (412)."""
    folder = tmp_path / "served"
    folder.mkdir()
    name, new = _swapped(folder, "parquet")
    with RangeServer(folder) as srv:
        srv.misbehave(name, weak_etag=True)
        assert _run("audit", srv.file_url(name), tmp_path / "out", bpe_dir, "--no-cache") == 0
        assert {r.status for r in srv.requests} == {200, 206}
        srv.misbehave(name, weak_etag=True, swap_after=2, swap_to=new)
        assert _run("audit", srv.file_url(name), tmp_path / "swapped", bpe_dir, "--no-cache") == 2
    assert "the file changed during the run (its ETag is now W/" in capsys.readouterr().err


def test_a_bad_timeout_setting_is_a_usage_error(even, tmp_path, bpe_dir, capsys, monkeypatch):
    srv, _ = even
    monkeypatch.setenv("LENGTHSCAN_HTTP_TIMEOUT", "soon")
    assert _run("audit", srv.file_url("even.parquet"), tmp_path / "out", bpe_dir, "--no-cache") == 2
    assert "LENGTHSCAN_HTTP_TIMEOUT='soon'" in capsys.readouterr().err


def _swapped(folder: Path, fmt: str) -> tuple[str, bytes]:
    """A file of ``fmt`` written in ``folder`` and the bytes that replace it during the run."""
    rows = [{"text": "hello world " * (i % 50 + 1)} for i in range(3000)]
    other = [{"text": "ab " * (i % 70 + 1)} for i in range(2500)]
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), folder / "data.parquet", row_group_size=1000)
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(other), sink, row_group_size=1000)
        return "data.parquet", sink.getvalue().to_pybytes()
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return "data.jsonl", "".join(json.dumps(r) + "\n" for r in other).encode()


@pytest.mark.parametrize("fmt,after", [("parquet", 2), ("jsonl", 1)])
@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_file_rewritten_under_a_server_that_ignores_if_match_is_said_to_have_changed(tmp_path, bpe_dir, capsys,
                                                                                      fmt, after, command):
    folder = tmp_path / "served"
    folder.mkdir()
    name, new = _swapped(folder, fmt)
    with RangeServer(folder) as srv:
        # Parquet: the footer read (its length, then itself), then the file replaced; JSON Lines: replaced
        # once counted, before its rows are read
        srv.misbehave(name, ignore_if_match=True, swap_after=after, swap_to=new)
        code = _run(command, srv.file_url(name), tmp_path / "out", bpe_dir, "--no-cache")
        stale = [r for r in srv.requests if r.method == "GET" and r.status == 206]
    err = capsys.readouterr().err
    assert code == 2
    assert f"{srv.file_url(name)}: the file changed during the run (its ETag is now" in err
    assert len(stale) > after  # the server did answer the stale If-Match: lengthscan saw the change itself
    assert not (tmp_path / "out").exists()


def test_a_rewrite_of_the_same_size_under_a_server_without_validators_is_found_after_the_read(tmp_path, bpe_dir,
                                                                                            capsys):
    """Ranged answers with no ETag nor Last-Modified and a new file of the same size: the footer read, the row
    groups are garbage to the Parquet reader; the file asked again is another one, and said so."""
    folder = tmp_path / "served"
    folder.mkdir()
    name, _ = _swapped(folder, "parquet")
    data = (folder / name).read_bytes()
    with RangeServer(folder) as srv:
        srv.misbehave(name, ignore_if_match=True, bare=True, swap_after=2, swap_to=data[::-1])
        code = _run("audit", srv.file_url(name), tmp_path / "out", bpe_dir, "--no-cache")
    err = capsys.readouterr().err
    assert code == 2
    assert f"{srv.file_url(name)}: the file changed during the run (size {len(data):,} -> {len(data):,}" in err
    assert "thrift" not in err.lower() and "unreadable" not in err


SECRETS = ("alice7q", "s3cr3tPW", "SIGdeadbeef", "AKIDEXAMPLE", "X-Amz-Signature")


def _with_secrets(srv: RangeServer, path: str, query: bool = True) -> str:
    url = f"{srv.url}/files/{path}".replace("http://", "http://alice7q:s3cr3tPW@")
    return url + ("?X-Amz-Credential=AKIDEXAMPLE&X-Amz-Signature=SIGdeadbeef" if query else "")


def _texts_under(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` as text: Parquet files as their rows (a compressed page would hide a string
    from a byte search), the others as their bytes."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            out[str(path)] = json.dumps(pq.read_table(path).to_pylist(), default=str)
        else:
            out[str(path)] = path.read_bytes().decode("latin-1")
    return out


def _no_secret(texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {where}"


@pytest.mark.slow
def test_credentials_and_signed_queries_are_never_written_nor_said(tmp_path, corpus_dir, bpe_dir, capsys):
    """audit and clean of one signed file and of a glob with credentials (so that lengths.parquet and the
    rejects have a ``source_file`` column); then every output, the cache, the terminal and the errors."""
    cache = Path(os.environ["LENGTHSCAN_CACHE"])
    with RangeServer(corpus_dir) as srv:
        signed = _with_secrets(srv, "parquet/part-1.parquet")
        glob = _with_secrets(srv, "parquet/*.parquet", query=False)
        jsonl = _with_secrets(srv, "jsonl/corpus.jsonl")
        runs = [("audit", signed, []), ("audit", glob, ["--full"]), ("audit", jsonl, ["--full"]),
                ("clean", glob, ["--limit", "input_tokens<=64", "--limit", "target_tokens<=16:truncate"]),
                ("clean", signed, ["--limit", "input_tokens<=64"])]
        for k, (command, url, rule) in enumerate(runs):
            assert main([command, url, "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary", *rule,
                         "--out", str(tmp_path / f"out{k}")]) == 0
        said = capsys.readouterr()
        failures = []
        for url in (_with_secrets(srv, "parquet/none.parquet"), _with_secrets(srv, "parquet/*.arrow", query=False),
                    _with_secrets(srv, "parquet/part-0.parquet")):
            if "part-0" in url:
                srv.misbehave("part-0.parquet", whole=True)
            code = main(["audit", url, "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                         str(tmp_path / "failed"), "--no-cache"])
            failures.append((code, capsys.readouterr().err))
            with pytest.raises(SourceError) as raised:
                open_source(url).splits[0].blocks(["text"])
            failures.append((2, str(raised.value)))
        srv.clear_faults()
    texts = _texts_under(tmp_path) | _texts_under(cache)
    texts |= {"stdout": said.out, "stderr": said.err} | {f"failure {i}": m for i, (_, m) in enumerate(failures)}
    _no_secret(texts)
    assert [code for code, _ in failures] == [2] * 6
    assert "cannot be read (404" in failures[0][1] and "matches no data file" in failures[2][1]
    assert "does not serve byte ranges" in failures[4][1]
    shown = srv.file_url("parquet/part-1.parquet").replace("http://", "http://***@")
    assert all(shown.rsplit("/", 1)[0] in m for _, m in failures)  # the URL is named, as shown
    report = json.loads((tmp_path / "out0" / "report.json").read_text())
    assert json.dumps(report).count(shown) >= 1
    assert shown in (tmp_path / "out0" / "report.html").read_text()
    files = set(pq.read_table(tmp_path / "out1" / "lengths.parquet").column("source_file").to_pylist())
    assert files == {f"{shown.rsplit('/', 1)[0]}/part-{i}.parquet" for i in range(3)}
    rejects = [p for p in (tmp_path / "out3" / "rejects").rglob("*.arrow")]
    assert rejects and "***@" in _texts_under(tmp_path / "out3" / "rejects")[str(rejects[0])]
