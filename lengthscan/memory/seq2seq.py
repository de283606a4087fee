"""Encoder-decoder text models: BART-like (BART, mBART, PLBART, Pegasus, Marian, Blenderbot) and T5-like."""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.blocks import Attn, attention, gated_mlp, lm_loss, mask, mlp
from lengthscan.memory.tape import Tape, Tensor

T5_TYPES = ("t5", "mt5")

_PRE_LN = {"mbart", "pegasus", "blenderbot"}
_LN_EMBEDDING = {"bart", "mbart", "plbart", "blenderbot-small"}
_FINAL_LN = {"mbart", "pegasus", "blenderbot"}
_SINUSOIDAL = {"pegasus", "marian"}  # frozen position tables
_BATCH_POSITIONS = {"bart", "mbart", "plbart"}  # position ids expanded to the batch before the lookup
_OFFSET2 = {"bart", "mbart", "plbart"}


def trace_bart(t: Tape, c, batch: int, src: int, tgt: int, opts, padding: bool) -> None:
    """BartForConditionalGeneration and its relatives, as modeling_bart.py runs them in training."""
    mt = c.model_type
    d, vocab = c.d_model, c.vocab_size
    ids, amask, labels = t.input(batch * src), t.input(batch * src), t.input(batch * tgt)
    dec_ids = t.new(batch * tgt, "i64", False)  # shift_tokens_right(labels)
    shared = "model.shared.weight"
    tie = shared if getattr(c, "tie_word_embeddings", True) else None
    t.param(shared, vocab * d)  # untied, the stacks and lm_head get their own and shared goes unused
    ckpt = opts.gradient_checkpointing
    enc_mask = mask(t, batch, src, src, opts.attention) if padding else None
    h, embeds = _embed(t, c, ids, batch, src, "model.encoder")
    for i in range(c.encoder_layers):
        h = t.begin_layer(i, ckpt, [h, enc_mask])[0]
        h = _layer(t, c, h, None, batch, src, src, f"model.encoder.layers.{i}", opts, enc_mask, False)
        t.end_layer(h)
    for e in embeds:  # the stack's locals
        t.use(e)
    if mt in _FINAL_LN:
        h = ops.layer_norm(t, h, d, "model.encoder.layer_norm")
    enc = h
    self_mask = mask(t, batch, tgt, tgt, opts.attention) if opts.attention == "eager" else None
    cross_mask = mask(t, batch, tgt, src, opts.attention) if padding else None
    h, embeds = _embed(t, c, dec_ids, batch, tgt, "model.decoder")
    for i in range(c.decoder_layers):
        layer = c.encoder_layers + i
        h, enc_in = t.begin_layer(layer, ckpt, [h, enc, self_mask, cross_mask], cast=(0, 1))[:2]
        h = _layer(t, c, h, enc_in, batch, tgt, src, f"model.decoder.layers.{i}", opts, self_mask, True, cross_mask)
        t.end_layer(h)
    for e in embeds:  # the stack's locals
        t.use(e)
    if mt in _FINAL_LN:
        h = ops.layer_norm(t, h, d, "model.decoder.layer_norm")
    t.use(enc)
    out_vocab = getattr(c, "decoder_vocab_size", None) or vocab  # Marian's target vocabulary
    if tie and mt == "marian" and not getattr(c, "share_encoder_decoder_embeddings", True):
        tie = "model.decoder.embed_tokens.weight"
    loss, logits = lm_loss(t, h, d, out_vocab, batch * tgt, labels, tie=tie, bias_buffer=True, upcast=False)
    t.use(h)  # outputs[0], the decoder's last hidden state, lives until the forward returns
    t.finish(loss, keep=[logits, enc, amask])


