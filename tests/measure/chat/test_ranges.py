"""Token ranges read with ``char_to_token`` equal the full offsets' overlap counts, on real
tokenizers (byte-level BPE, SentencePiece with byte fallback, WordPiece) and texts that split
characters across tokens (emoji, CJK, combining marks)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lengthscan.measure.chat.ranges import TokenRanges, offsets_count
from tests.support.texts import EDGE_TEXTS


@pytest.mark.parametrize("tok", ["chat_tok_dir", "mistral_spm_dir", "claude_bpe_dir", "wordpiece_dir", "unigram_dir"])
def test_ranges_equal_offsets(request, tok, docs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(tok))
    rng = random.Random(5)
    texts = [" ".join(rng.sample(EDGE_TEXTS[2:] + docs[:50], 4)) for _ in range(40)]
    agree = disagree = 0
    for text in texts:
        enc = tokenizer(text, add_special_tokens=False).encodings[0]
        off = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        ranges = TokenRanges(enc, len(text))
        for _ in range(30):
            a = rng.randrange(len(text) + 1)
            b = min(len(text), a + rng.randrange(1, 80))
            lo, hi = ranges.tokens(a, b)
            expected = int(((off[:, 1] > a) & (off[:, 0] < b)).sum()) if off.size else 0
            agree += hi - lo == expected
            disagree += hi - lo != expected
        spans = sorted({tuple(sorted(rng.sample(range(len(text) + 1), 2))) for _ in range(3)})
        spans = [s for k, s in enumerate(spans) if k == 0 or s[0] >= spans[k - 1][1]]
        assert ranges.count(spans) == offsets_count(enc.offsets, spans)
    assert disagree == 0 and agree == 40 * 30, (agree, disagree)
