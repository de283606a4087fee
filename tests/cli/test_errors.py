"""The error model at the command line: a bad source or a dangerous --out is one line and exit 2
(naming the file or row), an unexpected error exit 3 with its traceback in a file (never 1, the
gate's), a closed pipe a quiet exit; and nothing of the source is ever lost."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_out_never_is_contains_or_lies_in_the_source(tmp_path, bpe_dir, capsys, where):
    data = tmp_path / "data"
    data.mkdir()
    src = _write_jsonl(data / "s.jsonl", [{"text": f"row {i}"} for i in range(20)])
    before = src.read_bytes()
    source, out = {"same": (data, data), "parent": (src, data), "inside": (data, data / "cleaned")}[where]
    code = main(["clean", str(source), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", "input_tokens<=8",
                 "--out", str(out), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "the source path" in err and "Traceback" not in err
    assert src.read_bytes() == before and sorted(p.name for p in data.iterdir()) == ["s.jsonl"]
    assert main(["audit", str(source), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                 "--overwrite", "--quiet"]) == 2
    assert src.read_bytes() == before


def test_corrupt_parquet_and_non_utf8_exit_2_naming_them(tmp_path, bpe_dir, capsys):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": [f"hello world {i} " * 20 for i in range(2000)]}), path, row_group_size=500,
                   compression="snappy")
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 300] = b"\xab" * 300
    path.write_bytes(bytes(data))
    assert main(["audit", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}" in err and "unreadable" in err and "Traceback" not in err
    lines = tmp_path / "latin1.jsonl"
    lines.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    assert main(["audit", str(lines), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "row 1" in err


def test_an_internal_error_exits_3_with_its_traceback_in_a_file(capsys):
    from lengthscan.cli.main import _internal_error

    try:
        raise RuntimeError("something broke\nsecond line")
    except RuntimeError as exc:
        code = _internal_error(exc)
    err = capsys.readouterr().err
    assert code == 3 and "internal error: RuntimeError: something broke" in err and "second line" not in err
    path = err.split("the traceback is in ")[1].split(";")[0]
    with open(path, encoding="utf-8") as fh:
        assert "Traceback" in fh.read()


def test_a_closed_pipe_exits_quietly(tmp_path, bpe_dir, corpus_jsonl):
    cmd = (f"{sys.executable} -m lengthscan audit {corpus_jsonl} --tokenizer {bpe_dir} --input text --json "
           f"--out {tmp_path / 'o'} | head -c 10")
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True)
    assert proc.stdout == '{\n  "schema'[:10]
    assert proc.returncode == 0 and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr
