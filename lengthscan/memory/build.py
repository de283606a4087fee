"""Random-initialised models and batches for validation (torch needed, imported inside)."""

from __future__ import annotations

import copy

from lengthscan.memory.families import HEAD_CLASSES, model_input_samples, resolve_head
from lengthscan.memory.options import MemoryOptions, Shape


def build_model(config, options: MemoryOptions = MemoryOptions(), *, seed: int = 0):
    """A random-initialised model for ``config`` with the head :func:`resolve_head` picks."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = copy.deepcopy(config)
    for name in ("layerdrop", "encoder_layerdrop", "decoder_layerdrop"):  # LayerDrop skips layers at random:
        if getattr(config, name, 0):  # the prediction is for a step that runs them all (its worst case)
            setattr(config, name, 0.0)
    head = resolve_head(config, options.head)
    attention = {"flash": "sdpa"}.get(options.attention, options.attention)  # no flash kernel on CPU
    if config.model_type == "wavlm":  # its own attention (F.multi_head_attention_forward) whatever the setting
        attention = "eager"
    if config.model_type == "gemma2" and attention == "sdpa":  # no SDPA path (soft-capping): what transformers
        attention = "eager"  # picks by default, and what the memory model prices
    model = getattr(transformers, HEAD_CLASSES[head]).from_config(config, attn_implementation=attention)
    if options.freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    if options.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.train()


def make_batch(config, shape: Shape, options: MemoryOptions = MemoryOptions(), *, seed: int = 0) -> dict:
    """A collated batch of ``shape`` as the usual collators build it (random ids, full length)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    head = resolve_head(config, options.head)
    b = shape.batch_size
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", 1000)

    def ids(n):
        return torch.randint(4, vocab, (b, n), generator=g)

    def mask(n):
        m = torch.ones(b, n, dtype=torch.long)
        if shape.padding and b > 1:
            m[-1, n // 2:] = 0  # one short row: the padded batch makes the model build its attention masks
        return m

    if head == "whisper":
        frames = shape.input_len or 2 * config.max_source_positions
        return {"input_features": torch.randn(b, config.num_mel_bins, frames, generator=g),
                "labels": ids(shape.target_len or 1)}
    if head == "ctc":
        samples = model_input_samples(shape)
        batch = {"input_values": torch.randn(b, samples, generator=g)}
        if getattr(config, "feat_extract_norm", "group") == "layer" or shape.padding:
            batch["attention_mask"] = mask(samples)
        labels = torch.randint(1, vocab, (b, shape.target_len or 1), generator=g)
        if shape.padding and b > 1:
            labels[-1, (shape.target_len or 1) // 2:] = -100
        batch["labels"] = labels
        return batch
    s = shape.input_len
    batch = {"input_ids": ids(s), "attention_mask": mask(s)}
    if head == "seq2seq":
        labels = ids(shape.target_len or 1)
        if shape.padding and b > 1:
            labels[-1, (shape.target_len or 1) // 2:] = -100
        batch["labels"] = labels
    elif head == "causal_lm":
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        batch["labels"] = labels
    elif head == "masked_lm":
        batch["labels"] = batch["input_ids"].clone()
    else:  # sequence classification
        batch["labels"] = torch.randint(0, max(getattr(config, "num_labels", 2), 1), (b,), generator=g)
    return batch
