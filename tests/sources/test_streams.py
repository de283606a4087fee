"""``sources.streams``: the checked stream every local text reader reads through (lines counted,
UTF-8, no line over the row limit, found as blocks pass, never by reading a line whole), regular
files only (a FIFO refused without blocking), and the codecs by suffix."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import socket
import threading

import pyarrow as pa
import pytest

from lengthscan.sources.source import SourceError
from lengthscan.sources.streams import (
    DEFAULT_MAX_ROW,
    MAX_ROW_ENV,
    CheckedLines,
    LineError,
    NotRegularFile,
    max_row_bytes,
    open_regular,
    open_text,
)


def _drain(stream, block: int) -> CheckedLines:
    while stream.read(block):
        pass
    return stream


def _checked(data: bytes, cap: int | None = None, **kwargs) -> CheckedLines:
    return CheckedLines(io.BytesIO(data), "f.jsonl", line_cap=cap, **kwargs)


@pytest.mark.parametrize("block", [1, 3, 7, 64, 1 << 20])
def test_lines_and_blank_lines_are_counted_whatever_the_blocks(block):
    data = b"\n  \n{\"a\": 1}\r\n\t\n\n{\"a\": 2}\n \x0b\n  {\"a\": 3}"
    stream = _checked(data)
    stream.tally = True
    stream = _drain(stream, block)
    assert stream.line == data.count(b"\n") and stream.total == len(data)
    assert stream.filled_lines == sum(1 for line in data.split(b"\n") if line.strip()) == 3


@pytest.mark.parametrize("block", [1, 2, 5, 4096])
def test_utf8_characters_cut_by_a_block_end_are_text(block):
    data = ("é€😀 line\n" * 50).encode()
    assert _drain(_checked(data), block).line == 50


@pytest.mark.parametrize("block", [1, 4, 1 << 20])
@pytest.mark.parametrize("bad,line,byte", [(b"ok\ncaf\xe9 x\n", 2, 4), (b"\xff\n", 1, 1),
                                           (b"a\nb\nxx\xe2\x82\n", 3, 3), (b"fine\nend \xf0\x9f", 2, 5)])
def test_a_byte_that_is_not_utf8_is_named_by_line_and_byte(block, bad, line, byte):
    with pytest.raises(SourceError) as err:
        _drain(_checked(b"first line\n" * 3 + bad), block)
    assert str(err.value).startswith(f"f.jsonl: line {line + 3} is not UTF-8 text (byte {byte} of the line: ")


@pytest.mark.parametrize("block", [1, 5, 16, 1 << 20])
def test_a_line_over_the_limit_is_named_wherever_it_falls(block):
    cap = 10
    fine = b"0123456789\n" * 4  # lines of exactly the limit
    assert _drain(_checked(fine, cap), block).line == 4
    for data, line in ((fine + b"x" * 11 + b"\n" + fine, 5), (fine + b"x" * 11, 5), (b"x" * 50, 1),
                       (b"\n" + b"y" * 11 + b"\n", 2)):
        with pytest.raises(SourceError, match=f"^f.jsonl: line {line} is longer than 10 bytes"):
            _drain(_checked(data, cap), block)


def test_a_long_line_is_found_before_it_is_read_whole():
    """The stream stops at the block that passes the limit: a reader never sees the line's end."""
    class Endless(io.RawIOBase):
        served = 0

        def readable(self):
            return True

        def read(self, n=-1):
            n = 1 << 16 if n is None or n < 0 else min(n, 1 << 16)
            self.served += n
            return b"z" * n

    inner = Endless()
    with pytest.raises(LineError, match="line 1 is longer than 1 MiB"):
        io.BufferedReader(CheckedLines(inner, line_cap=1 << 20)).readline()
    assert inner.served <= (1 << 20) + (1 << 16)


def test_a_document_is_capped_whole_not_by_line():
    stream = _checked(b"[" + b"1," * 100 + b"1]", total_cap=150)
    with pytest.raises(SourceError, match="holds more than 150 bytes decompressed"):
        _drain(stream, 64)
    assert _drain(_checked(b"x" * 150, total_cap=150), 7).total == 150


def test_the_row_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(MAX_ROW_ENV, raising=False)
    assert max_row_bytes() == DEFAULT_MAX_ROW == 64 << 20
    monkeypatch.setenv(MAX_ROW_ENV, "1_000")
    assert max_row_bytes() == 1000
    for bad in ("0", "-5", "lots", "1e6"):
        monkeypatch.setenv(MAX_ROW_ENV, bad)
        with pytest.raises(SourceError, match=MAX_ROW_ENV):
            max_row_bytes()


def _in_time(work, seconds: float = 20):
    """``work()``'s result or exception, failing (not hanging) when it has not returned in time."""
    box = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as exc:  # handed back
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked: a special file was opened for reading"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_special_files_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")  # nobody writes to it: a plain open would block for ever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()
    cases = {"pipe.jsonl": "a FIFO", "sock.jsonl": "a socket", "dir.jsonl": "a directory"}
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", tmp_path / "zero.jsonl")
        cases["zero.jsonl"] = "a character device"
    try:
        for name, what in cases.items():
            with pytest.raises(NotRegularFile, match=what):
                _in_time(lambda name=name: open_regular(tmp_path / name))
            with pytest.raises(SourceError, match=f"{name}: {what}"):
                _in_time(lambda name=name: open_text(tmp_path / name))
    finally:
        sock.close()


@pytest.mark.parametrize("suffix,compress", [
    ("", lambda b: b), (".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress),
    (".zst", lambda b: pa.compress(b, "zstd", asbytes=True)), (".zstd", lambda b: pa.compress(b, "zstd", asbytes=True)),
])
def test_each_codec_is_read_by_its_suffix(tmp_path, suffix, compress):
    data = "".join(f'{{"text": "row {i} é"}}\n' for i in range(5000)).encode()
    path = tmp_path / f"d.jsonl{suffix}"
    path.write_bytes(compress(data))
    with open_text(path) as fh:
        assert io.BufferedReader(fh).read() == data
        assert fh.line == 5000
    with open_text(path) as fh:  # closed with its file: no descriptor left open
        fh.read(10)
    assert fh.closed


@pytest.mark.skipif(not hasattr(os, "pipe"), reason="no pipes on this platform")
def test_closing_waits_for_a_read_under_way_on_another_thread_and_ends_the_next():
    """pyarrow's JSON and CSV readers read ahead on Arrow's I/O threads, calling into Python. Stopped
    by an error, a reader left such a thread inside a read while the run ended, and the interpreter's
    exit aborted the process ("terminate called without an active exception", exit -6, one run in
    about twenty of a remote zstd bomb). Closing the stream now waits for a read under way on
    another thread, and every read after it returns nothing, which ends a reader's read-ahead."""
    import time

    r, w = os.pipe()
    stream = CheckedLines(open(r, "rb", buffering=0), "pipe.jsonl")
    got = []
    reader = threading.Thread(target=lambda: got.append(stream.read(1 << 20)), daemon=True)
    reader.start()  # as Arrow's read-ahead thread: blocked in a read of a quiet pipe (a server gone quiet)
    time.sleep(0.3)
    threading.Timer(0.5, lambda: os.write(w, b'{"late": 1}\n')).start()  # the read returns in 0.5 s
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started >= 0.4  # closing waited for the read under way
    reader.join(5)
    assert got == [b'{"late": 1}\n']  # which got its bytes from an open stream, not an error
    assert stream.read(10) == b""  # and a read after the close, as the read-ahead's next, finds the end
    os.close(w)
