"""Decoder-only models: Llama-like (Llama, Mistral, Qwen2, Qwen3: RoPE, RMSNorm, SwiGLU, grouped KV heads) and GPT-2."""

from __future__ import annotations

from . import ops
from .blocks import Attn, attention, gated_mlp, lm_loss, mask, mlp
from .tape import Tape

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
GPT2_TYPES = ("gpt2",)
OPT_TYPES = ("opt",)


def trace(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """``AutoModelForCausalLM`` with labels = inputs (transformers' ``ForCausalLMLoss``)."""
    if c.model_type in GPT2_TYPES:
        return _gpt2(t, c, batch, seq, opts, padding)
    if c.model_type in OPT_TYPES:
        return _opt(t, c, batch, seq, opts, padding)
    return _llama(t, c, batch, seq, opts, padding)


def _causal_mask(t: Tape, c, batch: int, seq: int, opts, padding: bool):
    window = getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None
    if opts.attention == "eager" or padding or (window and seq >= window):
        return mask(t, batch, seq, seq, opts.attention)
    return None  # SDPA's is_causal: no mask tensor


def _llama(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    mt, d = c.model_type, c.hidden_size
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    tie = "model.embed_tokens.weight" if getattr(c, "tie_word_embeddings", False) else None
    h = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "model.embed_tokens")
    t.new(head_dim // 2, "f32", False, "buffers", held=True)  # rotary inv_freq
    t.new(head_dim // 2, "f32", False, "buffers", held=True)  # and its original copy
    cos, sin = t.new(seq * head_dim, "f32", False), t.new(seq * head_dim, "f32", False)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    qkv_bias = mt == "qwen2" or getattr(c, "attention_bias", False)
    out_bias = mt != "qwen2" and getattr(c, "attention_bias", False)
    if mt == "mistral":
        qkv_bias = out_bias = False
    a = Attn(d, heads, head_dim, kv_heads, qkv_bias, out_bias, getattr(c, "attention_dropout", 0.0),
             names=("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp_bias = getattr(c, "mlp_bias", False)
    for i in range(c.num_hidden_layers):
        name = f"model.layers.{i}"
        t.begin_layer(i, opts.gradient_checkpointing, [h, m, cos, sin])
        x = ops.rms_norm(t, h, d, f"{name}.input_layernorm")
        x = attention(t, x, None, a, f"{name}.self_attn", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, rotary=(cos, sin), eager_softmax_fp32=True,
                      qk_norm=(head_dim, c.rms_norm_eps) if mt == "qwen3" else None)
        h = ops.binary(t, h, x)
        x = ops.rms_norm(t, h, d, f"{name}.post_attention_layernorm")
        x = gated_mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act, bias=mlp_bias)
        h = ops.binary(t, h, x)
        t.end_layer(h)
    h = ops.rms_norm(t, h, d, "model.norm")
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)  # pad(labels, (0, 1)), then [..., 1:].contiguous()
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.finish(loss, keep=[logits, amask])


def _gpt2(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    d = c.n_embd
    inner = c.n_inner or 4 * d
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    x = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "transformer.wte")
    pos_ids = t.new(seq, "i64", False)
    p = ops.embedding(t, pos_ids, seq, c.n_positions, d, "transformer.wpe")
    h = ops.dropout(t, ops.binary(t, x, p), c.embd_pdrop)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    a = Attn(d, c.n_head, d // c.n_head, dropout=c.attn_pdrop, names=("c_attn", "", "", "c_proj"))
    for i in range(c.n_layer):
        name = f"transformer.h.{i}"
        t.begin_layer(i, opts.gradient_checkpointing, [h, m])
        x = ops.layer_norm(t, h, d, f"{name}.ln_1", trainable=True)
        x = attention(t, x, None, a, f"{name}.attn", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, fused_qkv=True, eager_softmax_fp32=True)
        h = ops.binary(t, ops.dropout(t, x, c.resid_pdrop), h)
        x = ops.layer_norm(t, h, d, f"{name}.ln_2")
        x = mlp(t, x, d, inner, f"{name}.mlp", c.activation_function, names=("c_fc", "c_proj"))
        h = ops.binary(t, h, ops.dropout(t, x, c.resid_pdrop))
        t.end_layer(h)
    h = ops.layer_norm(t, h, d, "transformer.ln_f")
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)
    tie = "transformer.wte.weight" if getattr(c, "tie_word_embeddings", True) else None
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.finish(loss, keep=[logits, amask])


def _opt(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """OPT: learned positions (offset 2, numbered from the attention mask), pre- or post-LN, ReLU MLP."""
    d, emb = c.hidden_size, c.word_embed_proj_dim
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    bias = getattr(c, "enable_bias", True)
    affine = getattr(c, "layer_norm_elementwise_affine", True)
    x = ops.embedding(t, ids, batch * seq, c.vocab_size, emb, "model.decoder.embed_tokens")
    pos_ids = t.new(batch * seq, "i64", False)  # cumsum(attention_mask) * mask - 1 (+ 2)
    pos = ops.embedding(t, pos_ids, batch * seq, c.max_position_embeddings + 2, d, "model.decoder.embed_positions")
    if emb != d:
        x = ops.linear(t, x, emb, d, "model.decoder.project_in", False)
    h = ops.binary(t, x, pos)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    pre = c.do_layer_norm_before
    a = Attn(d, c.num_attention_heads, d // c.num_attention_heads, bias=bias, dropout=c.attention_dropout,
             q_scale=True)
    for i in range(c.num_hidden_layers):
        name = f"model.decoder.layers.{i}"
        t.begin_layer(i, opts.gradient_checkpointing, [h, m])
        for part in ("self_attn", "final"):
            residual = h
            x = _opt_norm(t, h, d, f"{name}.{part}_layer_norm", affine) if pre else h
            if part == "self_attn":
                x = attention(t, x, None, a, f"{name}.self_attn", batch, seq, seq, attention=opts.attention,
                              mask4d=m, causal=True)
            else:
                x = mlp(t, x, d, c.ffn_dim, name, c.activation_function, bias=bias)
            h = ops.binary(t, residual, ops.dropout(t, x, c.dropout))
            if not pre:
                h = _opt_norm(t, h, d, f"{name}.{part}_layer_norm", affine)
        t.end_layer(h)
    if pre and not getattr(c, "_remove_final_layer_norm", False):
        h = _opt_norm(t, h, d, "model.decoder.final_layer_norm", affine)
    if emb != d:
        h = ops.linear(t, h, d, emb, "model.decoder.project_out", False)
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)
    tie = "model.decoder.embed_tokens.weight" if getattr(c, "tie_word_embeddings", True) else None
    loss, logits = lm_loss(t, h, emb, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.finish(loss, keep=[logits, amask])


def _opt_norm(t: Tape, x, d: int, name: str, affine: bool):
    if affine:
        return ops.layer_norm(t, x, d, name)
    return ops.layer_norm(t, x, d, name, weightless=True)
