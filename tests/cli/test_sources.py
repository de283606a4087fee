"""Sources as the CLI reads them: files that fail to load name the file and line or row; a column
missing from one file of many, zero rows, a header alone, links that loop, FIFOs and broken links,
names with glob or control characters, earlier outputs and caches inside a source folder, a saved
dataset naming paths outside itself, hub names offline and missing local paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import numbered_jsonl, write_jsonl
from tests.support.cli import audit, in_process, one_line, one_line_text


@pytest.mark.parametrize("where", ["split", "data_file"])
def test_a_saved_dataset_naming_paths_outside_itself_is_refused(tmp_path, bpe_dir, where, capsys):
    from datasets import Dataset, DatasetDict

    outside = tmp_path / "outside"
    Dataset.from_dict({"text": ["secret data"] * 3}).save_to_disk(str(outside))
    crafted = tmp_path / "crafted"
    DatasetDict({"train": Dataset.from_dict({"text": ["a", "b"]})}).save_to_disk(str(crafted))
    if where == "split":
        (crafted / "dataset_dict.json").write_text(json.dumps({"splits": ["../outside"]}))
    else:
        state = crafted / "train" / "state.json"
        data = json.loads(state.read_text())
        data["_data_files"] = [{"filename": "../../outside/data-00000-of-00001.arrow"}]
        state.write_text(json.dumps(data))
    proc = in_process(capsys, "clean", crafted, "--tokenizer", bpe_dir, "--input", "text", "--out", outside,
                      "--overwrite")
    assert proc.returncode == 2
    one_line_text(proc.stderr)
    assert "plain" in proc.stderr
    assert (outside / "state.json").exists()  # the data it pointed at is still there


@pytest.mark.slow
def test_a_recursive_glob_skips_an_earlier_parquet_clean_but_its_own_files_can_be_named(tmp_path, bpe_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("".join(json.dumps({"text": "word " * i}) + "\n" for i in range(1, 10)))
    assert main(["clean", str(data / "a.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=5", "--format", "parquet", "--out", str(tmp_path / "c"), "--quiet"]) == 0
    (tmp_path / "c").rename(data / "c")
    pq.write_table(pa.table({"text": ["one more row"]}), data / "b.parquet")
    out = tmp_path / "audit"
    with pytest.warns(UserWarning, match="skipped files in 1 earlier lengthscan output"):
        assert main(["audit", str(data / "**" / "*.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                     "--full", "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 1
    kept = pq.read_metadata(next((data / "c" / "dataset").glob("*.parquet"))).num_rows
    assert main(["audit", str(data / "c" / "dataset" / "*.parquet"), "--tokenizer", str(bpe_dir), "--input",
                 "text", "--full", "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == kept


@pytest.mark.slow
def test_the_cache_folder_inside_a_source_folder_is_not_data(tmp_path, bpe_dir, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    numbered_jsonl(data / "a.jsonl", 5)
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(data / "cache"))
    args = ["audit", str(data), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0  # writes the cache (and its manifests) into data/
    assert (data / "cache").is_dir()
    with pytest.warns(UserWarning, match="output or cache folder"):
        assert main([*args, "--out", str(tmp_path / "two")]) == 0
    assert json.loads((tmp_path / "two" / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 5


def test_control_and_bidi_characters_in_names_are_escaped(tmp_path, bpe_dir, capsys):
    name = "a\x1b[31mred\u202e\nx.jsonl"
    numbered_jsonl(tmp_path / name, 2)
    proc = in_process(capsys, "audit", tmp_path / name, "--tokenizer", bpe_dir, "--input", "nope", "--out",
                      tmp_path / "o")
    assert proc.returncode == 2
    one_line_text(proc.stderr)
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert "\\x1b[31mred\\u202e\\nx.jsonl" in proc.stderr


def test_text_files_that_fail_to_load_name_the_line(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.csv").write_bytes(b"text\nok\nbad \xff here\n")
    assert audit(tmp_path / "a.csv", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "a.csv: line 3 is not UTF-8")
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": broken\n{"text": "x"}\n')
    assert audit(tmp_path / "b.jsonl", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "b.jsonl: line 2 is not valid JSON")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.csv").write_text("text\nhello\n")
    (tmp_path / "c" / "b.csv").write_text("other\nx\n")
    assert audit(tmp_path / "c", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "have different columns", "b.csv has other")


def test_clean_never_publishes_bytes_that_are_not_utf8(tmp_path, bpe_dir, capsys):
    """A JSON Lines file is refused when opened, naming its file and line; a Parquet file whose
    reader lets such bytes through is refused before anything is written, naming its file and row."""
    (tmp_path / "s.jsonl").write_bytes(b'{"text": "ok", "other": "fine"}\n{"text": "fine", "other": "bad \xff"}\n')
    assert main(["clean", str(tmp_path / "s.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--limit", "input_tokens<=64", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    one_line(capsys, f"{tmp_path / 's.jsonl'}: line 2 is not UTF-8 text (byte 32 of the line: b'\\xff')")
    pq.write_table(pa.table({"text": ["ok", "fine"], "other": pa.array([b"fine", b"bad \xff"]).view(pa.string())}),
                   tmp_path / "s.parquet")
    assert main(["clean", str(tmp_path / "s.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--limit", "input_tokens<=64", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    one_line(capsys, f"column 'other' holds text that is not UTF-8: row 1 of {tmp_path / 's.parquet'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.parquet"]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_file_of_a_multi_file_source_without_the_column(tmp_path, bpe_dir, capsys, kind):
    data = tmp_path / "d"
    data.mkdir()
    if kind == "jsonl":
        write_jsonl(data / "a.jsonl", [{"text": "hello"}] * 3)
        write_jsonl(data / "b.jsonl", [{"other": "x"}])
    else:
        pq.write_table(pa.table({"text": ["a b", "c"]}), data / "a.parquet")
        pq.write_table(pa.table({"other": ["x"]}), data / "b.parquet")
    for command in ("audit", "clean"):
        assert main([command, str(data), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                     str(tmp_path / command), "--quiet"]) == 2
        one_line(capsys, f"b.{kind}: no column 'text' for --input; columns are: other")


def test_a_zero_row_parquet_is_refused_like_an_empty_file(tmp_path, bpe_dir, capsys):
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    for command in ("audit", "clean"):
        assert main([command, str(tmp_path / "zero.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                     "--out", str(tmp_path / command), "--quiet"]) == 2
        one_line(capsys, "holds no rows")


def test_a_loop_of_links_as_the_source(tmp_path, bpe_dir, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert audit(tmp_path / "a", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "a symbolic link that leads nowhere")


def test_date_like_strings_in_json_lines_stay_text(tmp_path, bpe_dir):
    from transformers import AutoTokenizer

    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "2024-01-01"}, {"text": "2024-01-02T10:00:00"}])
    assert main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", "input_tokens<=99",
                 "--out", str(tmp_path / "o"), "--quiet", "--no-cache", "--no-decide-only"]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(str(tmp_path / "o" / "dataset"))
    tok = AutoTokenizer.from_pretrained(bpe_dir)
    assert kept["text"] == ["2024-01-01", "2024-01-02T10:00:00"]
    assert kept["length"] == [len(tok(t)["input_ids"]) for t in kept["text"]]


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
    assert f"{lines}: line 2 is not UTF-8 text" in err


def test_empty_files_are_zero_rows_and_the_report_path_is_said(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("\n  \n")
    write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": "two"}])
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "*.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--no-cache", "--out", str(out)]) == 0
    err = capsys.readouterr()
    assert f"{out.resolve()}/lengths.parquet" in (err.out + err.err).replace("\n", "")
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 2
    assert main(["audit", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    assert "holds no rows" in capsys.readouterr().err


def test_a_literal_name_with_glob_characters_is_read_as_the_file(tmp_path, bpe_dir):
    src = numbered_jsonl(tmp_path / "train[2024].jsonl", 7)
    numbered_jsonl(tmp_path / "train2.jsonl", 5)  # what the name matches as a glob: not read
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--out", str(out),
                 "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 7


def test_earlier_outputs_inside_a_source_folder_are_not_data(tmp_path, bpe_dir):
    data = tmp_path / "data"
    data.mkdir()
    numbered_jsonl(data / "a.jsonl", 9)
    first = tmp_path / "first"
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main(["clean", str(data), *args[:-2], "--limit", "input_tokens<=6", "--format", "parquet",
                 "--out", str(first), "--quiet"]) in (0, 1)
    first.rename(data / "cleaned")  # a user moves it in (an --out inside the source is refused)
    (data / ".a.jsonl.tmp-1-abc").mkdir()  # hidden folders (a staging folder) are not data either
    numbered_jsonl(data / ".a.jsonl.tmp-1-abc" / "x.jsonl", 4)
    with pytest.warns(UserWarning, match="skipped 1 earlier lengthscan output or cache folder"):
        assert main(["audit", str(data), *args, "--out", str(tmp_path / "second")]) == 0
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert report["splits"][0]["sample"]["rows_total"] == 9


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_special_file_as_the_source_is_refused_without_blocking(tmp_path, bpe_dir, capsys):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert main(["audit", str(fifo), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "not a regular file" in err and str(fifo) in err


def test_a_csv_header_alone_is_zero_rows(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.csv").write_text("text,label\n")
    (tmp_path / "b.csv").write_text("text,label\nhello there,1\nsecond row,0\n")
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "*.csv"), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 2
    assert main(["audit", str(tmp_path / "a.csv"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds no rows" in err and "header alone" in err and "Traceback" not in err


@pytest.mark.parametrize("env,why", [({"HF_HUB_OFFLINE": "1"}, "offline mode is on"),
                                     ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "cannot be reached")])
@pytest.mark.parametrize("flag", ["--tokenizer", "--model"])
def test_hub_names_fail_fast_offline(tmp_path, corpus_jsonl, env, why, flag):
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    environ.update(env, HF_HOME=str(tmp_path / "hf"))  # an empty hub cache
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(corpus_jsonl), flag, "someorg/somemodel",
                           "--input", "text", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          env=environ, timeout=120)
    assert time.monotonic() - started < 30
    assert proc.returncode == 2 and why in proc.stderr and "someorg/somemodel" in proc.stderr
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--tokenizer", "--model"])
def test_a_missing_local_path_is_said_as_such(tmp_path, corpus_jsonl, capsys, flag):
    assert main(["audit", str(corpus_jsonl), flag, str(tmp_path / "no-such-dir"), "--input", "text",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no such" in err and "no-such-dir" in err and "Repo id" not in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("kind", ["fifo", "broken_link"])
@pytest.mark.parametrize("how", ["glob", "folder"])
def test_a_special_file_among_the_files_read_is_named_not_skipped(tmp_path, bpe_dir, capsys, kind, how):
    data = tmp_path / "data"
    data.mkdir()
    numbered_jsonl(data / "a.jsonl", 3)
    odd = data / "b.jsonl"
    os.mkfifo(odd) if kind == "fifo" else odd.symlink_to(tmp_path / "gone.jsonl")
    source = str(data / "*.jsonl") if how == "glob" else str(data)
    started = time.monotonic()
    assert main(["audit", source, "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert str(odd) in err and {"fifo": "not a regular file", "broken_link": "broken symbolic link"}[kind] in err
