"""``lengthscan clean`` end to end: row-by-row against a direct recount, nothing lost, atomic output."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict, load_from_disk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

import lengthscan
from lengthscan.cli.main import main
from lengthscan.report.findings import findings
from tests.support.reference import direct_counts


def _clean(*args) -> int:
    return main(["clean", *map(str, args), "--quiet"])


@pytest.fixture(scope="module")
def tok(bpe_dir):
    return AutoTokenizer.from_pretrained(str(bpe_dir))


def test_drop_keeps_exactly_what_a_recount_keeps(tmp_path, corpus_jsonl, corpus_rows, bpe_dir):
    out = tmp_path / "out"
    assert _clean(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
                  "--limit", "input_tokens<=128", "--limit", "target_tokens<=16", "--action", "drop",
                  "--out", out) == 0
    x = direct_counts(bpe_dir, [r["text"] for r in corpus_rows], "input")
    y = direct_counts(bpe_dir, [r["summary"] for r in corpus_rows], "target")
    empty_target = direct_counts(bpe_dir, [""], "target")[0]
    keep = [i for i in range(len(corpus_rows)) if x[i] is not None and y[i] is not None
            and x[i] <= 128 and empty_target < y[i] <= 16]
    ds = load_from_disk(str(out / "dataset"))
    assert ds["text"] == [corpus_rows[i]["text"] for i in keep]
    assert ds["summary"] == [corpus_rows[i]["summary"] for i in keep]
    assert ds["length"] == [x[i] for i in keep]
    rejects = load_from_disk(str(out / "rejects"))
    assert sorted(list(rejects["row"]) + keep) == list(range(len(corpus_rows)))
    assert all(rejects["reason"]) and all(rejects["reasons"])
    by_row = dict(zip(rejects["row"], rejects["reason"]))
    assert by_row[5] == "input_missing" and by_row[11] == "target_missing"
    for row, reason in by_row.items():
        if reason == "target_tokens<=16":
            assert y[row] > 16
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    assert lengths["row"] == list(range(len(corpus_rows)))
    assert [d for d in lengths["decision"]].count("keep") == len(keep)
    report = json.loads((out / "report.json").read_text())
    (split,) = report["decisions"]["splits"]
    assert split["kept"] + split["truncated"] + split["dropped"] == len(corpus_rows)
    assert report["clean"]["published"] is True


def test_truncate_keeps_every_row_within_limits_as_prefixes(tmp_path, corpus_jsonl, corpus_rows, bpe_dir, tok):
    out = tmp_path / "out"
    assert _clean(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
                  "--limit", "input_tokens<=256", "--limit", "target_tokens<=12", "--action", "truncate",
                  "--out", out) == 0
    ds = load_from_disk(str(out / "dataset"))
    rejects = load_from_disk(str(out / "rejects"))
    # only rows with a None or a content-free target are dropped, whatever the action
    assert set(rejects["reason"]) <= {"input_missing", "target_missing", "empty_target"}
    kept_rows = sorted(set(range(len(corpus_rows))) - set(rejects["row"]))
    assert len(ds) == len(kept_rows)
    truncated = 0
    for i, text, summary, length in zip(kept_rows, ds["text"], ds["summary"], ds["length"]):
        original = corpus_rows[i]
        assert original["text"].startswith(text) and original["summary"].startswith(summary)
        assert len(tok(text)["input_ids"]) == length <= 256
        ids = tok(text_target=summary)["input_ids"]
        assert len(ids) <= 12 and ids[-1] == tok.eos_token_id
        truncated += text != original["text"] or summary != original["summary"]
    assert truncated > 50
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    after = [a for a, d in zip(lengths["target_tokens_after"], lengths["decision"]) if d == "truncate"]
    assert after and max(a for a in after if a is not None) <= 12


def test_splits_are_preserved_and_empty_rejects_load(tmp_path, corpus_rows, bpe_dir):
    rows = [r for r in corpus_rows[:400] if r["text"] and r["summary"]]
    DatasetDict({"train": Dataset.from_list(rows[:300]), "validation": Dataset.from_list(rows[300:])}) \
        .save_to_disk(str(tmp_path / "src"))
    out = tmp_path / "out"
    assert _clean(tmp_path / "src", "--tokenizer", bpe_dir, "--input", "text", "--limit", "input_tokens<=p90",
                  "--out", out) == 0
    ds = load_from_disk(str(out / "dataset"))
    assert isinstance(ds, DatasetDict) and list(ds) == ["train", "validation"]
    report = json.loads((out / "report.json").read_text())
    (rule,) = report["decisions"]["rules"]
    x_train = direct_counts(bpe_dir, [r["text"] for r in rows[:300]], "input")
    import numpy as np

    assert rule["threshold"] == np.percentile(x_train, 90, method="inverted_cdf")  # resolved on train only
    x_val = direct_counts(bpe_dir, [r["text"] for r in rows[300:]], "input")
    assert ds["validation"]["text"] == [r["text"] for r, n in zip(rows[300:], x_val) if n <= rule["threshold"]]
    out2 = tmp_path / "out2"
    assert _clean(tmp_path / "src", "--tokenizer", bpe_dir, "--input", "text", "--limit", "input_tokens<=100000",
                  "--out", out2) == 0
    rejects = load_from_disk(str(out2 / "rejects"))
    assert len(rejects["train"]) == 0 and "reason" in rejects["train"].column_names


def test_existing_out_needs_overwrite_and_gate_publishes_nothing(tmp_path, corpus_jsonl, bpe_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    args = [corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--limit", "input_tokens<=64"]
    assert _clean(*args, "--out", out) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "mine.txt").exists()
    assert _clean(*args, "--out", out, "--overwrite") == 0
    assert not (out / "mine.txt").exists() and (out / "dataset").is_dir()
    gated = tmp_path / "gated"
    assert _clean(*args, "--out", gated, "--fail-over", "1%") == 1
    err = capsys.readouterr().err
    assert "gate failed" in err and "nothing was published" in err
    assert not gated.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert _clean(*args, "--out", gated, "--fail-over", "99%") == 0


def test_length_column_is_not_overwritten_silently(tmp_path, bpe_dir, capsys):
    Dataset.from_dict({"text": ["a b c", "d e"], "length": [1, 2]}).save_to_disk(str(tmp_path / "src"))
    assert _clean(tmp_path / "src", "--tokenizer", bpe_dir, "--input", "text", "--limit", "input_tokens<=10",
                  "--out", tmp_path / "o") == 2
    assert "already has a 'length' column" in capsys.readouterr().err
    assert _clean(tmp_path / "src", "--tokenizer", bpe_dir, "--input", "text", "--limit", "input_tokens<=10",
                  "--length-column", "n_tokens", "--out", tmp_path / "o") == 0
    ds = load_from_disk(str(tmp_path / "o" / "dataset"))
    assert ds["length"] == [1, 2] and ds["n_tokens"] == direct_counts(bpe_dir, ["a b c", "d e"], "input")


@pytest.mark.slow  # two cleans of an 8x corpus, one (a child process) killed mid-write
def test_a_killed_run_leaves_no_output(tmp_path, corpus_jsonl, bpe_dir):
    """The killed run is a process of its own, stopped (SIGSTOP) as soon as its staging folder holds a
    file and killed (SIGKILL) while that folder is still there: publishing is the folder's rename, so
    the kill lands mid-write however fast the machine (a run that published first is run again). The
    next run, which sweeps its staging folder, runs in this one."""
    out = tmp_path / "out"
    big = tmp_path / "big.jsonl"
    with open(big, "w") as fh:
        for _ in range(8):
            fh.write(corpus_jsonl.read_text())
    cmd = [sys.executable, "-m", "lengthscan", "clean", str(big), "--tokenizer", str(bpe_dir), "--input", "text",
           "--target", "summary", "--limit", "input_tokens<=32:truncate", "--no-cache", "--out", str(out), "--quiet"]

    def staged() -> list:
        return [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]

    def writing() -> bool:  # a staging folder that holds a file (it may be published meanwhile)
        for folder in staged():
            try:
                if any(folder.iterdir()):
                    return True
            except OSError:
                pass
        return False

    for _ in range(5):
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(cmd)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not writing():
            time.sleep(0.002)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGSTOP)
        if proc.poll() is None and staged() and not out.exists():  # stopped mid-write
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        if proc.poll() is None:  # published before the stop: let it finish, and run again
            os.kill(proc.pid, signal.SIGCONT)
        proc.wait()
    else:
        pytest.fail("every run published before it could be stopped")
    assert not out.exists()
    assert staged()  # the killed run's staging directory: never mistaken for the output ...
    assert main([str(a) for a in cmd[3:]]) == 0
    assert out.is_dir() and not staged()  # ... and swept


TEXT = st.one_of(st.none(), st.text(alphabet=st.sampled_from(list("ab  é😀\u0301中\n")), max_size=40),
                 st.text(max_size=30))


@pytest.mark.slow  # 20 generated datasets, each cleaned end to end
@given(st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=25), st.integers(2, 12), st.integers(2, 8),
       st.sampled_from(["drop", "truncate"]), st.booleans())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_row_is_lost_or_duplicated(tmp_path_factory, bpe_dir, rows, lx, ly, action, keep_empty):
    out = tmp_path_factory.mktemp("prop") / "out"
    ds = Dataset.from_dict({"text": [r[0] for r in rows], "summary": [r[1] for r in rows],
                            "id": list(range(len(rows)))})
    result = lengthscan.clean(ds, out=out, tokenizer=str(bpe_dir), input="text", target="summary",
                              limits=[f"input_tokens<={lx}", f"target_tokens<={ly}"], action=action,
                              keep_empty_targets=keep_empty, cache=False)
    kept = load_from_disk(str(out / "dataset"))
    rejects = load_from_disk(str(out / "rejects"))
    assert sorted(list(kept["id"]) + list(rejects["id"])) == list(range(len(rows)))
    assert rejects["row"] == rejects["id"]
    (split,) = result.decisions.to_dict()["splits"]
    assert split["kept"] + split["truncated"] == len(kept) and split["dropped"] == len(rejects)
    for r, text, summary in zip(kept["id"], kept["text"], kept["summary"]):
        assert rows[r][0].startswith(text) and rows[r][1].startswith(summary)


def test_tokenize_writes_training_ready_columns(tmp_path, corpus_jsonl, corpus_rows, bpe_dir, tok):
    out = tmp_path / "out"
    assert _clean(corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
                  "--limit", "input_tokens<=64:truncate", "--limit", "target_tokens<=16:truncate", "--tokenize",
                  "--out", out) == 0
    ds = load_from_disk(str(out / "dataset"))
    for row in ds:  # ids kept from measuring, and re-tokenized where a text was truncated
        assert row["input_ids"] == tok(row["text"])["input_ids"] and len(row["input_ids"]) <= 64
        assert row["attention_mask"] == [1] * len(row["input_ids"])
        assert row["labels"] == tok(text_target=row["summary"])["input_ids"] and len(row["labels"]) <= 16
        assert row["length"] == len(row["input_ids"])
    decisions = pq.read_table(out / "lengths.parquet").column("decision").to_pylist()
    assert decisions.count("truncate") > 10 and decisions.count("keep") > 10


def test_tokenize_where_the_call_path_is_used(tmp_path, corpus_jsonl, marian_dir):
    """Marian targets have their own mode: ids come from __call__(text_target=...), still once."""
    out = tmp_path / "out"
    assert _clean(corpus_jsonl, "--tokenizer", marian_dir, "--input", "text", "--target", "summary",
                  "--limit", "input_tokens<=200", "--limit", "target_tokens<=40", "--tokenize", "--out", out) == 0
    tok = AutoTokenizer.from_pretrained(str(marian_dir))
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) > 100
    assert list(ds["input_ids"]) == tok(list(ds["text"]))["input_ids"]
    assert list(ds["labels"]) == tok(text_target=list(ds["summary"]))["input_ids"]
    report = json.loads((out / "report.json").read_text())
    assert report["tokenizer"]["methods"]["target"] == "__call__"


def test_report_carries_worst_rows_batches_and_redacts(tmp_path, corpus_jsonl, bpe_dir):
    args = [corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
            "--limit", "input_tokens<=128:truncate"]
    assert _clean(*args, "--out", tmp_path / "a") == 0
    data = json.loads((tmp_path / "a" / "report.json").read_text())
    worst = [w for w in data["clean"]["worst_rows"] if w["field"] == "input_tokens"]
    assert worst[0]["lengths"]["input_tokens"] == data["splits"][0]["fields"]["input_tokens"]["max"]
    assert worst[0]["preview"]["text"] and worst[0]["decision"] == "truncate"
    assert data["batches"]["of"] == "cleaned dataset" and data["clean"]["batches_before"]["of"] == "source"
    after = data["batches"]["by_batch_size"][0]["worst_case"]["input"]
    assert after <= 8 * 128 < data["clean"]["batches_before"]["by_batch_size"][0]["worst_case"]["input"]
    assert _clean(*args, "--out", tmp_path / "b", "--redact") == 0
    redacted = (tmp_path / "b" / "report.json").read_text() + (tmp_path / "b" / "report.html").read_text()
    redacted_report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert all("preview" not in w for w in redacted_report["clean"]["worst_rows"])
    assert worst[0]["preview"]["text"][:40] not in redacted


def test_decide_only_mode_gives_the_same_dataset(tmp_path, corpus_jsonl, bpe_dir):
    args = [corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--target", "summary",
            "--limit", "input_tokens<=64", "--no-cache"]
    assert _clean(*args, "--out", tmp_path / "fast") == 0
    assert _clean(*args, "--no-decide-only", "--out", tmp_path / "full") == 0
    fast, full = load_from_disk(str(tmp_path / "fast" / "dataset")), load_from_disk(str(tmp_path / "full" / "dataset"))
    assert fast["text"] == full["text"] and "length" not in fast.column_names
    report = json.loads((tmp_path / "fast" / "report.json").read_text())
    assert report["decisions"]["decide_only"]["on"] and report["splits"][0]["fields"]["input_tokens"]["bounded"] > 0
    lengths = pq.read_table(tmp_path / "fast" / "lengths.parquet").to_pydict()
    full_lengths = pq.read_table(tmp_path / "full" / "lengths.parquet").to_pydict()
    assert lengths["decision"] == full_lengths["decision"]
    seen = set()
    for exact, lo, flag in zip(full_lengths["input_tokens"], lengths["input_tokens_at_least"], lengths["input_flag"]):
        if flag in ("over_by_prefix", "over_by_pieces"):
            assert 64 < lo <= exact
            seen.add(flag)
    assert "over_by_pieces" in seen  # byte-level BPE: proven over from its pieces, without tokenizing
    # limits read from the tokenizer (its model_max_length): rows decided by a bound count as over
    # only where the bound proves it, and the rest are reported as unknown, never as within
    exact = np.asarray([-1 if x is None else x for x in full_lengths["input_tokens"]])
    checks = [c for c in report["splits"][0]["limits"] if c["measure"] == "input_tokens"]
    assert checks
    def column(name):
        return np.asarray([-1 if x is None else x for x in lengths[name]])

    at_least, at_most, counted = column("input_tokens_at_least"), column("input_tokens_at_most"), column("input_tokens")
    for check in checks:
        v = check["limit"]
        proven_over = (counted > v) | (at_least > v)
        unsettled = ((at_least >= 0) | (at_most >= 0)) & ~(at_least > v) & ~((at_most >= 0) & (at_most <= v))
        assert check["over_in_measured"] == proven_over.sum() <= (exact > v).sum()
        assert check["unknown_by_bound"] == unsettled.sum() > 0
        assert (exact > v).sum() <= check["over_in_measured"] + check["unknown_by_bound"]
    said = findings(report)
    assert any("decided by a proven bound, not counted in full" in f for f in said)
    unknown = f"{check['unknown_by_bound']:,} (more )?rows, decided by a decide-only bound, are not known against"
    assert any(re.search(unknown, f) for f in said)
    before = report["clean"]["batches_before"]
    without = sum(x is None or y is None for x, y in zip(lengths["input_tokens"], lengths["target_tokens"]))
    assert before["left_out"] == without >= report["splits"][0]["fields"]["input_tokens"]["bounded"] > 0
    exact = f"over the {before['simulated_rows']:,} of {before['rows']:,} rows with an exact length"
    assert any(exact in f for f in said)
    assert 'id="decide-only"' in (tmp_path / "fast" / "report.html").read_text()
    assert 'id="decide-only"' not in (tmp_path / "full" / "report.html").read_text()


def test_clean_warns_when_its_rows_still_exceed_the_model_limit(tmp_path, bpe_dir, corpus_jsonl):
    """A p99.9 rule above the tokenizer's 256 tokens keeps rows the model cannot take: a warning,
    a finding, and the cleaned split's limit check count them."""
    import json as _json
    import warnings as _warnings

    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        result = lengthscan.clean(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", out=tmp_path / "o",
                                  limits=["input_tokens<=p99.9"])
    after = _json.loads((tmp_path / "o" / "report.json").read_text())["clean"]["after"][0]
    over = next(c for c in after["limits"] if c["name"] == "input_tokens > 256")["over_in_measured"]
    lengths = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pylist()
    assert over > 0 and over == sum(1 for r in lengths if r["decision"] != "drop" and (r["input_tokens"] or 0) > 256)
    said = [str(w.message) for w in caught if "still exceed" in str(w.message)]
    assert said == [f"lengthscan: {over:,} cleaned rows still exceed input_tokens > 256 (tokenizer.model_max_length): "
                    "the rules keep rows the model cannot take; add --limit 'input_tokens<=256' (:truncate to cut "
                    "them instead)."]
    assert any(f"{over:,} cleaned rows still exceed" in f for f in findings(result.to_dict()))
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        lengthscan.clean(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", out=tmp_path / "o2",
                         limits=["input_tokens<=256"])
    assert not [w for w in caught if "still exceed" in str(w.message)]