def _embed(t: Tape, c, ids, batch: int, n: int, name: str):
    """The stack's input: its hidden states, and the tensors the stack's locals hold until it returns
    (``inputs_embeds`` and the position embeddings, (batch, n, d) when the positions are expanded)."""
    mt, d = c.model_type, c.d_model
    tie = "model.shared.weight" if getattr(c, "tie_word_embeddings", True) else None
    if mt == "marian" and not getattr(c, "share_encoder_decoder_embeddings", True) and name.endswith("decoder"):
        tie = None  # Marian's separate target vocabulary
    x = ops.scale(t, ops.embedding(t, ids, batch * n, getattr(c, "decoder_vocab_size", None) or c.vocab_size
                                   if name.endswith("decoder") else c.vocab_size, d, f"{name}.embed_tokens", tie=tie))
    rows = c.max_position_embeddings + (2 if mt in _OFFSET2 else 0)
    if mt in _BATCH_POSITIONS:
        pos_ids = t.new(batch * n, "i64", False)  # (arange + offset).expand(batch, -1)
        pos = ops.embedding(t, pos_ids, batch * n, rows, d, f"{name}.embed_positions")
    else:
        pos_ids = t.new(n, "i64", False)
        pos = ops.embedding(t, pos_ids, n, rows, d, f"{name}.embed_positions", trainable=mt not in _SINUSOIDAL)
    if mt == "blenderbot-small" and name.endswith("decoder"):
        x = ops.layer_norm(t, x, d, f"{name}.layernorm_embedding")
        h = ops.binary(t, x, pos)
    else:
        h = ops.binary(t, x, pos)
        if mt in _LN_EMBEDDING:
            h = ops.layer_norm(t, h, d, f"{name}.layernorm_embedding")
    return ops.dropout(t, h, c.dropout), (x, pos)


def _layer(t: Tape, c, h, enc, batch, q_len, src, name, opts, self_mask, decoder, cross_mask=None):
    d = c.d_model
    pre = c.model_type in _PRE_LN
    heads = c.decoder_attention_heads if decoder else c.encoder_attention_heads
    ffn = c.decoder_ffn_dim if decoder else c.encoder_ffn_dim
    a = Attn(d, heads, d // heads, dropout=c.attention_dropout)
    blocks = [("self_attn", None, self_mask, decoder)]
    if decoder:
        blocks.append(("encoder_attn", enc, cross_mask, False))
    for part, kv, m, causal in blocks:
        residual = h
        x = ops.layer_norm(t, h, d, f"{name}.{part}_layer_norm") if pre else h
        k_len = src if kv is not None else q_len
        x = attention(t, x, kv, a, f"{name}.{part}", batch, q_len, k_len, attention=opts.attention, mask4d=m,
                      causal=causal)
        h = ops.binary(t, residual, ops.dropout(t, x, c.dropout))
        if not pre:
            h = ops.layer_norm(t, h, d, f"{name}.{part}_layer_norm")
            t.use(residual)  # the Python variable keeps it until it is reassigned
    residual = h
    x = ops.layer_norm(t, h, d, f"{name}.final_layer_norm") if pre else h
    x = mlp(t, x, d, ffn, name, c.activation_function, act_dropout=c.activation_dropout)
    h = ops.binary(t, residual, ops.dropout(t, x, c.dropout))
    if not pre:
        h = ops.layer_norm(t, h, d, f"{name}.final_layer_norm")
        t.use(residual)
    return h


def trace_t5(t: Tape, c, batch: int, src: int, tgt: int, opts, padding: bool) -> None:
    """T5ForConditionalGeneration (T5, mT5): RMSNorm, relative position biases, tied ``lm_head``.

    SDPA receives the position bias as a float mask that needs a gradient; PyTorch's fused
    kernels on CPU cannot produce one, so SDPA runs its math path (the attention matrix is kept),
    as measured; CUDA's memory-efficient kernel would keep less.
    """
    d = c.d_model
    ids, amask, labels = t.input(batch * src), t.input(batch * src), t.input(batch * tgt)
    dec_ids = t.new(batch * tgt, "i64", False)  # _shift_right(labels)
    t.param("shared.weight", c.vocab_size * d)
    ckpt = opts.gradient_checkpointing
    enc_mask = mask(t, batch, src, src, opts.attention) if padding else None
    embeds = ops.embedding(t, ids, batch * src, c.vocab_size, d, "encoder.embed_tokens", tie="shared.weight")
    h = ops.dropout(t, embeds, c.dropout_rate)
    bias = _t5_bias(t, c, src, src, "encoder.block.0.layer.0.SelfAttention")
    for i in range(c.num_layers):
        h = t.begin_layer(i, ckpt, [h, enc_mask, bias])[0]
        h = _t5_block(t, c, h, None, batch, src, src, f"encoder.block.{i}", opts, enc_mask, bias, None, None)
        t.end_layer(h)
    t.use(embeds)  # T5Stack's inputs_embeds lives until the stack returns
    enc = ops.dropout(t, ops.rms_norm(t, h, d, "encoder.final_layer_norm"), c.dropout_rate)
    n_dec = c.num_decoder_layers if c.num_decoder_layers is not None else c.num_layers
    self_mask = mask(t, batch, tgt, tgt, opts.attention) if opts.attention == "eager" else None
    cross_mask = mask(t, batch, tgt, src, opts.attention) if padding else None
    # the decoder stack's config keeps use_cache=True (a copy made before the Trainer turns it off): outside
    # checkpointed training it fills a KV cache (a copy of every key and value) that lives until the forward returns
    cache = None if t.grad and ckpt else []
    embeds = ops.embedding(t, dec_ids, batch * tgt, c.vocab_size, d, "decoder.embed_tokens", tie="shared.weight")
    h = ops.dropout(t, embeds, c.dropout_rate)
    bias = _t5_bias(t, c, tgt, tgt, "decoder.block.0.layer.0.SelfAttention")
    # zeros: cross-attention has no relative bias; without autocast, of the hidden states' dtype (the query's);
    # under autocast measured as fp32 (the (batch, heads, q, k) mask made of it is fp32 on CPU)
    cross_bias = t.new(c.num_heads * tgt * src, t.low or h.dtype, ckpt)
    if not padding and not ckpt:
        # unpadded, the encoder's attention mask still reaches cross-attention, as an additive fp32 (batch, 1, 1,
        # src): the first layer's bias plus it, made contiguous, is the (batch, heads, tgt, src) bias every layer
        # reuses (measured on CPU; the checkpointed and padded paths were measured as modelled below)
        extended = t.new(batch * src, "f32", False)
        summed = t.new(batch * c.num_heads * tgt * src, t.promote(cross_bias, extended), False)
        t.node([cross_bias, extended], [summed], [])
        cross_bias = ops.copy(t, summed)
    for i in range(n_dec):
        layer = c.num_layers + i
        h, enc_in = t.begin_layer(layer, ckpt, [h, enc, self_mask, cross_mask, bias, cross_bias], cast=(0, 1))[:2]
        h = _t5_block(t, c, h, enc_in, batch, tgt, src, f"decoder.block.{i}", opts, self_mask, bias, cross_mask,
                      cross_bias, cache)
        t.end_layer(h)
    t.use(embeds)
    h = ops.dropout(t, ops.rms_norm(t, h, d, "decoder.final_layer_norm"), c.dropout_rate)
    if getattr(c, "scale_decoder_outputs", True):
        h = ops.scale(t, h)
    t.use(enc)
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * tgt, labels, tie="shared.weight", upcast=False)
    t.finish(loss, keep=[logits, enc, amask], hold=cache or [])


