"""Decide-only counting: the same decisions as a full count, with sound bounds, for every tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthscan.records import FLAG_OVER_BOUND, FLAG_WITHIN_BOUND
from lengthscan.tokens import TokenCounter
from tests.conftest import EDGE_TEXTS


def _texts(corpus_rows):
    texts = [r["text"] for r in corpus_rows if r["text"] is not None]
    # NFKC turns each ligature into two letters, each vulgar fraction into three characters
    return texts + EDGE_TEXTS + ["ﬁ" * 300, "½ " * 400, "word " * 2000, "x" * 5000, None]


@pytest.mark.parametrize("limit", [3, 8, 64, 256])
def test_decisions_equal_a_full_count_and_bounds_are_sound(any_tokenizer_dir, corpus_rows, limit):
    counter = TokenCounter(str(any_tokenizer_dir))
    texts = _texts(corpus_rows)
    exact, _ = counter.count(texts, "input")
    lengths, flags, at_least, at_most = counter.decide_count(texts, "input", limit)
    for i, t in enumerate(texts):
        if t is None:
            continue
        if flags[i] == FLAG_WITHIN_BOUND:
            assert exact[i] <= at_most[i] <= limit, (i, t[:40])
        elif flags[i] == FLAG_OVER_BOUND:
            assert limit < at_least[i] <= exact[i], (i, t[:40])
        else:
            assert lengths[i] == exact[i]


def test_shortcuts_are_used_where_proven(bpe_dir, wordpiece_dir, mistral_spm_dir, corpus_rows):
    texts = _texts(corpus_rows)
    for tok_dir in (bpe_dir, wordpiece_dir):
        counter = TokenCounter(str(tok_dir))
        _, flags, _, _ = counter.decide_count(texts, "input", 64)
        assert (flags == FLAG_WITHIN_BOUND).sum() > 100 and (flags == FLAG_OVER_BOUND).sum() > 50
        assert counter.bounds("input", []).prefix_ok
    # Llama-2 style SentencePiece: Metaspace without splitting: a prefix proves nothing there
    counter = TokenCounter(str(mistral_spm_dir))
    _, flags, _, _ = counter.decide_count(texts, "input", 64)
    proof = counter.bounds("input", [])
    assert not proof.prefix_ok and any("Metaspace" in r for r in proof.reasons)
    assert (flags == FLAG_OVER_BOUND).sum() == 0


def test_nfkc_expansion_is_bounded_on_the_normalized_text(tmp_path, train_texts):
    """3 bytes of '½' become 3 characters under NFKC: a bound on the raw bytes would be wrong."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(train_texts + ["1 ⁄ 2 fi"], trainers.WordPieceTrainer(
        vocab_size=500, special_tokens=["[UNK]"], show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                "unk_token": "[UNK]"}))
    counter = TokenCounter(str(tmp_path))
    texts = ["½" * 40, "ﬁ" * 40, "a½b" * 30]
    exact, _ = counter.count(texts, "input")
    _, flags, _, at_most = counter.decide_count(texts, "input", 100)
    assert all(exact[i] <= at_most[i] for i in range(3) if flags[i] == FLAG_WITHIN_BOUND)
    assert exact[0] > 40  # the raw length would have been a false bound


def test_safe_cut_needs_a_character_on_both_sides():
    from lengthscan.bounds import safe_cut

    assert safe_cut("ab ", 5) is None  # a trailing space is no cut
    assert safe_cut("ab c", 5) == 2 and safe_cut("ab cd ", 10) == 2
    assert safe_cut("a  b", 9) is None and safe_cut("abc", 2) is None
