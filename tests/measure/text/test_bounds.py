"""Decide-only counting: the same decisions as a full count, with sound bounds, for every tokenizer."""

from __future__ import annotations

import json

import pytest

from lengthscan.measure.records import FLAG_OVER_BOUND, FLAG_OVER_PIECES, FLAG_WITHIN_BOUND
from lengthscan.measure.text.counter import TokenCounter
from tests.support.bpe_vocab import split_bpe
from tests.support.texts import EDGE_TEXTS


def _texts(corpus_rows):
    texts = [r["text"] for r in corpus_rows if r["text"] is not None]
    # NFKC turns each ligature into two letters, each vulgar fraction into three characters
    return texts + EDGE_TEXTS + ["ﬁ" * 300, "½ " * 400, "word " * 2000, "x" * 5000, None]


# every tokenizer x 4 limits over the whole corpus: the fast loop keeps one limit, the full run all four
@pytest.mark.parametrize("limit", [pytest.param(3, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow), 64,
                                   pytest.param(256, marks=pytest.mark.slow)])
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
        elif flags[i] in (FLAG_OVER_BOUND, FLAG_OVER_PIECES):
            assert limit < at_least[i] <= exact[i], (i, t[:40])
        else:
            assert lengths[i] == exact[i]


def test_shortcuts_are_used_where_proven(bpe_dir, wordpiece_dir, mistral_spm_dir, corpus_rows):
    texts = _texts(corpus_rows)
    for tok_dir in (bpe_dir, wordpiece_dir):
        counter = TokenCounter(str(tok_dir))
        _, flags, _, _ = counter.decide_count(texts, "input", 64)
        assert (flags == FLAG_WITHIN_BOUND).sum() > 100
        # most long texts are proven over from their pieces alone, without tokenizing
        over_pieces = (flags == FLAG_OVER_PIECES).sum()
        assert over_pieces > 50 and over_pieces > (flags == FLAG_OVER_BOUND).sum()
        proof = counter.bounds("input", [])
        assert proof.prefix_ok and proof.pieces
    # Llama-2 style SentencePiece: Metaspace without splitting: a prefix proves nothing there
    counter = TokenCounter(str(mistral_spm_dir))
    _, flags, _, _ = counter.decide_count(texts, "input", 64)
    proof = counter.bounds("input", [])
    assert not proof.prefix_ok and any("Metaspace" in r for r in proof.reasons)
    assert (flags == FLAG_OVER_BOUND).sum() == 0 and (flags == FLAG_OVER_PIECES).sum() == 0


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
    from lengthscan.measure.text.bounds import safe_cut

    assert safe_cut("ab ", 5) is None  # a trailing space is no cut
    assert safe_cut("ab c", 5) == 2 and safe_cut("ab cd ", 10) == 2
    assert safe_cut("a  b", 9) is None and safe_cut("abc", 2) is None


def _soup(rng, n: int) -> list[str]:
    """Random texts built to break a pieces bound: contractions in every case, digits inside words,
    punctuation runs, every kind of whitespace, control characters, non-ASCII letters, digits and
    punctuation, combining marks, compatibility characters NFKC expands, and added tokens."""
    atoms = ["'s", "'S", "'t", "'re", "'ll", "'d", "'m", "'ve", "''", "'", "it's", "O'Neil", "don't", "rock'n'roll",
             "abc", "Z", "x1", "1x", "123", "4.5", "a_b", "__init__", "(x)", "[]", "{}", "->", "...", "!?", "`",
             " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x7f", "\u00a0", "\u2028",
             "\u3000", "é", "e\u0301", "ß", "Ω", "中", "²", "٣", "Ⅻ", "½", "ﬁ", "ＡＢ", "—", "“", "😀", "\u200b",
             "<s>", "</s>", "<pad>", "<unk>"]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 120))) for _ in range(n)]


# the fast loop keeps GPT-2's rule; the full run every pre-tokenizer
@pytest.mark.parametrize("fixture, rule", [("bpe_dir", "gpt2"),
                                           pytest.param("claude_bpe_dir", "gpt2", marks=pytest.mark.slow),
                                           pytest.param("llama3_dir", "llama3", marks=pytest.mark.slow),
                                           pytest.param("qwen2_dir", "llama3", marks=pytest.mark.slow),
                                           pytest.param("wordpiece_dir", "bert", marks=pytest.mark.slow)])
def test_pieces_bound_never_exceeds_the_count(request, fixture, rule, corpus_rows):
    """The runs of a text never outnumber its tokens, on real texts and on 3,000 adversarial ones,
    checked against the tokenizer itself (the proof is structural; this is the test that can fail)."""
    import random

    counter = TokenCounter(str(request.getfixturevalue(fixture)))
    proof = counter.bounds("input", [])
    assert proof.pieces == rule and proof.to_dict()["pieces_lower_bound"] == rule
    # short ones where a wrong rule would overcount at once (one piece each, or one per word)
    tight = ["!\x1c!", ".\x7f.", "!\x0b!", "a\x85b", "x\u00a0y", "it's", "IT'S", "'s'd", "we'll've", "a'b'c",
             "x1y2", "é1", "1é", "!é!", "a\u0301b", "__x__", "a  b", " \n x", "a\r\nb", "<<s>>"]
    texts = [t for t in _texts(corpus_rows) if t] + tight + _soup(random.Random(7), 3000)
    exact, _ = counter.count(texts, "input")
    backend = counter.tokenizer.backend_tokenizer
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else None
    lower = proof.pieces_lower(texts, 1 << 20, normalize)
    bad = [(t[:60], lo, n) for t, lo, n in zip(texts, lower, exact) if lo > n]
    assert not bad, bad[:5]
    # the claim underneath: run starts never outnumber the pre-tokenizer's own pieces
    pieces = [len(backend.pre_tokenizer.pre_tokenize_str(normalize(t) if normalize else t)) for t in texts]
    bad = [(t[:60], lo - proof.specials, p) for t, lo, p in zip(texts, lower, pieces) if lo - proof.specials > p]
    assert not bad, bad[:5]
    assert (lower >= 0).sum() > 1000 and (lower >= 0.6 * exact).sum() > 500  # it bounds, and not trivially
    # and on prefixes (8 characters a token, cut at a space where there is a normalizer)
    for limit in (4, 16, 64):
        short = proof.pieces_lower(texts, limit, normalize)
        assert all(s <= n for s, n in zip(short, exact)) and (short > limit).sum() > 100


def test_pieces_bound_is_off_where_not_proven(unigram_dir, mistral_spm_dir, tmp_path, train_texts):
    for tok_dir in (unigram_dir, mistral_spm_dir):
        proof = TokenCounter(str(tok_dir)).bounds("input", [])
        assert proof is None or not proof.pieces
    # byte-level BPE behind a Split regex that is not one of the proven ones (a letter run may
    # take two leading characters here): no pieces bound
    split_bpe(tmp_path, train_texts, r"[^\r\n\p{L}\p{N}]{0,2}\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+", nfc=False)
    proof = TokenCounter(str(tmp_path)).bounds("input", [])
    assert proof is None or not proof.pieces
