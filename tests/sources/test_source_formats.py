"""Data files an adversarial sweep found mishandled, through the CLI: JSON Lines that are no rows
(nested too deep, a key twice, 1e400, a lone surrogate escape, a line that is not an object);
Parquet string columns stored as ``string_view``, dictionaries or ``large_string``; TSV read without
quoting; CSV/TSV columns read as the text they hold, so ``clean`` writes each row back as it was;
and CSV headers naming a column twice or too many columns to list."""

from __future__ import annotations

import base64
import csv
import io
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.cli import one_line

pytestmark = pytest.mark.slow  # every format case runs the CLI, several in child processes

KEEP_ALL = "input_tokens<=100000"


def _audit(src, bpe_dir, out, *extra, column="text"):
    return main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", column, "--out", str(out), "--quiet",
                 *([] if "--sample" in extra else ["--full"]), *extra])


def _clean(src, bpe_dir, out, *extra, limit=KEEP_ALL):
    return main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out), "--quiet",
                 "--limit", limit, "--length-from", "none", *extra])


def _run(*args):
    """The CLI in a child process (a reader's crash on a crafted file cannot take the tests down)."""
    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def _written(out, fmt="arrow") -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(out / "dataset")
    from datasets import load_from_disk

    return load_from_disk(str(out / "dataset")).data.table


