"""The count-only engine proven beside the counting (``measure/text/beside.py``): on a cache
without its proof, a run's counter counts with the proven fast path at once, takes the engine over
once the proof has ended, gives the tokenizer's counts throughout, and leaves the proof in the
cache for the next run, which counts with the engine from its first row."""

from __future__ import annotations

import json
import threading

import pyarrow.parquet as pq
import pytest

from lengthscan.measure.text import choice
from lengthscan.measure.text.beside import Proving, ProvingCount
from lengthscan.measure.text.counter import TokenCounter
from lengthscan.measure.text.strategies import EngineCount
from tests.support.reference import direct_counts


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    """A cache folder without any proof, and none in this process's memory (a first run), the
    proof begun by nothing but the counting (no early work, ``early.py``: see test_early.py)."""
    from lengthscan.measure.text.countbpe import codepoints, tables

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tables, "_DERIVED", {})
    monkeypatch.setattr(codepoints, "_KNOWN", {})
    monkeypatch.setattr(choice, "Early", lambda handle, engine, file=True: None)
    return tmp_path / "cache"


class GatedProving(Proving):
    """A real proof (``engine_for`` on the real tokenizer) that starts only when the test opens
    the gate: the counting before it is deterministic."""

    gate = threading.Event()

    def __init__(self, prove):
        super().__init__(lambda: (self.gate.wait(60), prove())[1])


def test_rows_are_counted_at_once_and_the_engine_takes_over_once_proven(bpe_dir, docs, cold_cache, monkeypatch):
    monkeypatch.setattr(choice, "Proving", GatedProving)
    GatedProving.gate.clear()
    texts = docs[:400]
    truth = direct_counts(bpe_dir, texts, "input")
    counter = TokenCounter(str(bpe_dir), prove_beside=True)
    first, _ = counter.count(texts[:200], "input")  # the proof has not started: the tokenizer counts
    strategy = counter.roles.exact("input", texts)
    assert isinstance(strategy, ProvingCount) and strategy.current() is None
    assert counter.counting()["input"]["engine"] == "tokenizers"
    assert "being proven beside the counting" in counter.counting()["input"]["reason"]
    GatedProving.gate.set()
    counter.settle()  # what the end of a run's counting does: the proof ends, and is cached
    assert isinstance(strategy.current(), EngineCount)
    rest, _ = counter.count(texts[200:], "input")
    assert first.tolist() + rest.tolist() == truth  # identical counts on both sides of the switch
    entry = counter.counting()["input"]
    assert entry["engine"].startswith("tiktoken") and entry["before_proof"] == 200, entry
    assert "the tokenizer counted the first 200 texts" in entry["reason"]
    assert list((cold_cache / "countbpe").glob("ranks-*.npz"))  # the next run finds the proof


def test_a_first_run_then_a_second_both_count_as_the_tokenizer(bpe_dir, docs, cold_cache, tmp_path):
    """Two audits as two first and second runs of the CLI: the first proves beside its counting
    (said so in report.json), the second counts with the engine from its first row."""
    from lengthscan.cli.main import main
    from lengthscan.measure.text.countbpe import codepoints, tables

    texts = docs[:300]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    truth = direct_counts(bpe_dir, texts, "input")
    entries = []
    for run in ("first", "second"):
        tables._DERIVED.clear()  # noqa: SLF001 - a new process would start without them
        codepoints._KNOWN.clear()  # noqa: SLF001
        out = tmp_path / run
        assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet",
                     "--no-cache", "--out", str(out)]) == 0
        assert pq.read_table(out / "lengths.parquet")["input_tokens"].to_pylist() == truth
        entries.append(json.loads((out / "report.json").read_text())["tokenizer"]["counting"]["input"])
    first, second = entries
    assert "beside the counting" in first["reason"] and first["before_proof"] > 0, first
    assert second["engine"].startswith("tiktoken") and "beside" not in second["reason"], second
    assert "before_proof" not in second


def test_workers_and_actors_prove_before_counting(bpe_dir):
    """A pickled counter (a worker process's, a Ray actor's) does not start threads of its own."""
    import pickle

    counter = TokenCounter(str(bpe_dir), prove_beside=True)
    assert pickle.loads(pickle.dumps(counter)).roles.prove_beside is False
