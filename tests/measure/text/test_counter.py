"""Token counts against direct ``AutoTokenizer`` calls, row by row, for every tokenizer kind."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from lengthscan.measure.records import FLAG_EMPTY, FLAG_MISSING, FLAG_OK, FLAG_TOO_LONG
from lengthscan.measure.text.counter import METHOD_CALL, METHOD_FAST, TokenCounter
from tests.support.reference import direct_counts


@pytest.mark.parametrize("role", ["input", "target"])
def test_counts_equal_direct_calls(any_tokenizer_dir, corpus_rows, role):
    texts = [r["text"] for r in corpus_rows[:400]] + [r["summary"] for r in corpus_rows[:200]]
    counter = TokenCounter(str(any_tokenizer_dir))
    lengths, flags = counter.count(texts, role)
    expected = direct_counts(any_tokenizer_dir, texts, role)
    got = [None if f == FLAG_MISSING else int(v) for v, f in zip(lengths, flags)]
    assert got == expected


def test_fast_path_is_used_where_proven(bpe_dir, wordpiece_dir, unigram_dir, t5_spm_dir):
    for tok_dir in (bpe_dir, wordpiece_dir, unigram_dir, t5_spm_dir):
        counter = TokenCounter(str(tok_dir))
        counter.count(["hello world"], "input")
        counter.count(["hello world"], "target")
        assert counter.info().methods == {"input": METHOD_FAST, "target": METHOD_FAST}, tok_dir


def test_separate_target_mode_falls_back_to_call(marian_dir, corpus_rows):
    counter = TokenCounter(str(marian_dir))
    texts = [r["summary"] for r in corpus_rows[:50] if r["summary"]]
    counter.count(texts, "target")
    counter.count(texts, "input")
    assert counter.info().methods["target"] == METHOD_CALL
    assert "not a fast tokenizer" in counter.roles.reasons()["target"] or \
        "target mode" in counter.roles.reasons()["target"]
    # the source and target vocabularies really differ for this tokenizer
    assert direct_counts(marian_dir, texts, "target") != direct_counts(marian_dir, texts, "input")


def test_flags_missing_empty_and_too_long(bpe_dir):
    counter = TokenCounter(str(bpe_dir), max_chars=50)
    lengths, flags = counter.count([None, "", "short text", "x" * 51], "input")
    assert flags.tolist() == [FLAG_MISSING, FLAG_EMPTY, FLAG_OK, FLAG_TOO_LONG]
    assert lengths[0] == -1 and lengths[3] == -1
    assert lengths[1] == 2  # <s> </s>: an empty string is measured, special tokens only
    assert lengths[2] == direct_counts(bpe_dir, ["short text"], "input")[0]


def test_non_string_raises_with_position(bpe_dir):
    counter = TokenCounter(str(bpe_dir))
    with pytest.raises(TypeError, match="position 1: int"):
        counter.count(["ok", 5], "input")


def test_baked_in_truncation_and_padding_are_ignored(tmp_path, bpe_dir):
    """A tokenizer.json with truncation/padding baked in must still count full, unpadded lengths."""
    import json
    import shutil

    from tokenizers import Tokenizer

    out = tmp_path / "baked"
    shutil.copytree(bpe_dir, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=64, pad_id=1, pad_token="<pad>")
    tok.save(str(out / "tokenizer.json"))
    assert json.loads((out / "tokenizer.json").read_text())["truncation"] is not None
    text = "a sentence that is certainly longer than eight tokens, by quite a margin indeed"
    lengths, _ = TokenCounter(str(out)).count([text], "input")
    assert lengths[0] == direct_counts(out, [text], "input")[0]
    assert 8 < lengths[0] < 64


def test_large_batches_are_chunked_and_exact(bpe_dir, corpus_rows, monkeypatch):
    import lengthscan.measure.text.counter as tokens

    monkeypatch.setattr(tokens, "CHUNK_CHARS", 500)
    texts = [r["text"] for r in corpus_rows[:120]]
    lengths, flags = TokenCounter(str(bpe_dir)).count(texts, "input")
    expected = direct_counts(bpe_dir, texts, "input")
    assert [None if f == FLAG_MISSING else int(v) for v, f in zip(lengths, flags)] == expected


def test_counter_pickles_and_keeps_its_identity(bpe_dir):
    counter = TokenCounter(str(bpe_dir))
    clone = pickle.loads(pickle.dumps(counter))
    assert clone.hash == counter.hash
    a, _ = counter.count(["pickled counters count the same"], "input")
    b, _ = clone.count(["pickled counters count the same"], "input")
    assert np.array_equal(a, b)


def test_hash_changes_with_tokenizer_files(tmp_path, bpe_dir):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(bpe_dir, out)
    before = TokenCounter(str(out)).hash
    assert before == TokenCounter(str(bpe_dir)).hash
    cfg = out / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("256", "128"))
    assert TokenCounter(str(out)).hash != before


def test_pathological_row_is_recorded_not_tokenized(bpe_dir):
    """A 100 MB string is flagged too long at once instead of hanging or exhausting memory."""
    import time

    counter = TokenCounter(str(bpe_dir))
    start = time.perf_counter()
    lengths, flags = counter.count(["fine", "x" * 100_000_000, None], "input")
    assert time.perf_counter() - start < 5
    assert flags.tolist() == [FLAG_OK, FLAG_TOO_LONG, FLAG_MISSING]
    assert lengths[1] == -1


def test_a_tampered_fast_path_snapshot_is_proven_again_never_used(bpe_dir, docs):
    """The remembered backend snapshot (the proven fast path) with merges removed counted every row
    with them wrong, silently. Its checksum no longer matches: a warning, the tokenizer's counts."""
    import json
    import os
    from pathlib import Path

    from lengthscan.sources.cache_dir import write_cache_text

    texts = docs[:300]
    truth = direct_counts(bpe_dir, texts, "input")
    assert list(TokenCounter(str(bpe_dir)).count(texts, "input")[0]) == truth
    (snapshot,) = Path(os.environ["LENGTHSCAN_CACHE"], "fastpath").glob("*.tokenizer.json")
    head, spec = snapshot.read_text(encoding="utf-8").split("\n", 1)
    tampered = json.loads(spec)
    tampered["model"]["merges"] = tampered["model"]["merges"][:200]
    write_cache_text(snapshot, json.dumps(tampered))  # sealed anew (what no check can catch): the tamper matters
    assert list(TokenCounter(str(bpe_dir)).count(texts, "input")[0]) != truth
    snapshot.write_text(f"{head}\n{json.dumps(tampered)}", encoding="utf-8")  # the checksum of what was
    again = TokenCounter(str(bpe_dir))
    with pytest.warns(RuntimeWarning, match=r"cache not used: .*\.tokenizer\.json has a checksum its content"):
        assert list(again.count(texts, "input")[0]) == truth
    assert "remembered" not in again.roles.reasons()["input"]  # proven again on the real tokenizer
    assert list(TokenCounter(str(bpe_dir)).count(texts, "input")[0]) == truth  # and remembered soundly


