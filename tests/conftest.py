"""Real fixtures built offline: text from this Python's own docstrings, tokenizers trained on it
with ``tokenizers`` and ``sentencepiece``, and real data files written with datasets/pyarrow.

Nothing here needs the network; everything is built once per test session.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.bpe_vocab import split_bpe
from tests.support.chat import ADDED, chat_bpe
from tests.support.texts import EDGE_TEXTS
from tests.support.wheels import required_wheel_file

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
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for row in corpus_rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _save_fast(tok, out: Path, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory, train_texts) -> Path:
    """Byte-level BPE with ``<s> $A </s>`` (RoBERTa/BART style)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return _save_fast(tok, tmp_path_factory.mktemp("bpe"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 256})


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory, train_texts) -> Path:
    """BERT-style WordPiece: lowercasing, accent-stripping normalizer, ``[CLS] $A [SEP]``."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(train_texts, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return _save_fast(tok, tmp_path_factory.mktemp("wordpiece"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 512})


@pytest.fixture(scope="session")
def unigram_dir(tmp_path_factory, train_texts) -> Path:
    """SentencePiece-style Unigram: NFKC normalizer, Metaspace, ``$A </s>`` (T5 style)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(train_texts, trainers.UnigramTrainer(
        vocab_size=2000, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return _save_fast(tok, tmp_path_factory.mktemp("unigram"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>"})


def _train_spm(texts: list[str], prefix: Path, vocab_size: int) -> Path:
    import sentencepiece as spm

    src = prefix.with_suffix(".txt")
    src.write_text("\n".join(t.replace("\n", " ") for t in texts if t.strip()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(src), model_prefix=str(prefix), vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, minloglevel=2)
    return prefix.with_suffix(".model")


@pytest.fixture(scope="session")
def t5_spm_dir(tmp_path_factory, train_texts) -> Path:
    """A real SentencePiece model loaded as ``T5Tokenizer`` (transformers converts it to fast)."""
    out = tmp_path_factory.mktemp("t5spm")
    model = _train_spm(train_texts, out / "spm", 1500)
    model.rename(out / "spiece.model")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))
    return out


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory, train_texts) -> Path:
    """A Marian tokenizer: separate source and target SentencePiece models (a real target mode)."""
    import sentencepiece as spm

    out = tmp_path_factory.mktemp("marian")
    src = _train_spm(train_texts[::2], out / "src", 1200)
    tgt = _train_spm([t.upper() for t in train_texts[1::2]], out / "tgt", 900)
    src.rename(out / "source.spm")
    tgt.rename(out / "target.spm")
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for model in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(out / model))
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    return out


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
    out = tmp_path_factory.mktemp("claude")
    (out / "tokenizer.json").write_bytes(required_wheel_file("anthropic", "tokenizer.json").read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


@pytest.fixture(scope="session")
def mistral_spm_dir(tmp_path_factory) -> Path:
    """Mistral-7B's SentencePiece model loaded as ``LlamaTokenizer`` with BOS, as Llama-2 models are."""
    out = tmp_path_factory.mktemp("mistral")
    (out / "tokenizer.model").write_bytes(required_wheel_file("mistral_common", "data/tokenizer.model.v1").read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False}))
    return out


@pytest.fixture(scope="session")
def docs(corpus_rows) -> list[str]:
    return [r["text"] for r in corpus_rows if r["text"]][:2000]


@pytest.fixture(scope="session")
def chat_tok_dir(tmp_path_factory, train_texts) -> Path:
    """Byte-level BPE (GPT-2/Qwen style, no post-processor) whose added tokens are the control
    tokens of ChatML, Llama 3, Gemma and gpt-oss templates; EOS ``<|im_end|>``."""
    from tokenizers import AddedToken

    tok = chat_bpe(train_texts, 3000)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED])
    out = tmp_path_factory.mktemp("chat_tok")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 2048}))
    return out


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
