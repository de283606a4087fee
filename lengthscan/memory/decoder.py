"""Decoder-only models: Llama-like (Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3: RoPE, RMSNorm, gated MLP, grouped KV
heads), GPT-2, OPT and GPT-NeoX."""

from __future__ import annotations

from lengthscan.memory import decoder_gemma, decoder_moe, ops
from lengthscan.memory.blocks import Attn, attention, fused_gated_mlp, gated_mlp, lm_loss, mask, mlp
from lengthscan.memory.tape import Tape

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")
GPT2_TYPES = ("gpt2",)
OPT_TYPES = ("opt",)
NEOX_TYPES = ("gpt_neox",)


def trace(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """``AutoModelForCausalLM`` with labels = inputs (transformers' ``ForCausalLMLoss``)."""
    if c.model_type in decoder_gemma.GEMMA_TYPES:
        return decoder_gemma.trace(t, c, batch, seq, opts, padding)
    if c.model_type in decoder_moe.MOE_TYPES:
        return decoder_moe.trace(t, c, batch, seq, opts, padding)
    if c.model_type in GPT2_TYPES:
        return _gpt2(t, c, batch, seq, opts, padding)
    if c.model_type in OPT_TYPES:
        return _opt(t, c, batch, seq, opts, padding)
    if c.model_type in NEOX_TYPES:
        return _neox(t, c, batch, seq, opts, padding)
    return _llama(t, c, batch, seq, opts, padding)


def _causal_mask(t: Tape, c, batch: int, seq: int, opts, padding: bool):
    window = getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None
    if opts.attention == "eager" or padding or (window and seq >= window):
        return mask(t, batch, seq, seq, opts.attention)
    return None  # SDPA's is_causal: no mask tensor


def _rotary_fraction(c, default: float) -> float:
    """``partial_rotary_factor`` (``rope_parameters``, else the config's own or legacy ``rotary_pct``)."""
    rope = getattr(c, "rope_parameters", None) or {}
    return rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", getattr(c, "rotary_pct", default)))


def _llama(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    mt, d = c.model_type, c.hidden_size
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    tie = "model.embed_tokens.weight" if getattr(c, "tie_word_embeddings", False) else None
    h = embeds = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "model.embed_tokens")
    gemma, phi3 = mt == "gemma", mt == "phi3"
    if gemma:  # embeddings * embed_scale.to(weight dtype) (a 0-dim buffer): a new tensor of the embeddings' dtype
        t.new(1, "f32", False, "buffers", held=True)
        h = ops.scale(t, h)
    part = _rotary_fraction(c, 1.0) if phi3 else 1.0  # Phi-3 rotates the first part of each head
    rot = int(head_dim * part)
    t.new(rot // 2, "f32", False, "buffers", held=True)  # rotary inv_freq
    t.new(rot // 2, "f32", False, "buffers", held=True)  # and its original copy
    # the rotary embedding returns cos and sin .to(the hidden states' dtype): the embeddings'
    cos, sin = t.new(seq * rot, h.dtype, False), t.new(seq * rot, h.dtype, False)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    qkv_bias = mt == "qwen2" or getattr(c, "attention_bias", False)
    out_bias = mt != "qwen2" and getattr(c, "attention_bias", False)
    if mt in ("mistral", "phi3"):
        qkv_bias = out_bias = False
    a = Attn(d, heads, head_dim, kv_heads, qkv_bias, out_bias, getattr(c, "attention_dropout", 0.0),
             names=("qkv_proj" if phi3 else "q_proj", "k_proj", "v_proj", "o_proj"), sliced_qkv=phi3,
             head_major=phi3)  # Phi-3's rotary cat makes q head-major contiguous
    resid_p = getattr(c, "resid_pdrop", 0.0) if phi3 else 0.0
    mlp_bias = getattr(c, "mlp_bias", False)
    for i in range(c.num_hidden_layers):
        name = f"model.layers.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m, cos, sin])[0]
        x = ops.rms_norm(t, h, d, f"{name}.input_layernorm", plus_one=gemma)
        x = attention(t, x, None, a, f"{name}.self_attn", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, rotary=(cos, sin), eager_softmax_fp32=True, fused_qkv=phi3,
                      rotary_part=rot / head_dim if phi3 else None,
                      qk_norm=(head_dim, c.rms_norm_eps) if mt == "qwen3" else None)
        h = ops.binary(t, h, ops.dropout(t, x, resid_p))
        x = ops.rms_norm(t, h, d, f"{name}.post_attention_layernorm", plus_one=gemma)
        if phi3:
            x = fused_gated_mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act)
        else:
            x = gated_mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act, bias=mlp_bias)
        h = ops.binary(t, h, ops.dropout(t, x, resid_p))
        t.end_layer(h)
    t.use(embeds)  # the model's forward holds inputs_embeds through its layers
    h = ops.rms_norm(t, h, d, "model.norm", plus_one=gemma)
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)  # pad(labels, (0, 1)), then [..., 1:].contiguous()
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.use(h)  # outputs.last_hidden_state lives until the model's forward returns
    t.finish(loss, keep=[logits, amask])