def _t5_bias(t: Tape, c, q_len: int, k_len: int, name: str) -> Tensor:
    """compute_bias: bucket ids (kept by the embedding), the lookup, a (heads, q, k) view."""
    buckets = t.new(q_len * k_len, "i64", False)
    return ops.embedding(t, buckets, q_len * k_len, c.relative_attention_num_buckets, c.num_heads,
                         f"{name}.relative_attention_bias")


def _t5_block(t: Tape, c, h, enc, batch, q_len, src, name, opts, self_mask, bias, cross_mask, cross_bias,
              cache: list | None = None):
    d, inner = c.d_model, c.num_heads * c.d_kv
    parts = [("0.SelfAttention", None, self_mask, bias, enc is not None)]
    if enc is not None:
        parts.append(("1.EncDecAttention", enc, cross_mask, cross_bias, False))
    for part, kv, m, pb, causal in parts:
        layer = f"{name}.layer.{part.split('.')[0]}"
        x = ops.rms_norm(t, h, d, f"{layer}.layer_norm")
        k_len = src if kv is not None else q_len
        kv_in = x if kv is None else kv
        attn = f"{name}.layer.{part}"
        q = ops.linear(t, x, d, inner, f"{attn}.q", False)
        k = ops.linear(t, kv_in, d, inner, f"{attn}.k", False)
        v = ops.linear(t, kv_in, d, inner, f"{attn}.v", False)
        if cache is not None:  # DynamicLayer.update: torch.cat onto an empty tensor, a copy of each
            cache += [_cache_copy(t, k), _cache_copy(t, v)]
        out = _t5_attend(t, c, q, k, v, pb, m, batch, q_len, k_len, opts, causal)
        x = ops.linear(t, out, inner, d, f"{attn}.o", False)
        h = ops.binary(t, h, ops.dropout(t, x, c.dropout_rate))
    ff = f"{name}.layer.{2 if enc is not None else 1}"
    x = ops.rms_norm(t, h, d, f"{ff}.layer_norm")
    if c.is_gated_act:
        x = gated_mlp(t, x, d, c.d_ff, f"{ff}.DenseReluDense", c.dense_act_fn, names=("wi_0", "wi_1", "wo"),
                      act_dropout=c.dropout_rate)
    else:
        x = mlp(t, x, d, c.d_ff, f"{ff}.DenseReluDense", c.dense_act_fn, bias=False, act_dropout=c.dropout_rate,
                names=("wi", "wo"))
    return ops.binary(t, h, ops.dropout(t, x, c.dropout_rate))


