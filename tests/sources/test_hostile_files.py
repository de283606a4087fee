"""Hostile local data files through the CLI, as the held-out sweeps give them: a line that is not
UTF-8 (named by file and line, plain or compressed), zstd and xz files read like their plain
twins, decompression bombs and huge rows stopped at the row limit in bounded memory, JSON errors
said as a column of their line, special files wherever a path is read (never blocking), truncated
and empty compressed files, byte order marks, CRLF, and globs round loops of links."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.audio_files import write_audio
from tests.support.cli import one_line

pytestmark = pytest.mark.slow  # hostile inputs (FIFOs, bombs, codecs): the full run

ZSTD = lambda data: pa.compress(data, "zstd", asbytes=True)  # noqa: E731 - pyarrow's codec, as lengthscan reads it
CODECS = {"": lambda data: data, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress, ".zst": ZSTD,
          ".zstd": ZSTD}


def _lines(n: int, text: str = "row {i} says hello to the tokenizer") -> bytes:
    return "".join(json.dumps({"text": text.format(i=i)}) + "\n" for i in range(n)).encode()


def _audit(src, bpe_dir, out, *extra):
    return main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--out", str(out),
                 "--quiet", *map(str, extra)])


def _tokens(out) -> list:
    return pq.read_table(out / "lengths.parquet").column("input_tokens").to_pylist()


#: The CLI in a child process that writes its own peak resident memory (KiB) to the file given first:
#: VmHWM, its address space's own (ru_maxrss keeps the forking parent's peak across exec on Linux).
_MEASURED = ("import sys\nfrom lengthscan.cli.main import main\ncode = main(sys.argv[2:])\n"
             "peak = next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
             "open(sys.argv[1], 'w').write(peak)\nsys.exit(code)")
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak memory read from /proc")


def _measured(tmp_path, *args, env=None, timeout=300):
    """(process, peak resident MiB) of the CLI run in a child process (a hang fails, never blocks)."""
    peak = tmp_path / "peak.txt"
    proc = subprocess.run([sys.executable, "-c", _MEASURED, str(peak), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return proc, int(peak.read_text()) / 1024


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


# -- a line that is not UTF-8: named by its file and line ---------------------------------------------

@pytest.mark.parametrize("suffix", list(CODECS))
def test_a_line_that_is_not_utf8_names_its_file_and_line(tmp_path, bpe_dir, capsys, suffix):
    src = tmp_path / f"data.jsonl{suffix}"
    src.write_bytes(CODECS[suffix](_lines(1000) + b'{"text": "caf\xe9"}\n' + _lines(5)))
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 1001 is not UTF-8 text (byte 14 of the line: b'\\xe9'); re-encode")


def test_a_bad_line_in_one_file_of_many_names_that_file(tmp_path, bpe_dir, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_bytes(_lines(50))
    (tmp_path / "d" / "b.jsonl.gz").write_bytes(gzip.compress(_lines(3) + b'{"text": "\xff"}\n'))
    (tmp_path / "d" / "c.csv").write_bytes(b"text\nfine\n")
    assert _audit(tmp_path / "d" / "*.jsonl*", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{tmp_path / 'd' / 'b.jsonl.gz'}: line 4 is not UTF-8 text")


# -- zstd and xz: read as their plain twins ------------------------------------------------------------

def _twins(tmp_path, name: str, data: bytes, suffix: str):
    plain, packed = tmp_path / name, tmp_path / f"z-{name}{suffix}"
    plain.write_bytes(data)
    packed.write_bytes(CODECS[suffix](data))
    return plain, packed


_MIXED = b"".join(json.dumps({"text": f"row {i} of mixed types", "x": i if i % 2 else f"s{i}"}).encode() + b"\n"
                  for i in range(300))
_CSV = ("text,n\n" + "".join(f'"row {i}, quoted",{i:05d}\n' for i in range(300))).encode()
_TSV = ("text\tn\n" + "".join(f"row {i}\t{i}\n" for i in range(300))).encode()


@pytest.mark.parametrize("suffix", [".zst", pytest.param(".zstd", marks=pytest.mark.slow),
                                    pytest.param(".xz", marks=pytest.mark.slow)])  # one codec in the fast loop
@pytest.mark.parametrize("name,data", [("d.jsonl", _lines(300)), ("d.json", json.dumps(
    [{"text": f"row {i} in an array"} for i in range(300)]).encode()), ("mixed.jsonl", _MIXED), ("d.csv", _CSV),
    ("d.tsv", _TSV)], ids=["jsonl", "json-array", "jsonl-datasets", "csv", "tsv"])
def test_zstd_and_xz_files_measure_as_their_plain_twins(tmp_path, bpe_dir, suffix, name, data):
    plain, packed = _twins(tmp_path, name, data, suffix)
    assert _audit(plain, bpe_dir, tmp_path / "p") == 0
    assert _audit(packed, bpe_dir, tmp_path / "z") == 0
    assert _tokens(tmp_path / "z") == _tokens(tmp_path / "p") and len(_tokens(tmp_path / "p")) == 300


def test_clean_of_a_zstd_file_writes_the_rows_of_its_plain_twin(tmp_path, bpe_dir):
    from datasets import load_from_disk

    data = b"".join(json.dumps({"text": "word " * (i % 12)}).encode() + b"\n" for i in range(400))
    plain, packed = _twins(tmp_path, "d.jsonl", data, ".zst")
    for src, out in ((plain, tmp_path / "p"), (packed, tmp_path / "z")):
        assert main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", "input_tokens<=8",
                     "--out", str(out), "--quiet"]) == 0
    for part in ("dataset", "rejects"):
        written = load_from_disk(str(tmp_path / "z" / part)).to_list()
        assert written == load_from_disk(str(tmp_path / "p" / part)).to_list() and written


def test_an_arrow_file_is_no_text_to_check(tmp_path, bpe_dir, monkeypatch):
    """Arrow files are binary: neither UTF-8 nor the row limit applies to their bytes (a limit below
    the file's size, and bytes that are not UTF-8, as an Arrow stream always holds)."""
    monkeypatch.setenv("LENGTHSCAN_MAX_ROW_BYTES", str(64 << 10))
    table = pa.table({"text": [f"row {i} caf\u00e9 " + "word " * (i % 50) for i in range(3000)]})
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
        writer.write_table(table)
    assert (tmp_path / "d.arrow").stat().st_size > 64 << 10
    pq.write_table(table, tmp_path / "d.parquet")
    assert _audit(tmp_path / "d.arrow", bpe_dir, tmp_path / "a") == 0
    assert _audit(tmp_path / "d.parquet", bpe_dir, tmp_path / "p") == 0
    assert _tokens(tmp_path / "a") == _tokens(tmp_path / "p") and len(_tokens(tmp_path / "a")) == 3000


# -- the row limit: bombs and huge rows stop there, in bounded memory -----------------------------------

def _one_line_file(path, codec: str, chars: int, head: bytes = b"") -> None:
    """A compressed file of ``head`` then one JSON line of ``chars`` characters, written in chunks."""
    with pa.output_stream(str(path), compression=codec) as out:
        out.write(head + b'{"text": "')
        chunk = b"a" * (1 << 22)
        for _ in range(chars >> 22):
            out.write(chunk)
        out.write(b'"}\n')


@linux_only
@pytest.mark.parametrize("codec,suffix", [("gzip", ".gz"), ("zstd", ".zst")])
def test_a_line_over_the_row_limit_exits_2_without_reading_it_whole(tmp_path, bpe_dir, codec, suffix):
    src = tmp_path / f"bomb.jsonl{suffix}"
    _one_line_file(src, codec, 48 << 20, head=_lines(3))
    proc, peak = _measured(tmp_path, "audit", src, "--tokenizer", bpe_dir, "--input", "text", "--out",
                           tmp_path / "o", "--quiet", env={"LENGTHSCAN_MAX_ROW_BYTES": str(1 << 20)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{src}: line 4 is longer than 1 MiB (1,048,576 bytes)" in proc.stderr
    assert "LENGTHSCAN_MAX_ROW_BYTES" in proc.stderr
    assert peak < 600, f"peak memory {peak:.0f} MiB"
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("kind", ["gz-line", "zst-zeros"])
def test_decompression_bombs_stop_at_the_default_limit_in_bounded_memory(tmp_path, bpe_dir, kind):
    """A 1 MB .jsonl.gz of one 1.2 G-character line took 9 GB and minutes (exit 3 where memory was
    short); gigabytes of zero bytes in a .jsonl.zst took 6.7 GB. Both stop at 64 MiB now."""
    if kind == "gz-line":
        src = tmp_path / "line.jsonl.gz"
        _one_line_file(src, "gzip", 1200 << 20)
        line = 1
    else:
        src = tmp_path / "zeros.jsonl.zst"
        with pa.output_stream(str(src), compression="zstd") as out:
            out.write(_lines(2))
            for _ in range(200):
                out.write(bytes(1 << 24))
        line = 3
    assert src.stat().st_size < 2 << 20
    started = time.monotonic()
    proc, peak = _measured(tmp_path, "audit", src, "--tokenizer", bpe_dir, "--input", "text", "--out",
                           tmp_path / "o", "--quiet", env={"LENGTHSCAN_MAX_ROW_BYTES": ""})
    assert proc.returncode == 2, proc.stderr
    assert f"{src}: line {line} is longer than 64 MiB (67,108,864 bytes)" in proc.stderr
    assert peak < 700 and time.monotonic() - started < 120, (peak, proc.stderr)


def test_csv_rows_over_the_limit_are_refused_on_one_line_or_many(tmp_path, bpe_dir, capsys, monkeypatch):
    monkeypatch.setenv("LENGTHSCAN_MAX_ROW_BYTES", str(1 << 20))
    (tmp_path / "long.csv").write_bytes(b"text,n\nhello,1\n" + b"x" * (2 << 20) + b",2\nbye,3\n")
    assert _audit(tmp_path / "long.csv", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{tmp_path / 'long.csv'}: line 3 is longer than 1 MiB")
    (tmp_path / "many.csv.gz").write_bytes(gzip.compress(b'text,n\nhello,1\n"' + b"y" * 99 + b"\n" * 1
                                                         + (b"y" * 99 + b"\n") * 30000 + b'",2\nbye,3\n'))
    assert _audit(tmp_path / "many.csv.gz", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{tmp_path / 'many.csv.gz'}: holds a row longer than 1,048,576 bytes", "after 1 rows that fit")
    (tmp_path / "fits.csv").write_bytes(b'text,n\n"' + (b"z" * 99 + b"\n") * 9000 + b'",1\n' + b"w,2\n" * 10000)
    assert _audit(tmp_path / "fits.csv", bpe_dir, tmp_path / "o") == 0  # a quoted row under the limit is read


def test_a_json_document_read_whole_is_capped_whole(tmp_path, bpe_dir, capsys, monkeypatch):
    monkeypatch.setenv("LENGTHSCAN_MAX_ROW_BYTES", str(64 << 10))
    doc = json.dumps([{"text": "word " * 40} for _ in range(6000)]).encode()  # one line, 1.3 MB
    (tmp_path / "d.json.gz").write_bytes(gzip.compress(doc))
    assert _audit(tmp_path / "d.json.gz", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{tmp_path / 'd.json.gz'}: holds more than 1 MiB (1,048,576 bytes) decompressed",
             "give it as JSON Lines")
    monkeypatch.setenv("LENGTHSCAN_MAX_ROW_BYTES", str(1 << 20))
    assert _audit(tmp_path / "d.json.gz", bpe_dir, tmp_path / "o") == 0


# -- JSON errors: a column of the line, not the json module's positions ---------------------------------

@pytest.mark.parametrize("bad,said", [
    ('{"text": "a"} {"text": "b"}', "Extra data at column 15"),
    ('{"text": "a"}{"text": "b"}', "Extra data at column 14"),
    ('{"text": broken}', "Expecting value at column 10"),
    ('{"text": "a",', "Expecting property name enclosed in double quotes at the end of the line"),
])
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_json_error_reads_as_a_column_of_its_line(tmp_path, bpe_dir, capsys, bad, said, ending):
    src = tmp_path / "data.jsonl"
    src.write_bytes(_lines(100).replace(b"\n", ending.encode()) + (bad + ending).encode() + _lines(3))
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    err = one_line(capsys, f"{src}: line 101 is not valid JSON: {said}; fix or remove that line")
    assert "char" not in err and "line 2" not in err


def test_lines_ended_by_a_carriage_return_alone_are_said_so(tmp_path, bpe_dir, capsys):
    src = tmp_path / "mac.jsonl"
    src.write_bytes(_lines(20).replace(b"\n", b"\r"))
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 1 is not valid JSON: Extra data at column 47: its lines end with a carriage "
                     "return alone (\\r); end them with line feeds")


# -- special files wherever a path is read ----------------------------------------------------------------

fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@fifo_only
@pytest.mark.parametrize("which", ["state.json", "dataset_info.json", "data-00000-of-00001.arrow"])
def test_a_fifo_in_a_saved_dataset_is_refused_without_blocking(tmp_path, bpe_dir, which):
    from datasets import Dataset

    Dataset.from_dict({"text": ["a b", "c d"]}).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "ds" / which).unlink()
    os.mkfifo(tmp_path / "ds" / which)  # nobody writes to it: reading it would block for ever
    proc = _cli("audit", tmp_path / "ds", "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o",
                "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert which in proc.stderr and "FIFO" in proc.stderr


@fifo_only
@pytest.mark.parametrize("kind", ["fifo", "broken_link", "folder"])
def test_an_audio_folder_transcript_that_is_no_file_is_named(tmp_path, kind):
    folder = tmp_path / "clips"
    folder.mkdir()
    write_audio(folder / "a.wav", 16000, 16000)
    write_audio(folder / "b.wav", 8000, 16000)
    (folder / "a.txt").write_text("hello there")
    odd = folder / "b.txt"
    {"fifo": os.mkfifo, "broken_link": lambda p: p.symlink_to(tmp_path / "gone.txt"), "folder": os.mkdir}[kind](odd)
    proc = _cli("audit", folder, "--audio", "audio", "--sampling-rate", 16000, "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{odd}: cannot read the transcript" in proc.stderr


@fifo_only
def test_embed_audio_never_opens_a_fifo_named_as_a_file(tmp_path):
    from datasets import load_from_disk

    wav = write_audio(tmp_path / "a.wav", 16000, 16000)
    os.mkfifo(tmp_path / "pipe.wav")
    features = {"audio": {"_type": "Audio", "decode": False}, "text": {"_type": "Value", "dtype": "string"}}
    audio = pa.array([{"bytes": None, "path": str(wav)}, {"bytes": None, "path": str(tmp_path / "pipe.wav")}],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"audio": audio, "text": ["a", "b"]}).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}), tmp_path / "au.parquet")
    proc = _cli("clean", tmp_path / "au.parquet", "--audio", "audio", "--sampling-rate", 16000, "--embed-audio",
                "--limit", "input_seconds<=100", "--out", tmp_path / "o", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert load_from_disk(str(tmp_path / "o" / "dataset")).data.column("audio").to_pylist() == [
        {"bytes": wav.read_bytes(), "path": "a.wav"}]
    rejects = load_from_disk(str(tmp_path / "o" / "rejects")).data.to_pylist()
    assert [(r["audio"], r["reason"]) for r in rejects] == [({"bytes": None, "path": str(tmp_path / "pipe.wav")},
                                                             "input_unreadable")]


# -- the rest of the sweep: truncated and empty compressed files, BOMs, CRLF, loops of links -------------

@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
@pytest.mark.parametrize("kind", ["jsonl", "csv", "json"])
def test_a_truncated_compressed_file_exits_2_naming_it(tmp_path, bpe_dir, capsys, suffix, kind):
    data = {"jsonl": _lines(3000), "csv": b"text\n" + b"hello there\n" * 20000,
            "json": json.dumps([{"text": f"row {i}"} for i in range(3000)]).encode()}[kind]
    src = tmp_path / f"cut.{kind}{suffix}"
    src.write_bytes(CODECS[suffix](data)[:-40])
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: unreadable (corrupt or truncated?)")


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst"])
def test_an_empty_compressed_file_holds_no_rows(tmp_path, bpe_dir, capsys, suffix):
    (tmp_path / f"e.jsonl{suffix}").write_bytes(CODECS[suffix](b""))
    assert _audit(tmp_path / f"e.jsonl{suffix}", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "holds no rows")


def test_byte_order_marks_and_crlf_read_as_plain_lines(tmp_path, bpe_dir):
    rows = _lines(200)
    (tmp_path / "plain.jsonl").write_bytes(rows)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + rows.replace(b"\n", b"\r\n"))
    csv = b"text\n" + b"".join(f"row {i} says hello\n".encode() for i in range(200))
    (tmp_path / "plain.csv").write_bytes(csv)
    (tmp_path / "bom.csv.zst").write_bytes(ZSTD(b"\xef\xbb\xbf" + csv.replace(b"\n", b"\r\n")))
    for name in ("plain.jsonl", "bom.jsonl", "plain.csv", "bom.csv.zst"):
        assert _audit(tmp_path / name, bpe_dir, tmp_path / name.replace(".", "-")) == 0
    assert _tokens(tmp_path / "bom-jsonl") == _tokens(tmp_path / "plain-jsonl")
    assert _tokens(tmp_path / "bom-csv-zst") == _tokens(tmp_path / "plain-csv")


def test_a_glob_round_a_loop_of_links_reads_each_file_once(tmp_path, bpe_dir):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_bytes(_lines(10))
    (data / "sub" / "b.jsonl").write_bytes(_lines(5))
    (data / "sub" / "up").symlink_to(data)  # a ** would go round it dozens of times
    (data / "again.jsonl").symlink_to(data / "a.jsonl")
    for source in (data / "**" / "*.jsonl", data):
        with pytest.warns(UserWarning, match="1 of the paths are files already listed"):
            assert _audit(source, bpe_dir, tmp_path / "o", "--overwrite") == 0
        assert len(_tokens(tmp_path / "o")) == 15
