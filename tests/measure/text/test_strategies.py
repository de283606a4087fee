"""The counting strategies behind ``TokenCounter``, each against the tokenizer's own ``__call__``:
which one each role gets (``choice.RoleStrategies``), and that every one of them gives the same
counts and ids, so any of them may stand in for another."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from lengthscan.measure.text.counter import METHOD_CALL, METHOD_FAST, TokenCounter
from lengthscan.measure.text.decide import DecideOnly
from lengthscan.measure.text.strategies import CallCount, EngineCount, FastCount
from tests.support.reference import direct_counts


def _call_ids(tok_dir, texts, role):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    return [list(ids) for ids in (tok(text_target=texts) if role == "target" else tok(texts))["input_ids"]]


def test_each_role_gets_the_strategy_proven_for_it(bpe_dir, marian_dir, wordpiece_dir, docs):
    texts = docs[:100]
    auto = TokenCounter(str(bpe_dir))
    assert isinstance(auto.roles.exact("input", texts), EngineCount)  # byte-level BPE: the count-only engine
    assert isinstance(TokenCounter(str(bpe_dir), count_engine="tokenizers").roles.exact("input", texts), FastCount)
    assert isinstance(TokenCounter(str(wordpiece_dir)).roles.exact("input", texts), FastCount)  # no engine for it
    marian = TokenCounter(str(marian_dir))
    assert isinstance(marian.roles.exact("target", texts), CallCount)  # a separate target mode
    assert marian.roles.methods()["target"] == METHOD_CALL
    # one backend copy for every role on the fast path
    assert auto.roles.exact("target", texts).backend is auto.roles.exact("input", texts).backend


@pytest.mark.parametrize("role", ["input", "target"])
def test_every_strategy_gives_the_calls_counts_and_ids(bpe_dir, docs, role):
    """The three exact strategies of one tokenizer, side by side: counts and ids all equal
    ``__call__``'s, row by row (a length is what the model receives)."""
    texts = docs[:300] + ["", " ", "x" * 3000]
    counter = TokenCounter(str(bpe_dir))
    engine = counter.roles.exact(role, texts)
    assert isinstance(engine, EngineCount)
    fast = engine.fast
    call = CallCount(counter.handle.call_ids, role, "forced")
    expected_ids = _call_ids(bpe_dir, texts, role)
    expected = [len(ids) for ids in expected_ids]
    assert expected == direct_counts(bpe_dir, texts, role)
    for strategy in (call, fast, engine):
        assert strategy.count(texts).tolist() == expected, type(strategy).__name__
        assert strategy.ids(texts) == expected_ids, type(strategy).__name__
        assert strategy.count(texts).dtype == np.int64


def test_the_report_says_which_engine_counted_each_role(bpe_dir, marian_dir, docs):
    texts = docs[:50]
    auto = TokenCounter(str(bpe_dir), verify_counts=10)
    auto.count(texts, "input")
    entry = auto.counting()["input"]
    assert entry["engine"].startswith("tiktoken") and entry["texts"] + entry["by_tokenizer"] == len(texts)
    plain = TokenCounter(str(bpe_dir), count_engine="tokenizers")
    plain.count(texts, "input")
    assert plain.counting() == {"input": {"engine": "tokenizers", "reason": "--count-engine tokenizers"}}
    assert plain.methods() == {"input": METHOD_FAST}
    marian = TokenCounter(str(marian_dir))
    marian.count(texts, "target")
    assert marian.counting()["target"]["engine"] == "__call__"
    assert marian.counting()["target"]["reason"] == marian.roles.reasons()["target"]


def test_decide_only_wraps_the_exact_strategy(bpe_dir, docs):
    counter = TokenCounter(str(bpe_dir))
    decider = counter.decider("input", docs[:20])
    assert isinstance(decider, DecideOnly) and decider.exact is counter.roles.exact("input", [])
    assert decider.proof is counter.proof("input") and decider.proof.prefix_ok
    assert decider.exact.engine.counted == 0  # the proof's probes are no rows of the engine's tallies
    texts = docs[:200]
    exact = counter.count(texts, "input")[0]
    assert decider.count(texts).tolist() == exact.tolist()
    assert decider.describe() == decider.exact.describe() and decider.method == METHOD_FAST
    lengths, _, at_least, at_most = decider.decide(texts, 64, lambda t, rows: counter.count_strings(t, "input", rows))
    assert (at_most >= 0).sum() > 20 and (at_least >= 0).sum() > 20  # both shortcuts decided rows here
    assert (exact[at_most >= 0] <= at_most[at_most >= 0]).all() and (at_most[at_most >= 0] <= 64).all()
    assert (64 < at_least[at_least >= 0]).all() and (at_least[at_least >= 0] <= exact[at_least >= 0]).all()
    assert (lengths[lengths >= 0] == exact[lengths >= 0]).all()
    assert ((lengths >= 0) | (at_most >= 0) | (at_least >= 0)).all()  # every row measured or decided


def test_a_pickled_counter_chooses_again_and_counts_the_same(bpe_dir, docs):
    counter = TokenCounter(str(bpe_dir))
    before = counter.count(docs[:100], "input")[0]
    counter.decider("input", docs[:10])
    clone = pickle.loads(pickle.dumps(counter))
    assert clone.roles.methods() == {} and clone.proof("input") is None and not clone.loaded
    assert clone.roles.handle is clone.handle  # one tokenizer per worker, loaded once
    assert clone.roles.count_engine == "auto" and clone.max_chars == counter.max_chars
    assert np.array_equal(clone.count(docs[:100], "input")[0], before)
    assert clone.counting()["input"]["engine"] == counter.counting()["input"]["engine"]
