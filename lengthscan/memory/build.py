"""Random-initialised models and batches for validation (torch needed, imported inside)."""

from __future__ import annotations

import copy
import tempfile

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
    cls = getattr(transformers, HEAD_CLASSES[head])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[options.torch_dtype]
    if options.quantization is not None:  # bitsandbytes quantizes while from_pretrained loads the weights
        with tempfile.TemporaryDirectory() as folder:
            _save(cls.from_config(config), folder)
            model = cls.from_pretrained(folder, quantization_config=bnb_config(options.quantization), dtype=dtype,
                                        device_map="cpu", attn_implementation=attention)
    else:
        model = cls.from_config(config, attn_implementation=attention, dtype=dtype)
    if options.freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    prepared = options.quantization is not None and options.prepare_kbit
    if prepared:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=options.gradient_checkpointing)
    if options.adapter is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(options.adapter))
    if options.gradient_checkpointing:  # as the Trainer does once the model is built: non-reentrant (prepare_model_
        model.gradient_checkpointing_enable()  # for_kbit_training's own call leaves torch's default, reentrant)
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.train()


def _save(model, folder: str) -> None:
    """``save_pretrained`` on every process (under torch.distributed transformers writes on rank 0 only)."""
    import os

    from safetensors.torch import save_model

    model.config.save_pretrained(folder)
    save_model(model, os.path.join(folder, "model.safetensors"))


def bnb_config(q):
    """transformers' ``BitsAndBytesConfig`` for :class:`lengthscan.memory.quant.Quantization`."""
    from transformers import BitsAndBytesConfig

    names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    if q.four_bit:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.method,
                                  bnb_4bit_use_double_quant=q.double_quant,
                                  bnb_4bit_compute_dtype=names.get(q.compute_dtype or "f32"),
                                  bnb_4bit_quant_storage={**names, "u8": "uint8"}[q.quant_storage],
                                  llm_int8_skip_modules=list(q.skip) if q.skip is not None else None)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=q.threshold,
                              llm_int8_skip_modules=list(q.skip) if q.skip is not None else None)


def lora_config(lora):
    """peft's ``LoraConfig`` for :class:`lengthscan.memory.adapters.Lora`."""
    from peft import LoraConfig

    targets = lora.targets[0] if lora.regex or lora.all_linear else list(lora.targets)
    exclude = (lora.exclude[0] if lora.exclude_regex else list(lora.exclude)) if lora.exclude else None
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                      exclude_modules=exclude, modules_to_save=list(lora.modules_to_save) or None, bias=lora.bias,
                      use_dora=lora.use_dora, layers_to_transform=list(lora.layers_to_transform) or None,
                      layers_pattern=list(lora.layers_pattern) or None, task_type=lora.task_type)


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