def _cache_copy(t: Tape, x: Tensor) -> Tensor:
    out = t.new(x.numel, x.dtype, False)
    t.node([x], [out], [])
    return out


def _t5_attend(t: Tape, c, q, k, v, pb, m, batch, q_len, k_len, opts, causal):
    """Attention with the relative position bias added to the scores (eager, or SDPA's math path)."""
    heads = c.num_heads
    scores_n = batch * heads * q_len * k_len
    if opts.attention != "eager":
        if pb.requires_grad or m is not None or causal:  # the bias becomes a float mask per call
            if m is not None or causal:
                mm = m if m is not None else t.new(q_len * k_len, "bool", False)
                # (1, heads, q, k) + (batch, 1, q, k): the sum broadcasts to (batch, heads, q, k)
                n = heads * q_len * k_len * (batch if mm.numel >= batch * q_len * k_len else 1)
                out = t.new(n, t.promote(pb, mm), pb.requires_grad)
                t.node([pb, mm], [out], [])
                pb = ops.copy(t, out)  # .contiguous(): the sum follows the permuted bias' strides
            else:
                pb = ops.copy(t, pb)  # .contiguous() of the permuted bias
        if not pb.requires_grad:
            return _flash(t, q, k, v, pb, batch * heads * q_len)
        # the math path: reduced-precision inputs are upcast to fp32 on CPU, the output cast back to theirs
        back = q.dtype
        q, k, v = t.cast(q, "f32"), t.cast(k, "f32"), t.cast(v, "f32")
        qs, ks = ops.scale(t, q), ops.scale(t, k)  # q and k times sqrt(scale)
        scores = t.new(scores_n, "f32", ops.needs_grad(qs, ks))
        t.node([qs, ks], [scores], [qs, ks])
        probs = ops.softmax(t, ops.binary(t, scores, pb))
        out = t.new(q.numel, "f32", ops.needs_grad(probs, v))
        t.node([probs, v], [out], [probs, v])
        return ops.copy(t, t.cast(out, back))
    else:
        dtype = t.compute(q, k)
        qc, kc = t.cast(q, dtype), t.cast(k, dtype)
        scores = t.new(scores_n, dtype, ops.needs_grad(qc, kc))
        t.node([qc, kc], [scores], [qc, kc])
        scores = ops.binary(t, ops.scale(t, scores), pb)
        if m is not None:
            scores = ops.binary(t, scores, m)
        probs = ops.dropout(t, ops.softmax(t, scores), c.dropout_rate)
    dtype = t.compute(probs, v)
    pc, vc = t.cast(probs, dtype), t.cast(v, dtype)
    out = t.new(q.numel, dtype, ops.needs_grad(pc, vc))
    t.node([pc, vc], [out], [pc, vc])
    return ops.copy(t, out)


def _flash(t: Tape, q, k, v, bias, rows: int):
    dtype = t.compute(q, k, v)
    q, k, v = t.cast(q, dtype), t.cast(k, dtype), t.cast(v, dtype)
    if bias is not None and t.low and bias.dtype not in ("bool", dtype):  # autocast casts the float mask too
        bias = t.cast(bias, dtype)
    out = t.new(q.numel, dtype, ops.needs_grad(q, k, v))
    lse = t.new(rows, "f32", False)
    t.node([q, k, v], [out], [q, k, v, out, lse, bias])
    return out
