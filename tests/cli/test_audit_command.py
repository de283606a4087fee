"""The ``lengthscan audit`` command end to end, as the issue checks it: real files, real tokenizers."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import write_jsonl
from tests.support.cli import in_process
from tests.support.reference import direct_counts


def _audit(*args) -> int:
    return main(["audit", *map(str, args), "--quiet"])


@pytest.mark.parametrize("tok", ["bpe_dir", "t5_spm_dir", *(pytest.param(t, marks=pytest.mark.slow) for t in (
    "marian_dir", "claude_bpe_dir", "mistral_spm_dir"))])
def test_full_audit_lengths_equal_direct_calls(request, tmp_path, corpus_jsonl, corpus_rows, tok):
    tok_dir = request.getfixturevalue(tok)
    out = tmp_path / "out"
    assert _audit(corpus_jsonl, "--tokenizer", tok_dir, "--input", "text", "--target", "summary",
                  "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    assert table["row"] == list(range(len(corpus_rows)))
    assert table["input_tokens"] == direct_counts(tok_dir, [r["text"] for r in corpus_rows], "input")
    assert table["target_tokens"] == direct_counts(tok_dir, [r["summary"] for r in corpus_rows], "target")
    flags = table["input_flag"]
    assert flags[5] == "missing" and table["input_tokens"][5] is None
    assert [table["input_tokens"][i] for i, r in enumerate(corpus_rows) if r["text"] == ""] == \
        [table["input_tokens"][i] for i, f in enumerate(flags) if f == "empty"]
    report = json.loads((out / "report.json").read_text())
    assert report["schema_version"] == 1
    (split,) = report["splits"]
    f = split["fields"]["input_tokens"]
    measured = [v for v in table["input_tokens"] if v is not None]
    assert f["count"] == len(measured) and f["max"] == max(measured) and f["missing"] == 1
    assert f["percentiles"]["p99"] == int(np.percentile(measured, 99, method="inverted_cdf"))
    assert split["pair"]["rows"] > 0
    assert report["tokenizer"]["hash"] and report["command"].startswith("lengthscan audit")
    assert (out / "report.html").read_text().count("input_tokens") >= 2


def test_sample_is_reproducible_and_spread(tmp_path, corpus_jsonl, corpus_rows, bpe_dir):
    outs = []
    for k in range(2):
        out = tmp_path / f"s{k}"
        assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
                      "--sample", 600, "--seed", 7, "--out", out, "--no-cache") == 0
        outs.append(pq.read_table(out / "lengths.parquet").to_pydict())
    assert outs[0]["row"] == outs[1]["row"]
    rows = np.asarray(outs[0]["row"])
    assert rows.size == 600 and len(set(rows)) == 600
    expected = np.sort(np.random.default_rng(7).choice(len(corpus_rows), 600, replace=False))
    assert rows.tolist() == expected.tolist()
    assert rows.min() < len(corpus_rows) * 0.05 and rows.max() > len(corpus_rows) * 0.95
    direct = direct_counts(bpe_dir, [corpus_rows[i]["text"] for i in rows], "input")
    assert outs[0]["input_tokens"] == direct
    report = json.loads((tmp_path / "s0" / "report.json").read_text())
    sample = report["splits"][0]["sample"]
    assert sample["mode"] == "sample" and sample["rows_measured"] == 600 and report["seed"] == 7
    assert "intervals" in report["splits"][0]["fields"]["input_tokens"]


def test_json_flag_prints_only_the_report(tmp_path, corpus_jsonl, bpe_dir, capfd):
    """capfd: what anything in the process writes to file descriptor 1 or 2, as a terminal would see it."""
    proc = in_process(capfd, "audit", corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out",
                      tmp_path / "o", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data == json.loads((tmp_path / "o" / "report.json").read_text())
    assert "input_tokens" in proc.stderr  # the summary went to stderr


def test_second_run_reuses_cached_lengths(tmp_path, corpus_jsonl, bpe_dir):
    args = [corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary", "--full"]
    assert _audit(*args, "--out", tmp_path / "a") == 0
    assert _audit(*args, "--out", tmp_path / "b") == 0
    a = json.loads((tmp_path / "a" / "report.json").read_text())
    b = json.loads((tmp_path / "b" / "report.json").read_text())
    assert a["cache_hits"] == 0 and b["cache_hits"] == 2
    assert a["splits"] == b["splits"]
    assert pq.read_table(tmp_path / "a" / "lengths.parquet").equals(pq.read_table(tmp_path / "b" / "lengths.parquet"))
    # a sampled audit reads its rows from the full cache too
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--sample", 300, "--out",
                  tmp_path / "c") == 0
    c = pq.read_table(tmp_path / "c" / "lengths.parquet").to_pydict()
    full = pq.read_table(tmp_path / "a" / "lengths.parquet").to_pydict()
    assert c["input_tokens"] == [full["input_tokens"][r] for r in c["row"]]


def test_splits_and_multi_file_identity(tmp_path, corpus_rows, bpe_dir):
    from datasets import Dataset, DatasetDict

    rows = [r for r in corpus_rows[:300]]
    DatasetDict({"train": Dataset.from_list(rows[:200]), "test": Dataset.from_list(rows[200:])}) \
        .save_to_disk(str(tmp_path / "dd"))
    assert _audit(tmp_path / "dd", "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o") == 0
    t = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pydict()
    assert t["split"] == ["train"] * 200 + ["test"] * 100
    assert t["row"] == list(range(200)) + list(range(100))
    assert t["input_tokens"] == direct_counts(bpe_dir, [r["text"] for r in rows], "input")

    for k in range(3):
        write_jsonl(tmp_path / f"shard-{k}.jsonl", rows[k * 100:(k + 1) * 100])
    assert _audit(tmp_path / "shard-*.jsonl", "--tokenizer", bpe_dir, "--input", "text", "--out",
                  tmp_path / "g") == 0
    g = pq.read_table(tmp_path / "g" / "lengths.parquet").to_pydict()
    assert g["row"] == list(range(300))
    assert [f.rsplit("/", 1)[1] for f in g["source_file"][99:101]] == ["shard-0.jsonl", "shard-1.jsonl"]
    assert g["file_row"][99:101] == [99, 0]


def test_bad_input_exits_2_with_a_clear_message(tmp_path, corpus_jsonl, bpe_dir, capsys):
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "nope", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "no column 'nope'" in err and "columns are: text, summary" in err
    assert _audit(tmp_path / "missing.jsonl", "--tokenizer", bpe_dir, "--input", "text") == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "mixed.jsonl").write_text('{"text": "fine"}\n' * 3 + '{"text": 12}\n')
    assert _audit(tmp_path / "mixed.jsonl", "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "o") == 2
    assert f"row 3 of {tmp_path / 'mixed.jsonl'} has int value '12'" in capsys.readouterr().err
    (tmp_path / "ints.jsonl").write_text('{"n": 1, "text": "a"}\n{"n": 2, "text": "b"}\n')
    assert _audit(tmp_path / "ints.jsonl", "--tokenizer", bpe_dir, "--input", "n", "--out", tmp_path / "o") == 2
    assert "column 'n' holds int64, not text: row 0" in capsys.readouterr().err
    assert _audit(corpus_jsonl, "--tokenizer", tmp_path / "no-tokenizer", "--input", "text") == 2
    assert "cannot load tokenizer" in capsys.readouterr().err
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--sample", "abc") == 2
    assert not (tmp_path / "o").exists()


def test_out_dir_with_foreign_files_is_not_replaced(tmp_path, corpus_jsonl, bpe_dir, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out", out) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"
    # a previous audit's directory is replaced as a whole
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out", tmp_path / "r") == 0
    assert _audit(corpus_jsonl, "--tokenizer", bpe_dir, "--target", "summary", "--out", tmp_path / "r") == 0
    assert "target_tokens" in pq.read_table(tmp_path / "r" / "lengths.parquet").column_names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_help_is_instant():
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "audit" in proc.stdout
    assert time.perf_counter() - start < 5  # generous; the point is no heavy import (checked below)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "lengthscan", "--help"],
                          capture_output=True, text=True)
    heavy = [m for m in ("transformers", "datasets", "torch", "librosa", "pandas") if f" {m}\n" in proc.stderr
             or f"| {m}\n" in proc.stderr]
    assert not heavy, heavy


def test_too_long_rows_are_listed_not_skipped(tmp_path, bpe_dir):
    rows = [{"text": "short"}, {"text": "long " * 1000}, {"text": "short again"}]
    write_jsonl(tmp_path / "d.jsonl", rows)
    assert main(["audit", str(tmp_path / "d.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--max-chars", "1000", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    t = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pydict()
    assert t["row"] == [0, 1, 2] and t["input_flag"] == [None, "too_long", None]
    assert t["input_tokens"][1] is None
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["splits"][0]["fields"]["input_tokens"]["unmeasured"] == 1


@pytest.mark.slow  # two full audits, one in worker processes
def test_num_proc_gives_identical_results(tmp_path, corpus_jsonl, bpe_dir):
    args = [corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary", "--full", "--no-cache"]
    assert _audit(*args, "--out", tmp_path / "one") == 0
    assert _audit(*args, "--num-proc", 2, "--out", tmp_path / "two") == 0
    a = pq.read_table(tmp_path / "one" / "lengths.parquet")
    b = pq.read_table(tmp_path / "two" / "lengths.parquet")
    assert a.equals(b)
    ra = json.loads((tmp_path / "one" / "report.json").read_text())
    rb = json.loads((tmp_path / "two" / "report.json").read_text())
    assert ra["splits"] == rb["splits"]


def test_library_num_proc_reaches_the_engine(tmp_path, corpus_jsonl, bpe_dir, monkeypatch):
    """``lengthscan.audit(num_proc=2)``: the run record's num_proc is the one the local engine runs with
    (None, the default: the engine chooses, one process for text)."""
    import lengthscan
    from lengthscan.engines import loop

    seen = []
    original = loop.LocalEngine.__init__

    def spy(self, num_proc=None):
        seen.append(num_proc)
        original(self, num_proc)

    monkeypatch.setattr(loop.LocalEngine, "__init__", spy)
    kw = dict(tokenizer=str(bpe_dir), input="text", full=True, cache=False)
    one = lengthscan.audit(str(corpus_jsonl), **kw)
    two = lengthscan.audit(str(corpus_jsonl), num_proc=2, **kw)
    assert seen == [None, 2] and one.to_dict()["splits"] == two.to_dict()["splits"]
