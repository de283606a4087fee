"""Gemma 2 and Gemma 3 (text): soft-capping, sliding-window layers, four norms a layer.

Both follow Gemma (scaled embeddings, ``(1 + weight)`` RMSNorm in fp32, GeGLU), with a norm after
attention and around the MLP (``pre_feedforward_layernorm``, ``post_feedforward_layernorm``) and
``config.layer_types`` alternating ``sliding_attention`` and ``full_attention`` layers, each with its
own mask. Gemma 2 soft-caps the attention scores (``attn_logit_softcapping``: transformers gives it no
SDPA path, so the Trainer's model runs eager attention, and ``sdpa`` is priced as eager; flash
kernels cap inside the kernel) and the logits (``final_logit_softcapping``). Gemma 3 adds q/k norms
and a RoPE table per layer type (a local base for sliding layers); it caps the logits when its
config asks, never the scores.
"""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.blocks import Attn, attention, causal_masks, gated_mlp, lm_loss
from lengthscan.memory.tape import Tape

GEMMA_TYPES = ("gemma2", "gemma3_text")


def attention_kind(c, requested: str) -> str:
    """The attention the model runs: Gemma 2 has no SDPA path (transformers falls back to eager)."""
    return "eager" if c.model_type == "gemma2" and requested == "sdpa" else requested


def notes(c, options) -> list[str]:
    """What an estimate of a Gemma 2 config should say about its attention."""
    if getattr(c, "model_type", None) != "gemma2" or options.attention != "sdpa":
        return []
    return ["gemma2 has no SDPA path in transformers (soft-capped scores): priced with the eager attention it runs, "
            "whose softmax is quadratic in the length; attention='flash' prices flash-attention kernels"]


def trace(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` with labels = inputs."""
    g3 = c.model_type == "gemma3_text"
    d, heads = c.hidden_size, c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    kinds = list(c.layer_types)[: c.num_hidden_layers]
    attn_impl = attention_kind(c, opts.attention)
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    h = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "model.embed_tokens")
    t.new(1, "f32", False, "buffers", held=True)  # embed_scale, multiplied .to(the weights' dtype): h keeps its dtype
    h = ops.scale(t, h)
    tables = sorted(set(kinds)) if g3 else ["one"]  # Gemma 3: a RoPE table per layer type present
    for _ in tables:
        t.new(head_dim // 2, "f32", False, "buffers", held=True)  # inv_freq
        t.new(head_dim // 2, "f32", False, "buffers", held=True)  # and its original copy
    # Gemma{2,3}TextModel.forward builds the masks of both types, whichever its layers use
    masks = causal_masks(t, batch, seq, attn_impl, padding,
                         {"full_attention": None, "sliding_attention": getattr(c, "sliding_window", None)})
    rotary = {kind: (t.new(seq * head_dim, h.dtype, False), t.new(seq * head_dim, h.dtype, False)) for kind in tables}
    a = Attn(d, heads, head_dim, kv_heads, getattr(c, "attention_bias", False), None,
             getattr(c, "attention_dropout", 0.0), names=("q_proj", "k_proj", "v_proj", "o_proj"))
    softcap = not g3 and getattr(c, "attn_logit_softcapping", None) is not None and attn_impl == "eager"
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}"
        cos, sin = rotary[kind if g3 else "one"]
        m = masks[kind]
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m, cos, sin])[0]
        x = ops.rms_norm(t, h, d, f"{name}.input_layernorm", plus_one=True)
        x = attention(t, x, None, a, f"{name}.self_attn", batch, seq, seq, attention=attn_impl, mask4d=m,
                      causal=True, rotary=(cos, sin), eager_softmax_fp32=True, softcap=softcap,
                      qk_norm=(head_dim, c.rms_norm_eps, True) if g3 else None)
        x = ops.rms_norm(t, x, d, f"{name}.post_attention_layernorm", plus_one=True)
        h = ops.binary(t, h, x)
        x = ops.rms_norm(t, h, d, f"{name}.pre_feedforward_layernorm", plus_one=True)
        x = gated_mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_activation)
        x = ops.rms_norm(t, x, d, f"{name}.post_feedforward_layernorm", plus_one=True)
        h = ops.binary(t, h, x)
        t.end_layer(h)
    h = ops.rms_norm(t, h, d, "model.norm", plus_one=True)
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)  # pad(labels, (0, 1)), then [..., 1:].contiguous()
    tie = "model.embed_tokens.weight" if getattr(c, "tie_word_embeddings", True) else None
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie,
                           softcap=getattr(c, "final_logit_softcapping", None) is not None)
    t.use(labels)
    t.finish(loss, keep=[logits, amask])
