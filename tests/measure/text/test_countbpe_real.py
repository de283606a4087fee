"""The count-only engine on real tiktoken-born vocabularies (GPT-2's r50k, cl100k, o200k, Llama 3,
Mistral's tekken) as transformers converts them, and DeepSeek's tokenizer.json (three splits:
refused): every row's count equals the tokenizer's own. Vocabulary files come from PyPI wheels
(tests/requirements-tokenizers.txt)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthscan.measure.text.countbpe.engine import build
from lengthscan.measure.text.countbpe.proof import Refused
from lengthscan.measure.text.counter import TokenCounter
from tests.support.bpe_vocab import ADVERSARIAL, converted_tokenizer, save_tokenizer_dir
from tests.support.reference import direct_counts
from tests.support.wheels import wheel_file

pytestmark = pytest.mark.slow


def _every_script(step: int = 7) -> list[str]:
    """Texts walking the whole code space (surrogates apart), words of 5 characters, with spaces,
    digits and apostrophes between, so every class of the split regexes is met."""
    points = [c for c in range(0x20, 0x110000, step) if not 0xD800 <= c <= 0xDFFF]
    words = ["".join(map(chr, points[i:i + 5])) for i in range(0, len(points), 5)]
    seps = [" ", "  ", "'s ", "1", "\n", " 12 ", "'T"]
    return [" ".join(w + seps[(i + j) % len(seps)] for j, w in enumerate(words[i:i + 40]))
            for i in range(0, len(words), 40)]


@pytest.mark.parametrize("name", ["r50k", "cl100k", "o200k", "llama3", "tekken"])
def test_tiktoken_born_vocabularies_count_exactly(name, tmp_path, docs):
    tok = converted_tokenizer(name)
    if tok is None:
        pytest.skip(f"{name}: its wheel is not installed (pip install --no-deps -r tests/requirements-tokenizers.txt)")
    texts = ADVERSARIAL + docs + _every_script()
    engine = build(tok, cache_dir=tmp_path / "countbpe")
    counts = engine.count(texts)
    expected = np.array([len(e) for e in tok.encode_batch_fast(texts, add_special_tokens=False)])
    taken = counts >= 0
    assert taken.mean() > 0.9, taken.mean()
    bad = np.flatnonzero(taken & (counts != expected))
    assert bad.size == 0, [(texts[i][:60], counts[i], expected[i]) for i in bad[:3]]
    out = save_tokenizer_dir(tok, tmp_path / name)
    counter = TokenCounter(str(out))
    some = ADVERSARIAL + docs[:300]
    assert list(counter.count(some, "input")[0]) == direct_counts(out, some, "input")
    assert counter.counting()["input"]["engine"].startswith("tiktoken")


def _folding_texts() -> list[str]:
    """Every character whose case forms reach ASCII letters (``ß``, ``İ``, ``ı``, ``ſ``, the Kelvin
    sign, the ligatures) after an apostrophe, before and inside contractions, in words."""
    from lengthscan.measure.text.countbpe.codepoints import _all_code_points, _ascii_folds

    odd = [chr(c) for c in _ascii_folds(_all_code_points())]
    out = []
    for c in odd:
        out += [f"it'{c} {c}'s x'{c}{c} '{c}e '{c}l DON'{c} {c}'{c.upper()}", f"Stra{c}e's gro{c}'LL {c}'T'{c}",
                f"'{c}", f"a'{c}d", f"{c}'re{c}'ve'm{c}"]
    return out + ["Die Straße ist groß, oder? İstanbul'un ılık havası; Maßstab's", "ſtraße'ſ K'ſ"]


@pytest.mark.parametrize("name", ["cl100k", "o200k", "llama3"])
def test_folding_characters_are_counted_by_the_engine(name, tmp_path):
    """The regexes' contractions (``(?i:'s|'t|...)``) match those characters alike in both regex
    engines (``codepoints._fold_differences``): German and Turkish text is counted by the engine,
    equal to the tokenizer."""
    tok = converted_tokenizer(name)
    if tok is None:
        pytest.skip(f"{name}: its wheel is not installed")
    texts = _folding_texts()
    counts = build(tok, cache_dir=tmp_path / "countbpe").count(texts)
    expected = [len(e) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
    assert (counts >= 0).all(), [t for t, c in zip(texts, counts) if c < 0][:3]
    assert counts.tolist() == expected


def test_deepseeks_three_splits_are_refused(tmp_path):
    path = wheel_file("litellm", "litellm_core_utils/tokenizers/deepseek_tokenizer.json")
    if path is None:
        pytest.skip("litellm's wheel is not installed")
    from tokenizers import Tokenizer

    assert len(json.loads(path.read_text())["pre_tokenizer"]["pretokenizers"]) == 4
    with pytest.raises(Refused, match="Split \\+ Split \\+ Split"):
        build(Tokenizer.from_file(str(path)), cache_dir=tmp_path)
