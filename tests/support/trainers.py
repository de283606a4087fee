"""TRL's own trainers built on CPU as references for the preference and RL tests: a tokenizer from
a test folder with the template the row renders with (a pad token where it has none), a tiny random
Llama (the preparations never run it), and the CPU options every TRL config needs here."""

from __future__ import annotations

import tempfile


def trainer_tokenizer(folder, template: str | None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_llama(tok, *, scoring: bool = False):
    """A one-layer random Llama over ``tok``'s vocabulary (``scoring``: a one-label sequence classifier)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         **({"num_labels": 1, "pad_token_id": tok.pad_token_id} if scoring else {}))
    return (LlamaForSequenceClassification if scoring else LlamaForCausalLM)(config)


def cpu_config(config_class, **options):
    """``config_class`` (DPOConfig, GRPOConfig...) for a CPU run in a scratch folder, without bf16 or
    gradient checkpointing (on by default in TRL)."""
    return config_class(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none",
                        gradient_checkpointing=False, **options)


def with_row_ids(rows: list[dict]):
    """The rows as a ``datasets.Dataset`` with a ``row`` column: prepared rows are matched by it
    (the trainers filter some out)."""
    from datasets import Dataset

    return Dataset.from_list([{**r, "row": i} for i, r in enumerate(rows)])
