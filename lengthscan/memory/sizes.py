"""The sizes a memory estimate multiplies, checked before anything is built from them: a whole
number of at least 1, and below a bound far past any real model's.

A config with 10^9 layers (or a vocabulary of 10^12) is corrupt or hostile: transformers builds
per-layer lists and label maps from such values and the memory model traces every layer, so an
unchecked one takes gigabytes and hours. Each bound leaves a wide margin over the largest released
models (noted beside it), so no real config is refused.
"""

from __future__ import annotations

#: (fields, bound, what the bound counts, the largest real models' values)
BOUNDS = (
    (("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
      "decoder_layers", "decoder_sparse_step"), 1024, "layers in a stack", "the deepest real models have about 130"),
    (("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "encoder_ffn_dim",
      "decoder_ffn_dim", "ffn_dim", "hidden_dim", "dim", "embedding_size", "word_embed_proj_dim", "d_kv",
      "head_dim", "conv_dim", "moe_intermediate_size", "shared_expert_intermediate_size"), 1 << 20, "units in a layer",
     "the widest real models have about 75,000"),
    (("num_attention_heads", "num_key_value_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
      "decoder_attention_heads", "num_conv_pos_embedding_groups"), 1 << 16, "heads or groups",
     "real models have at most a few hundred"),
    (("num_local_experts", "num_experts", "num_experts_per_tok"), 1 << 16, "experts",
     "the largest real mixtures have a few hundred experts a layer"),
    (("vocab_size", "decoder_vocab_size", "type_vocab_size"), 1 << 24, "token ids",
     "the largest real vocabularies have about 260,000"),
    (("num_labels",), 1 << 20, "labels", "real classifiers have at most tens of thousands"),
    (("max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions"), 1 << 30,
     "positions", "the longest real contexts are about 10 million"),
    (("conv_kernel", "conv_stride", "num_conv_pos_embeddings", "conv_pos_kernel_size", "num_feat_extract_layers"),
     1024, "for a convolution's kernel, stride or layer count", "real speech encoders use at most 128"),
    (("num_mel_bins", "relative_attention_num_buckets", "num_buckets"), 1 << 16, "bins or buckets",
     "real models use at most a few hundred"),
)

#: field -> (bound, what it counts, the real models' values)
LIMITS = {name: (bound, what, real) for names, bound, what, real in BOUNDS for name in names}

#: The fields that must be at least 1 where present (a vocabulary of token types may be 0, Qwen2-MoE's dense
#: configs have 0 experts and no shared expert ...).
AT_LEAST_ONE = frozenset(LIMITS) - {"type_vocab_size", "num_labels", "num_experts", "shared_expert_intermediate_size"}

#: Entries of a per-layer list (``conv_dim``, ``conv_kernel``, ``conv_stride``) or a label map.
MAX_ENTRIES = 1024
MAX_LABELS = LIMITS["num_labels"][0]

#: A config.json larger than this is no model's config (real ones are a few kilobytes, a few MB
#: with a long label map).
MAX_CONFIG_BYTES = 64 << 20


def size_error(values: dict, where: str = "") -> str | None:
    """The first field of ``values`` (a config's dict, sub-configs included) that is no size or is
    past its bound, as a sentence naming the field, its value, the bound and why; None when all fit."""
    for key, value in values.items():
        if isinstance(value, dict):
            if key in ("id2label", "label2id") and len(value) > MAX_LABELS:
                return (f"the config's {where}{key} has {len(value):,} labels, past the bound of {MAX_LABELS:,} "
                        f"({LIMITS['num_labels'][2]}): a corrupt or hostile config")
            found = size_error(value, f"{where}{key}.")
            if found:
                return found
        elif key in LIMITS and value is not None:
            found = _field_error(f"{where}{key}", key, value)
            if found:
                return found
    return None


def _field_error(name: str, key: str, value) -> str | None:
    bound, what, real = LIMITS[key]
    items = value if isinstance(value, (list, tuple)) else [value]
    if isinstance(value, (list, tuple)) and len(items) > MAX_ENTRIES:
        return (f"the config's {name} has {len(items):,} entries, past the bound of {MAX_ENTRIES:,} (one a layer; "
                f"{real}): a corrupt or hostile config")
    low = 1 if key in AT_LEAST_ONE else 0
    for v in items:
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            return (f"the config's {name} is {_show(value)}; a model size must be a whole number of at least {low}")
        if v > bound:
            return (f"the config's {name} is {_show(value)}, past lengthscan's bound of {bound:,} {what} "
                    f"({real}): a corrupt or hostile config, refused before anything is built from it")
    return None


def _show(value) -> str:
    """The value as the message shows it: thousands separated, a long list cut short."""
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        return repr(value)[:60]
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 10 ** 30 else f"a {len(str(abs(value)))}-digit number"
    shown = ", ".join(_show(v) for v in value[:4])
    return f"[{shown}{', ...' if len(value) > 4 else ''}]"


def check_sizes(config, model: str = "") -> None:
    """``ModelError`` (exit 2) for a config (object or dict) with a size that is none or past its bound."""
    from lengthscan.policy.model_loading import ModelError

    values = config if isinstance(config, dict) else config.to_dict()
    found = size_error(values)
    if found:
        raise ModelError(f"{model}: {found}" if model else found)