# -- JSON Lines: nesting -----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["audit", "clean"])
@pytest.mark.parametrize("deep", ['{"text": "x", "m": ' + "[" * 10_000 + "]" * 10_000 + "}",
                                  '{"text": ' + "[" * 10_000 + "]" * 10_000 + "}",
                                  '{"text": "x", "m": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}"],
                         ids=["arrays", "text-arrays", "objects"])
def test_rows_nested_thousands_deep_are_refused_naming_the_line(tmp_path, bpe_dir, deep, command):
    src = tmp_path / "deep.jsonl"
    src.write_text('{"text": "a first row"}\n\n' + deep + "\n")
    extra = ["--limit", KEEP_ALL] if command == "clean" else []
    for _ in range(2):  # the second run finds no cached schema of the file to trust
        proc = _run(command, src, "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o", "--quiet",
                    *extra)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{src}: line 3 nests objects and arrays more than 32 levels deep" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_deep_line_is_refused_before_the_reader_spends_minutes_on_it(tmp_path, bpe_dir):
    """pyarrow's JSON reader takes time quadratic in the depth (100,000 levels: most of an hour):
    a line of many brackets is measured before it is handed over."""
    import time

    src = tmp_path / "deep.jsonl"
    src.write_text('{"text": "x"}\n{"text": "y", "m": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    started = time.monotonic()
    proc = _run("audit", src, "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 2 and f"{src}: line 2 nests" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 60


def test_a_line_of_many_brackets_but_shallow_is_read(tmp_path, bpe_dir):
    src = tmp_path / "wide.jsonl"
    src.write_text(json.dumps({"text": "hello there", "m": [{"a": [i]} for i in range(3000)]}) + "\n"
                   + json.dumps({"text": "two", "m": []}) + "\n")
    assert _audit(src, bpe_dir, tmp_path / "o") == 0
    assert pq.read_table(tmp_path / "o" / "lengths.parquet").num_rows == 2


def test_nesting_up_to_the_limit_is_read(tmp_path, bpe_dir):
    src = tmp_path / "ok.jsonl"
    src.write_text('{"text": "hello there", "m": ' + "[" * 31 + "1" + "]" * 31 + "}\n")
    assert _audit(src, bpe_dir, tmp_path / "o") == 0
    src.write_text('{"text": "hello there", "m": ' + "[" * 32 + "1" + "]" * 32 + "}\n")
    proc = _run("audit", src, "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o2", "--quiet")
    assert proc.returncode == 2 and "line 1 nests" in proc.stderr, proc.stderr


def test_a_cached_schema_too_deep_to_read_back_is_rebuilt_then_refused(tmp_path, bpe_dir, capsys, monkeypatch):
    """A source cache entry holding a schema Arrow cannot read back (one written before the limit,
    say) is not trusted: the file is read again, and the deep row refused."""
    from lengthscan.sources import files

    src = tmp_path / "deep.jsonl"
    src.write_text('{"text": "x"}\n{"text": "y", "m": ' + '{"a": ' * 200 + "1" + "}" * 200 + "}\n")
    deep = pa.int64()
    for _ in range(200):
        deep = pa.struct([("a", deep)])
    schema = pa.schema([("text", pa.string()), ("m", deep)]).serialize().to_pybytes()
    entry = {"path": str(src), "rows": 2, "schema": base64.b64encode(schema).decode()}
    monkeypatch.setattr(files, "_read_manifest", lambda path, fields: [entry])
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 2 nests objects and arrays more than 32 levels deep")


def test_a_json_array_file_nested_too_deep_is_refused(tmp_path, bpe_dir, capsys):
    src = tmp_path / "rows.json"
    src.write_text('[{"text": "x"},\n {"text": "y", "m": ' + "[" * 40 + "]" * 40 + "}]\n")
    proc = _run("audit", src, "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 2 and f"{src}: line 2 nests" in proc.stderr, proc.stderr


# -- JSON Lines: lines that are no row -------------------------------------------------------------

@pytest.mark.parametrize("line,words", [
    ('{"text": "a", "text": "b"}', ["has the key 'text' twice in one object"]),
    ('{"text": "a", "meta": {"k": 1, "k": 2}}', ["has the key 'k' twice"]),
    ('{"text": "a", "n": 1e400}', ["holds the number 1e400, too large for a 64-bit float"]),
    ('{"text": "a\\ud800b"}', ["holds the escape \\ud800, half of a UTF-16 surrogate pair"]),
    ('{"text": "a\\udfffb"}', ["holds the escape \\udfff"]),
    ("3", ["is a number (3), not an object"]),
    ('"x"', ['is a string ("x"), not an object']),
    ("[1, 2]", ["is an array ([1, 2]), not an object"]),
    ("true", ["is a boolean (true), not an object"]),
    ('{"text": "a"', ["is not valid JSON"]),
])
def test_a_line_that_is_no_row_is_named(tmp_path, bpe_dir, capsys, line, words):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "first", "n": 1}\n\n' + line + '\n{"text": "last", "n": 2}\n')
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 3 ", *words)
    assert not (tmp_path / "o").exists()


def test_a_first_line_that_is_no_object_is_named(tmp_path, bpe_dir, capsys):
    src = tmp_path / "d.jsonl"
    src.write_text('3\n{"text": "a"}\n')
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 1 is a number (3), not an object")


def test_a_key_twice_is_refused_where_the_fallback_reader_would_keep_one(tmp_path, bpe_dir, capsys):
    """A column whose type changes sends the file to ``datasets``, which parses with ujson (last key
    wins): the line with a key twice is still refused, not read with one of its values."""
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a", "m": 1}\n{"text": "b", "m": "x", "text": "c"}\n')
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line 2 has the key 'text' twice")


def test_mixed_types_and_null_lines_still_read(tmp_path, bpe_dir):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "hello there", "m": 1}\nnull\n{"text": "a\\ud83d\\ude00b", "m": "x"}\n')
    assert _audit(src, bpe_dir, tmp_path / "o") == 0
    assert pq.read_table(tmp_path / "o" / "lengths.parquet").num_rows == 3


# -- Parquet: string_view, dictionary and large_string columns --------------------------------------

TEXTS = ["hello there", "a much longer text with quite a few words in it", None, "", "short one",
         "x" * 50, "naïve café ünïcode"]


def _parquet(path, text_type):
    texts = pa.array(TEXTS, pa.string())
    column = texts.dictionary_encode() if text_type == "dictionary" else texts.cast(text_type)
    other = pa.array([f"label {i % 2}" for i in range(len(TEXTS))]).dictionary_encode()
    pq.write_table(pa.table({"text": column, "id": pa.array(range(len(TEXTS)), pa.int64()),
                             "label": other, "tags": pa.array([[t or ""] for t in TEXTS], pa.list_(pa.string_view()))}),
                   path)
    return path


@pytest.mark.parametrize("text_type", [pa.string_view(), "dictionary", pa.large_string()], ids=str)
def test_parquet_string_columns_of_any_encoding_are_measured_and_written_back(tmp_path, bpe_dir, text_type):
    plain = _parquet(tmp_path / "plain.parquet", pa.string())
    src = _parquet(tmp_path / "src.parquet", text_type)
    for name, f in (("plain", plain), ("src", src)):
        assert _audit(f, bpe_dir, tmp_path / f"a-{name}") == 0
        assert _audit(f, bpe_dir, tmp_path / f"s-{name}", "--sample", "3", column="text") == 0
    lengths = [pq.read_table(tmp_path / f"a-{n}" / "lengths.parquet").column("input_tokens") for n in ("plain", "src")]
    assert lengths[0].equals(lengths[1])
    source = pq.read_table(plain)
    for fmt in ("arrow", "parquet"):
        out = tmp_path / f"c-{fmt}"
        assert _clean(src, bpe_dir, out, "--format", fmt) == 0
        rejects = pq.read_table(out / "rejects") if fmt == "parquet" else None
        written = _written(out, fmt)
        kept = [i for i, t in enumerate(TEXTS) if t is not None]  # a missing text is dropped
        assert written.column("text").to_pylist() == [TEXTS[i] for i in kept]
        assert written.column("id").to_pylist() == kept
        assert written.column("label").to_pylist() == [source.column("label")[i].as_py() for i in kept]
        assert written.column("tags").to_pylist() == [[TEXTS[i]] for i in kept]
        if rejects is not None:
            assert rejects.column("row").to_pylist() == [i for i, t in enumerate(TEXTS) if t is None]
    out = tmp_path / "truncated"
    assert _clean(src, bpe_dir, out, limit="input_tokens<=4:truncate") == 0
    written = _written(out).column("text").to_pylist()
    assert len(written) == len(TEXTS) - 1 and written != [t for t in TEXTS if t is not None]
    assert all(w is not None and TEXTS[i].startswith(w)
               for i, w in zip([i for i, t in enumerate(TEXTS) if t is not None], written)), written


# -- TSV without quoting, CSV/TSV columns as text ---------------------------------------------------

def test_a_tsv_field_starting_with_a_quote_is_one_field_of_its_own_line(tmp_path, bpe_dir):
    lines = ["id\tzip\ttext\tnote",
             '1\t00501\t"hello there\tstarts with a quote',
             '2\t02134\tsay "hi" to them\t',
             '\t\t"quoted all through"\t"',
             "4\tNA\t \"lead and trail\" \t12345678901234567890123"]
    src = tmp_path / "d.tsv"
    src.write_bytes(("\n".join(lines) + "\n").encode())
    assert _audit(src, bpe_dir, tmp_path / "a") == 0
    assert pq.read_table(tmp_path / "a" / "lengths.parquet").num_rows == 4
    out = tmp_path / "c"
    assert _clean(src, bpe_dir, out) == 0
    written = _written(out)
    assert written.column_names == ["id", "zip", "text", "note"]
    back = ["\t".join("" if v is None else v for v in row.values()) for row in written.to_pylist()]
    assert back == lines[1:]  # byte for byte: no quote added, removed or interpreted


def _csv_bytes(rows) -> bytes:
    buf = io.StringIO(newline="")
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode()


def test_clean_writes_csv_rows_back_as_they_were(tmp_path, bpe_dir):
    """No column is converted: zero-padded codes, integer ids with a blank, 30-digit numbers,
    decimals and "NA" come back as written; a blank cell is missing (and writes back blank)."""
    rows = [["id", "zip", "text", "amount", "big", "flag"],
            ["1", "00501", "hello there", "1.50", "123456789012345678901234567890", "True"],
            ["", "02134", "a text, with a comma", "-0", "9007199254740993", "NA"],
            ["3", "", 'she said "hi"\nover two lines', "1e400", "", "null"],
            ["4", "10001", "  spaced  ", "0x1F", "-000", ""]]
    src = tmp_path / "d.csv"
    src.write_bytes(_csv_bytes(rows))
    out = tmp_path / "c"
    assert _clean(src, bpe_dir, out, limit="input_tokens<=6") == 0
    written = _written(out)
    assert set(written.schema.types) == {pa.string()}
    from datasets import load_from_disk

    rejects = load_from_disk(str(out / "rejects"))
    kept = [r for i, r in enumerate(rows[1:]) if i not in set(rejects["row"])]
    assert rejects.num_rows and len(kept) == written.num_rows
    back = [["" if v is None else v for v in row.values()] for row in written.to_pylist()]
    assert _csv_bytes([rows[0], *back]) == _csv_bytes([rows[0], *kept])
    tsv = tmp_path / "d.tsv"
    tsv.write_bytes(b"".join("\t".join(r).replace("\n", " ").encode() + b"\n" for r in rows))
    assert _clean(tsv, bpe_dir, tmp_path / "t") == 0
    back = ["\t".join("" if v is None else v for v in row.values()) for row in _written(tmp_path / "t").to_pylist()]
    assert "\n".join(back).encode() + b"\n" == tsv.read_bytes().split(b"\n", 1)[1]


def test_a_csv_id_column_stays_text_in_the_lengths_file(tmp_path, bpe_dir):
    src = tmp_path / "d.csv"
    src.write_text("id,text\n007,hello there\n,no id\n12345678901234567890,big\n")
    assert _audit(src, bpe_dir, tmp_path / "o", "--id", "id") == 0
    assert pq.read_table(tmp_path / "o" / "lengths.parquet").column("id").to_pylist() == \
        ["007", None, "12345678901234567890"]


# -- CSV headers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,header", [("d.csv", "text,label,text"), ("d.tsv", "text\tlabel\ttext")])
def test_a_header_naming_a_column_twice_is_refused(tmp_path, bpe_dir, capsys, name, header):
    src = tmp_path / name
    sep = "\t" if name.endswith(".tsv") else ","
    src.write_text(header + "\n" + sep.join(["a", "b", "c"]) + "\n")
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: the header names the column 'text' twice (columns 1 and 3)")


@pytest.mark.parametrize("name,text,line", [
    ("trailing.csv", "id,text\n0,first row,\n1,second row,\n", 2),  # every line ends with a comma
    ("extra.csv", "id,text\n\n0,\"a quoted\nfield\",surplus\n1,b\n", 3),  # after a blank line, over two lines
    ("extra.tsv", "id\ttext\n0\ta\tsurplus\n", 2)])
@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_first_row_with_more_fields_than_the_header_is_refused(tmp_path, bpe_dir, capsys, name, text, line,
                                                                 command):
    """pandas reads the surplus leading fields of such a file as its index: every column shifted
    (``id`` read from the text, ``text`` from the surplus), in silence. The row is named instead."""
    src = tmp_path / name
    src.write_text(text)
    run = _audit if command == "audit" else _clean
    assert run(src, bpe_dir, tmp_path / "o") == 2
    one_line(capsys, f"{src}: line {line} has 3 fields where the header names 2 columns")
    assert not (tmp_path / "o").exists()


def test_a_row_with_fewer_fields_than_the_header_is_read_with_its_missing_cells(tmp_path, bpe_dir):
    src = tmp_path / "short.csv"
    src.write_text("id,text,note\n0,hello there\n1,a text,a note\n")
    out = tmp_path / "c"
    assert _clean(src, bpe_dir, out) == 0
    assert _written(out).to_pylist() == [{"id": "0", "text": "hello there", "note": None},
                                         {"id": "1", "text": "a text", "note": "a note"}]


def test_column_lists_in_messages_are_capped(tmp_path, bpe_dir, capsys):
    n = 3000
    src = tmp_path / "wide.csv"
    src.write_text(",".join(f"c{i}" for i in range(n)) + "\n" + ",".join("x" for _ in range(n)) + "\n")
    assert _audit(src, bpe_dir, tmp_path / "o") == 2
    err = one_line(capsys, "no column 'text' for --input", "c0, c1,", "c9 and 2,990 more")
    assert len(err) < 300
    assert _audit(src, bpe_dir, tmp_path / "o", "--id", "nope", column="c1") == 2
    err = one_line(capsys, "no column 'nope' for --id", "and 2,990 more")
    assert len(err) < 300
    other = tmp_path / "more" / "b.csv"
    other.parent.mkdir()
    (tmp_path / "more" / "a.csv").write_text(src.read_text())
    other.write_text(",".join(f"d{i}" for i in range(n)) + "\n" + ",".join("x" for _ in range(n)) + "\n")
    assert _audit(tmp_path / "more" / "*.csv", bpe_dir, tmp_path / "o", column="c1") == 2
    err = one_line(capsys, "the files have different columns", "and 2,990 more")
    assert len(err) < 1000
