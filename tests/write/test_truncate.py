"""Truncation to a token limit, checked by direct ``AutoTokenizer`` calls on real tokenizers.

Every kept text must be a prefix of the original that re-tokenizes within the limit with the same
call as measuring (``tok(x)`` or ``tok(text_target=x)``), keep the target's EOS, and be locally
longest: the next cut point after it (a token boundary of the whole text; the next character for
slow tokenizers, which give no offsets) does not fit.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lengthscan.measure.text.counter import TokenCounter
from lengthscan.write.truncate import Truncated, TruncationError, truncate_texts

# Texts that break naive cutting: multi-byte characters, emoji (4 UTF-8 bytes, ZWJ sequences),
# combining marks, characters NFKC expands, CJK without spaces, long whitespace runs.
EDGE_TEXTS = [
    "naïve café – “quoted” déjà vu, señor Ærøskøbing. " * 12,
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇩🇪 ok " * 12,
    "e\u0301 combining A\u030a and o\u0308\u0301 marks " * 20,
    "ＡＢＣ ﬁ ½ Ⅻ ㎏ ﬃ ㍻ ｶﾀｶﾅ " * 20,
    "中文字符测试，日本語のテキスト。한국어문장입니다" * 12,
    "words   with\t\t\tlong     whitespace\n\n\n\n runs" + " " * 300 + "end " * 60,
    " " * 400 + "after a long run of leading spaces " * 8,
    "😀" * 150,
    "x" * 2500,
]
LIMITS = [3, 5, 8, 16, 64, 256]
ALL = ["bpe_dir", "wordpiece_dir", "unigram_dir", "t5_spm_dir", "marian_dir", "claude_bpe_dir", "mistral_spm_dir"]


@functools.cache
def _tokenizer(tok_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


def _ids(tok_dir, text: str, role: str) -> list[int]:
    """The reference: one plain call, exactly as lengths are measured."""
    tok = _tokenizer(str(tok_dir))
    return tok(text_target=text)["input_ids"] if role == "target" else tok(text)["input_ids"]


def _next_cut(tok_dir, text: str, kept: int, role: str) -> int:
    """The first token boundary of the whole text after ``kept`` characters (next char if no offsets)."""
    tok = _tokenizer(str(tok_dir))
    if not tok.is_fast:
        return kept + 1
    call = (lambda t, **kw: tok(text_target=t, **kw)) if role == "target" else tok
    spans = call(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    return min([p for span in spans for p in span if p > kept] + [len(text)])


def _check(tok_dir, texts, limits, role, results) -> list[int]:
    """Assert the contract for every text; returns limit - tokens of the truncated ones."""
    slack = []
    for text, limit, got in zip(texts, limits, results):
        assert isinstance(got, Truncated) and text.startswith(got.text)
        full = _ids(tok_dir, text, role)
        if len(full) <= limit:
            assert got == Truncated(text, len(full), 0)
            continue
        ids = _ids(tok_dir, got.text, role)
        assert len(ids) == got.tokens <= limit, (text[:40], limit, got)
        assert got.retokenized >= 1 and len(got.text) < len(text)
        eos = _tokenizer(str(tok_dir)).eos_token_id
        if eos is not None and full[-1] == eos:
            assert ids[-1] == eos, "the target lost its EOS"
        nxt = _next_cut(tok_dir, text, len(got.text), role)
        assert len(_ids(tok_dir, text[:nxt], role)) > limit, ("not locally longest", text[:40], limit, got)
        slack.append(limit - got.tokens)
    return slack


@pytest.mark.parametrize("fixture", ALL)
@pytest.mark.parametrize("role", ["input", "target"])
def test_prefix_fits_and_is_locally_longest(request, fixture, role, corpus_rows):
    tok_dir = request.getfixturevalue(fixture)
    docs = sorted((r["text"] for r in corpus_rows if r["text"]), key=len)[-400::16]  # the longest, spread
    texts = [t for t in docs + EDGE_TEXTS for _ in LIMITS]
    limits = LIMITS * (len(texts) // len(LIMITS))
    counter = TokenCounter(str(tok_dir))
    results = truncate_texts(counter, texts, limits, role)
    slack = _check(tok_dir, texts, limits, role, results)
    assert len(slack) > len(texts) // 2  # most of them really were cut
    # Not needlessly short: within 3 tokens of the limit, the most one character can cost beyond
    # the room left (a 4-byte character is 4 byte-level tokens); within 2 for ordinary prose.
    assert max(slack) <= 3
    prose = [s for t, lim, s in zip(texts, limits, slack) if t in docs]
    assert max(prose) <= 2 and np.mean(prose) < 0.5


@pytest.mark.parametrize("fixture", ["bpe_dir", "unigram_dir", "marian_dir"])
def test_texts_within_their_limits_come_back_unchanged(request, fixture):
    tok_dir = request.getfixturevalue(fixture)
    counter = TokenCounter(str(tok_dir))
    texts = ["short", "", "a somewhat longer text that will not fit in eight tokens, surely not"]
    got = truncate_texts(counter, texts, 8, "input")  # one limit for all
    assert got[0] == Truncated("short", len(_ids(tok_dir, "short", "input")), 0)
    assert got[1] == Truncated("", len(_ids(tok_dir, "", "input")), 0)
    assert got[2].retokenized > 0 and got[2].tokens <= 8
    per_text = truncate_texts(counter, texts, np.array([1000, 1000, 1000]), "input")
    assert [r.text for r in per_text] == texts


def test_limit_below_special_tokens_raises(bpe_dir, unigram_dir):
    counter = TokenCounter(str(bpe_dir))  # <s> $A </s>: even "" is 2 tokens
    with pytest.raises(TruncationError, match="limit 1 "):
        truncate_texts(counter, ["some text over the limit"], [1], "input")
    got = truncate_texts(counter, ["some text over the limit"], [2], "target")
    assert got[0].text == "" and got[0].tokens == 2
    with pytest.raises(TruncationError, match="limit 0 "):
        truncate_texts(TokenCounter(str(unigram_dir)), ["x y z"], [0], "target")  # $A </s>


def test_separate_target_vocabulary_is_used_for_targets(marian_dir, corpus_rows):
    """Marian is slow (no offsets) and has its own target vocabulary: both roles cut right."""
    texts = [r["summary"] for r in corpus_rows[:40] if r["summary"]]
    counter = TokenCounter(str(marian_dir))
    assert not counter.tokenizer.is_fast
    for role in ("input", "target"):
        _check(marian_dir, texts, [12] * len(texts), role, truncate_texts(counter, texts, [12] * len(texts), role))
    inputs = truncate_texts(counter, texts, [12] * len(texts), "input")
    targets = truncate_texts(counter, texts, [12] * len(texts), "target")
    assert [r.text for r in inputs] != [r.text for r in targets]


def test_texts_over_max_chars_are_cut_within_their_head(bpe_dir):
    counter = TokenCounter(str(bpe_dir), max_chars=300)
    text = "plain words again and again " * 40  # 1120 characters, counter will not count it whole
    fits_head, cut = truncate_texts(counter, [text, text], [1000, 16], "input")
    assert fits_head == Truncated(text[:300], len(_ids(bpe_dir, text[:300], "input")), 1)
    assert text.startswith(cut.text) and len(_ids(bpe_dir, cut.text, "input")) == cut.tokens == 16


def test_long_texts_and_token_free_runs(wordpiece_dir, bpe_dir):
    """Offsets are taken on a window that widens while it holds too few tokens (WordPiece makes no
    token of whitespace), and a long document is cut without being tokenized whole."""
    texts = [" " * 5000 + "words after a very long run of spaces " * 20, "word " * 40_000]
    for tok_dir in (wordpiece_dir, bpe_dir):
        got = truncate_texts(TokenCounter(str(tok_dir)), texts, [16, 64], "input")
        _check(tok_dir, texts, [16, 64], "input", got)
        assert got[1].tokens == 64 and max(r.retokenized for r in got) <= 6
        if tok_dir == wordpiece_dir:
            assert got[0].text.startswith(" " * 5000 + "words")


def test_non_strings_are_refused(bpe_dir):
    with pytest.raises(TypeError, match="position 1"):
        truncate_texts(TokenCounter(str(bpe_dir)), ["ok", None], [4, 4], "input")


class _SpikyCounter:
    """A counter without offsets whose count is the words in a prefix plus one, except at spikes:
    counts that are not monotone in prefix length, as normalizers and merges can make them."""

    max_chars = 10**6
    tokenizer = type("SlowTokenizer", (), {"is_fast": False})()

    def __init__(self, spikes: set[int]):
        self.spikes, self.calls = spikes, 0

    def count(self, texts, role):
        self.calls += 1
        counts = [len(t.split()) + 1 + (50 if len(t) in self.spikes else 0) for t in texts]
        return np.array(counts), np.zeros(len(texts), np.int8)


@pytest.mark.parametrize("spikes, kept", [
    (set(), 80),                       # 40 words + 1 special = 41 tokens (and the space after)
    ({77}, 80),                        # a shorter prefix over the limit does not stop the search
    ({79, 80}, 78),                    # the guess itself over: walk back one cut point
    (set(range(60, 80)), 59),          # a run of failing cut points: keep walking back
    (set(range(1, 200)), 0),           # nothing fits: the empty prefix, after bounded work
])
def test_search_survives_non_monotone_counts(spikes, kept):
    text = "w " * 100
    counter = _SpikyCounter(spikes)
    (got,) = truncate_texts(counter, [text], [41], "input")
    assert got.text == text[:kept] and got.tokens <= 41
    assert got.retokenized <= 64 + 16 and counter.calls < 70


@pytest.mark.parametrize("fixture", ["bpe_dir", "unigram_dir"])
def test_property_prefix_fits(request, fixture):
    tok_dir = request.getfixturevalue(fixture)
    counter = TokenCounter(str(tok_dir))
    empty = {role: len(_ids(tok_dir, "", role)) for role in ("input", "target")}

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=st.text(max_size=200), extra=st.integers(0, 40), role=st.sampled_from(["input", "target"]))
    def prop(text, extra, role):
        limit = empty[role] + extra
        (got,) = truncate_texts(counter, [text], [limit], role)
        assert text.startswith(got.text)
        assert len(_ids(tok_dir, got.text, role)) == got.tokens <= limit

    prop()
