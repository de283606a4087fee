"""The suite's one place for writing test data: JSON Lines, Parquet, tokenizers, audio and images.

Plain functions (no pytest): fixtures in ``conftest.py`` and tests call them. Everything is real:
JSON Lines and Parquet written with ``json``/pyarrow, tokenizers trained with ``tokenizers`` and
``sentencepiece``, audio written by libsndfile (``soundfile``), images drawn by Pillow.

- JSON Lines: ``write_jsonl`` (rows as given), ``numbered_jsonl`` (``n`` rows of one text pattern);
- Parquet: ``write_parquet`` (columns or a table);
- tokenizers: ``bpe_tokenizer``, ``wordpiece_tokenizer``, ``unigram_tokenizer``, ``t5_spm_tokenizer``,
  ``marian_tokenizer``, ``chat_tokenizer``, ``wheel_tokenizer`` (a file shipped in an installed wheel);
- audio: ``silent_wav`` (zeros), ``write_audio`` and the format matrix of ``tests/support/audio_files.py``;
- images: ``write_pictures`` and ``vision_dir`` (a vision model's folder) of ``tests/support/vision.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tests.support.audio_files import signal, write_audio, write_format_matrix  # noqa: F401  (re-exported)
from tests.support.chat import ADDED, chat_bpe
from tests.support.vision import vision_dir, write_pictures  # noqa: F401  (re-exported)
from tests.support.wheels import required_wheel_file

# -- JSON Lines --------------------------------------------------------------------------------------------


def jsonl_text(rows: Iterable[dict], *, ensure_ascii: bool = True) -> str:
    """The JSON Lines text of ``rows``: one ``json.dumps`` per row, each ending with a newline."""
    return "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in rows)


def write_jsonl(path, rows: Iterable[dict], *, ensure_ascii: bool = True) -> Path:
    """Write ``rows`` as JSON Lines (UTF-8) to ``path``; returns the path.

    ``ensure_ascii=False`` writes non-ASCII characters as themselves (as the corpus fixture and the
    chat tests do), the default escapes them as ``json.dumps`` does."""
    path = Path(path)
    path.write_text(jsonl_text(rows, ensure_ascii=ensure_ascii), encoding="utf-8")
    return path


def numbered_jsonl(path, n: int, text: str = "row {i} with a few words", column: str = "text") -> Path:
    """``n`` rows ``{column: text.format(i=i)}`` as JSON Lines."""
    return write_jsonl(path, ({column: text.format(i=i)} for i in range(n)))


# -- Parquet -----------------------------------------------------------------------------------------------


def write_parquet(path, data, **kwargs) -> Path:
    """Write ``data`` (a pyarrow Table or a dict of columns) to ``path`` with ``pq.write_table``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = data if isinstance(data, pa.Table) else pa.table(data)
    pq.write_table(table, path, **kwargs)
    return path


# -- audio -------------------------------------------------------------------------------------------------


def silent_wav(path, frames: int, rate: int = 16000, **kwargs) -> Path:
    """``frames`` frames of float zeros written by soundfile (WAV unless ``format=`` says otherwise)."""
    import numpy as np
    import soundfile as sf

    path = Path(path)
    sf.write(path, np.zeros(frames, dtype="float32"), rate, **kwargs)
    return path


# -- tokenizers --------------------------------------------------------------------------------------------


def _save_fast(tok, out: Path, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def bpe_tokenizer(out: Path, texts: list[str], vocab_size: int = 3000) -> Path:
    """Byte-level BPE with ``<s> $A </s>`` (RoBERTa/BART style), trained on ``texts``, saved in ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return _save_fast(tok, out, {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 256})


def wordpiece_tokenizer(out: Path, texts: list[str], vocab_size: int = 2000) -> Path:
    """BERT-style WordPiece: lowercasing, accent-stripping normalizer, ``[CLS] $A [SEP]``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return _save_fast(tok, out, {
        "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 512})


def unigram_tokenizer(out: Path, texts: list[str], vocab_size: int = 2000) -> Path:
    """SentencePiece-style Unigram: NFKC normalizer, Metaspace, ``$A </s>`` (T5 style)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return _save_fast(tok, out, {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>"})


def train_spm(texts: list[str], prefix: Path, vocab_size: int) -> Path:
    """A real SentencePiece unigram model trained on ``texts``: ``prefix.model``."""
    import sentencepiece as spm

    src = prefix.with_suffix(".txt")
    src.write_text("\n".join(t.replace("\n", " ") for t in texts if t.strip()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(src), model_prefix=str(prefix), vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, minloglevel=2)
    return prefix.with_suffix(".model")


def t5_spm_tokenizer(out: Path, texts: list[str]) -> Path:
    """A real SentencePiece model loaded as ``T5Tokenizer`` (transformers converts it to fast)."""
    out.mkdir(parents=True, exist_ok=True)
    model = train_spm(texts, out / "spm", 1500)
    model.rename(out / "spiece.model")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))
    return out


def marian_tokenizer(out: Path, texts: list[str]) -> Path:
    """A Marian tokenizer: separate source and target SentencePiece models (a real target mode)."""
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    src = train_spm(texts[::2], out / "src", 1200)
    tgt = train_spm([t.upper() for t in texts[1::2]], out / "tgt", 900)
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


def chat_tokenizer(out: Path, texts: list[str]) -> Path:
    """Byte-level BPE (GPT-2/Qwen style, no post-processor) whose added tokens are the control
    tokens of ChatML, Llama 3, Gemma and gpt-oss templates; EOS ``<|im_end|>``."""
    from tokenizers import AddedToken

    tok = chat_bpe(texts, 3000)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 2048}))
    return out


def wheel_tokenizer(out: Path, package: str, relative: str, name: str, config: dict) -> Path:
    """A tokenizer file shipped in an installed wheel (skipped where it is not installed), copied to
    ``out/name`` beside a ``tokenizer_config.json`` of ``config``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(required_wheel_file(package, relative).read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def gpt2_model(out: Path, tokenizer: Path | None = None, **config) -> Path:
    """A tiny GPT-2 config (no weights) saved in ``out``, with ``tokenizer``'s files beside it if given."""
    from transformers import GPT2Config

    GPT2Config(**{"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 500, **config}).save_pretrained(out)
    if tokenizer is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (out / name).write_text((tokenizer / name).read_text())
    return out
