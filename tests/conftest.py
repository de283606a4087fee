"""Real fixtures built offline: text from this Python's own docstrings, tokenizers trained on it
with ``tokenizers`` and ``sentencepiece``, and real data files written with datasets/pyarrow.

Nothing here needs the network; everything is built once per test session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import factories
from tests.support.bpe_vocab import split_bpe
from tests.support.texts import EDGE_TEXTS

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _docstrings(limit: int) -> list[dict]:
    from lengthscan.demo import docstring_rows

    rows = []
    for row in docstring_rows():
        rows.append(row)
        if len(rows) >= limit:
            break
    return rows


@pytest.fixture(scope="session")
def corpus_rows() -> list[dict]:
    """~2,500 real docstring/summary pairs plus edge cases (None, empty, non-ASCII)."""
    rows = [{"text": r["docstring"], "summary": r["summary"]} for r in _docstrings(2500)]
    for i, t in enumerate(EDGE_TEXTS):
        rows.insert(37 * (i + 1), {"text": t, "summary": EDGE_TEXTS[-1 - i]})
    rows.insert(5, {"text": None, "summary": "a summary without text"})
    rows.insert(11, {"text": "a text without summary", "summary": None})
    return rows


@pytest.fixture(scope="session")
def train_texts(corpus_rows) -> list[str]:
    return [r["text"] for r in corpus_rows if r["text"]][:1500] + EDGE_TEXTS


@pytest.fixture(scope="session")
def corpus_jsonl(tmp_path_factory, corpus_rows) -> Path:
    return factories.write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows, ensure_ascii=False)


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory, train_texts) -> Path:
    """Byte-level BPE with ``<s> $A </s>`` (RoBERTa/BART style)."""
    return factories.bpe_tokenizer(tmp_path_factory.mktemp("bpe"), train_texts)


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory, train_texts) -> Path:
    """BERT-style WordPiece: lowercasing, accent-stripping normalizer, ``[CLS] $A [SEP]``."""
    return factories.wordpiece_tokenizer(tmp_path_factory.mktemp("wordpiece"), train_texts)


@pytest.fixture(scope="session")
def unigram_dir(tmp_path_factory, train_texts) -> Path:
    """SentencePiece-style Unigram: NFKC normalizer, Metaspace, ``$A </s>`` (T5 style)."""
    return factories.unigram_tokenizer(tmp_path_factory.mktemp("unigram"), train_texts)


@pytest.fixture(scope="session")
def t5_spm_dir(tmp_path_factory, train_texts) -> Path:
    """A real SentencePiece model loaded as ``T5Tokenizer`` (transformers converts it to fast)."""
    return factories.t5_spm_tokenizer(tmp_path_factory.mktemp("t5spm"), train_texts)


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory, train_texts) -> Path:
    """A Marian tokenizer: separate source and target SentencePiece models (a real target mode)."""
    return factories.marian_tokenizer(tmp_path_factory.mktemp("marian"), train_texts)


@pytest.fixture(scope="session")
def bart_dir(tmp_path_factory) -> Path:
    """A tiny BART config (no weights): the model the ``lengthscan memory`` tests price."""
    from transformers import BartConfig

    out = tmp_path_factory.mktemp("bart")
    config = BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=3000,
                        max_position_embeddings=256)
    config.save_pretrained(out)
    return out


TOKENIZER_FIXTURES = ["bpe_dir", "wordpiece_dir", "unigram_dir", "t5_spm_dir", "marian_dir", "claude_bpe_dir",
                      "mistral_spm_dir"]


@pytest.fixture(params=TOKENIZER_FIXTURES)
def any_tokenizer_dir(request) -> Path:
    return request.getfixturevalue(request.param)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own length cache (outside its tmp_path, which may be a data directory),
    so tests never see each other's lengths."""
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path_factory.mktemp("lengthscan-cache")))


@pytest.fixture(scope="session")
def claude_bpe_dir(tmp_path_factory) -> Path:
    """Anthropic's byte-level BPE ``tokenizer.json`` (65k vocab) as a transformers directory."""
    return factories.wheel_tokenizer(tmp_path_factory.mktemp("claude"), "anthropic", "tokenizer.json", "tokenizer.json",
                                     {"tokenizer_class": "PreTrainedTokenizerFast"})


@pytest.fixture(scope="session")
def mistral_spm_dir(tmp_path_factory) -> Path:
    """Mistral-7B's SentencePiece model loaded as ``LlamaTokenizer`` with BOS, as Llama-2 models are."""
    return factories.wheel_tokenizer(tmp_path_factory.mktemp("mistral"), "mistral_common", "data/tokenizer.model.v1",
                                     "tokenizer.model", {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                                                         "add_eos_token": False})


@pytest.fixture(scope="session")
def docs(corpus_rows) -> list[str]:
    return [r["text"] for r in corpus_rows if r["text"]][:2000]


@pytest.fixture(scope="session")
def chat_tok_dir(tmp_path_factory, train_texts) -> Path:
    """Byte-level BPE (GPT-2/Qwen style, no post-processor) whose added tokens are the control
    tokens of ChatML, Llama 3, Gemma and gpt-oss templates; EOS ``<|im_end|>``."""
    return factories.chat_tokenizer(tmp_path_factory.mktemp("chat_tok"), train_texts)


@pytest.fixture(scope="session")
def chat_tok(chat_tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_tok_dir)


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory, train_texts):
    from lengthscan.measure.text.pieces import LLAMA3_PATTERNS

    pattern = next(p for p in LLAMA3_PATTERNS if "{1,3}" in p)
    return split_bpe(tmp_path_factory.mktemp("llama3"), train_texts, pattern, nfc=False)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory, train_texts):
    from lengthscan.measure.text.pieces import LLAMA3_PATTERNS

    pattern = next(p for p in LLAMA3_PATTERNS if "{1,3}" not in p)
    return split_bpe(tmp_path_factory.mktemp("qwen2"), train_texts, pattern, nfc=True)


@pytest.fixture(scope="session")
def qwen2_vl_dir(tmp_path_factory, train_texts) -> Path:
    """A Qwen2-VL model folder (tokenizer, preprocessor_config.json, processor_config.json); tests only read it."""
    return factories.vision_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl", train_texts[:400])