def _gpt2(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    d = c.n_embd
    inner = c.n_inner or 4 * d
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    x = x_embeds = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "transformer.wte")
    pos_ids = t.new(seq, "i64", False)
    p = ops.embedding(t, pos_ids, seq, c.n_positions, d, "transformer.wpe")
    h = ops.dropout(t, ops.binary(t, x, p), c.embd_pdrop)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    a = Attn(d, c.n_head, d // c.n_head, dropout=c.attn_pdrop, names=("c_attn", "", "", "c_proj"))
    for i in range(c.n_layer):
        name = f"transformer.h.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m])[0]
        x = ops.layer_norm(t, h, d, f"{name}.ln_1", trainable=True)
        x = attention(t, x, None, a, f"{name}.attn", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, fused_qkv=True, eager_softmax_fp32=True)
        h = ops.binary(t, ops.dropout(t, x, c.resid_pdrop), h)
        x = ops.layer_norm(t, h, d, f"{name}.ln_2")
        x = mlp(t, x, d, inner, f"{name}.mlp", c.activation_function, names=("c_fc", "c_proj"))
        h = ops.binary(t, h, ops.dropout(t, x, c.resid_pdrop))
        t.end_layer(h)
    t.use(x_embeds)  # GPT2Model.forward holds inputs_embeds and position_embeds through its layers
    t.use(p)
    h = ops.layer_norm(t, h, d, "transformer.ln_f")
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)
    tie = "transformer.wte.weight" if getattr(c, "tie_word_embeddings", True) else None
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.use(h)  # outputs.last_hidden_state lives until the model's forward returns
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
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m])[0]
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
    t.use(h)  # outputs.last_hidden_state lives until the model's forward returns
    t.finish(loss, keep=[logits, amask])


def _opt_norm(t: Tape, x, d: int, name: str, affine: bool):
    if affine:
        return ops.layer_norm(t, x, d, name)
    return ops.layer_norm(t, x, d, name, weightless=True)


def _neox(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """GPT-NeoX: fused per-head qkv, partial RoPE, LayerNorm, GELU MLP, parallel (or sequential) residual."""
    d, heads = c.hidden_size, c.num_attention_heads
    head_dim = d // heads
    rot = int(head_dim * _rotary_fraction(c, 0.25))
    ids, amask = t.input(batch * seq), t.input(batch * seq)
    h = ops.embedding(t, ids, batch * seq, c.vocab_size, d, "gpt_neox.embed_in")
    h = ops.dropout(t, h, getattr(c, "hidden_dropout", 0.0))
    t.new(rot // 2, "f32", False, "buffers", held=True)  # rotary inv_freq
    t.new(rot // 2, "f32", False, "buffers", held=True)  # and its original copy
    cos, sin = t.new(seq * rot, h.dtype, False), t.new(seq * rot, h.dtype, False)  # .to(the hidden states' dtype)
    m = _causal_mask(t, c, batch, seq, opts, padding)
    bias = getattr(c, "attention_bias", True)
    a = Attn(d, heads, head_dim, bias=bias, dropout=getattr(c, "attention_dropout", 0.0),
             names=("query_key_value", "", "", "dense"), head_major=True)  # the rotary cat: q head-major
    p = getattr(c, "hidden_dropout", 0.0)
    for i in range(c.num_hidden_layers):
        name = f"gpt_neox.layers.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m, cos, sin])[0]
        x = ops.layer_norm(t, h, d, f"{name}.input_layernorm")
        x = attention(t, x, None, a, f"{name}.attention", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, rotary=(cos, sin), eager_softmax_fp32=True, fused_qkv=True,
                      rotary_part=rot / head_dim)
        attn = ops.dropout(t, x, p)
        if c.use_parallel_residual:  # mlp(ln2(h)) + attn + h
            x = ops.layer_norm(t, h, d, f"{name}.post_attention_layernorm")
            x = ops.dropout(t, mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act,
                                   names=("dense_h_to_4h", "dense_4h_to_h")), p)
            h = ops.binary(t, ops.binary(t, x, attn), h)
        else:
            attn = ops.binary(t, attn, h)
            x = ops.layer_norm(t, attn, d, f"{name}.post_attention_layernorm")
            x = ops.dropout(t, mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act,
                                   names=("dense_h_to_4h", "dense_4h_to_h")), p)
            h = ops.binary(t, x, attn)
        t.end_layer(h)
    h = ops.layer_norm(t, h, d, "gpt_neox.final_layer_norm")
    labels = t.input(batch * seq)
    shifted = t.new(batch * (seq + 1), "i64", False)
    tie = "gpt_neox.embed_in.weight" if getattr(c, "tie_word_embeddings", False) else None
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * seq, shifted, tie=tie)
    t.use(labels)
    t.use(h)  # outputs.last_hidden_state lives until the model's forward returns
    t.finish(loss, keep=[logits, amask])