def test_a_tokenizer_loaded_here_is_counted_on_its_own_backend(tmp_path, bpe_dir, docs, monkeypatch):
    """Copying a large vocabulary's backend costs a second and its memory: a tokenizer lengthscan
    loads itself (nobody else calls it) is counted on its own backend, where that is in input mode,
    untruncated and unpadded; a caller's object, or a backend with truncation baked in, on a copy
    (the caller's later calls with truncation change nothing counted)."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from lengthscan.measure.text.fastpath import prove
    from lengthscan.measure.text.handle import TokenizerHandle

    texts = docs[:40]
    handle = TokenizerHandle(str(bpe_dir), share_backend=True)  # a run's, as ``counting_settings`` asks
    tok = handle.tokenizer
    assert handle.owned
    assert prove(tok, "input", texts, handle.call_ids, owned=True).backend is tok.backend_tokenizer
    theirs = AutoTokenizer.from_pretrained(str(bpe_dir))
    mine = TokenCounter(str(bpe_dir), count_engine="tokenizers")  # the library's: its tokenizer is the caller's too
    for counter, tok in ((TokenCounter(theirs, count_engine="tokenizers"), theirs), (mine, mine.tokenizer)):
        assert not counter.handle.owned
        method = prove(tok, "input", texts, counter.handle.call_ids, owned=counter.handle.owned)
        assert method.backend is not tok.backend_tokenizer
        before = list(counter.count(texts, "input")[0])
        tok(texts, truncation=True, max_length=4)  # leaves truncation on its backend
        assert tok.backend_tokenizer.truncation is not None
        assert list(counter.count(texts, "input")[0]) == before == direct_counts(bpe_dir, texts, "input")
    baked = tmp_path / "baked"
    shutil.copytree(bpe_dir, baked)
    spec = json.loads((baked / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    (baked / "tokenizer.json").write_text(json.dumps(spec))
    handle = TokenizerHandle(str(baked), share_backend=True)
    assert handle.tokenizer.backend_tokenizer.truncation is not None  # as transformers leaves it after loading
    from lengthscan.measure.text import fastpath

    copies = []
    monkeypatch.setattr(fastpath, "copy_backend", lambda t, made=fastpath.copy_backend: copies.append(1) or made(t))
    method = prove(handle.tokenizer, "input", texts, handle.call_ids, owned=True)
    assert method.backend is not handle.tokenizer.backend_tokenizer and method.backend.truncation is None
    assert len(copies) == 1  # one copy, not a second one made and thrown away
