"""A chat tokenizer trained offline on real text, with the control tokens of current templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat import ADDED, SPECIAL


@pytest.fixture(scope="session")
def docs(corpus_rows) -> list[str]:
    return [r["text"] for r in corpus_rows if r["text"]][:2000]


@pytest.fixture(scope="session")
def chat_tok_dir(tmp_path_factory, train_texts) -> Path:
    """Byte-level BPE (GPT-2/Qwen style, no post-processor) whose added tokens are the control
    tokens of ChatML, Llama 3, Gemma and gpt-oss templates; EOS ``<|im_end|>``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=3000, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
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
