"""Speech models: Wav2Vec2-like encoders (WavLM's gated relative position bias too) with a CTC head, and Whisper."""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.blocks import Attn, attention, lm_loss, mask, mlp
from lengthscan.memory.ops import op_kind
from lengthscan.memory.tape import Tape, Tensor

WAV2VEC2_TYPES = ("wav2vec2", "hubert", "wavlm", "data2vec-audio")
_PREFIXES = {"hubert": "hubert", "wavlm": "wavlm", "data2vec-audio": "data2vec_audio"}


def _layer_norm_convs(c) -> bool:
    """LayerNorm after every feature convolution (Data2VecAudio always) rather than one GroupNorm."""
    return c.model_type == "data2vec-audio" or c.feat_extract_norm == "layer"


def feature_lengths(c, samples: int) -> list[int]:
    """Frames after each convolution of the feature encoder (``_get_feat_extract_output_lengths``)."""
    lengths, n = [], samples
    for k, s in zip(c.conv_kernel, c.conv_stride):
        n = (n - k) // s + 1
        lengths.append(n)
    return lengths


def trace_wav2vec2(t: Tape, c, batch: int, samples: int, tgt: int, opts, padding: bool) -> None:
    """``Wav2Vec2ForCTC`` (HuBERT, Data2VecAudio alike): conv feature encoder, transformer, CTC loss."""
    mt = c.model_type
    prefix = _PREFIXES.get(mt, "wav2vec2")
    frozen = opts.freeze_feature_encoder
    values = t.input(batch * samples, "f32")
    with_mask = getattr(c, "feat_extract_norm", "group") == "layer" or padding  # as make_batch
    amask = t.input(batch * samples) if with_mask else None
    lengths = feature_lengths(c, samples)
    frames = lengths[-1]
    x = Tensor(values.numel, "f32", not frozen, values.storage)  # input_values[:, None].requires_grad = True
    ckpt = opts.gradient_checkpointing and not frozen  # the conv layers are checkpointed layers too
    x = _features(t, c, x, batch, lengths, prefix, frozen, ckpt)
    d = c.hidden_size
    if getattr(c, "feat_proj_layer_norm", True):
        x = ops.layer_norm(t, x, c.conv_dim[-1], f"{prefix}.feature_projection.layer_norm")
    h = ops.linear(t, x, c.conv_dim[-1], d, f"{prefix}.feature_projection.projection")
    return _rest(t, c, h, batch, frames, d, prefix, opts, padding, with_mask, tgt, amask)


@op_kind("activations_feature_encoder")
def _features(t: Tape, c, x, batch: int, lengths: list, prefix: str, frozen: bool, ckpt: bool):
    """The convolutional feature encoder (checkpointed layer by layer with gradient checkpointing)."""
    channels = 1
    for i, (dim, k, n) in enumerate(zip(c.conv_dim, c.conv_kernel, lengths)):
        name = f"{prefix}.feature_extractor.conv_layers.{i}"
        x = t.begin_layer(-1 - i, ckpt, [x])[0]
        layer_norm = _layer_norm_convs(c)
        x = ops.conv1d(t, x, channels, dim, k, batch, n, f"{name}.conv", bias=c.conv_bias, trainable=not frozen,
                       strided_grad=layer_norm, strided_input=layer_norm and i > 0)
        if layer_norm:  # over channels: the conv output transposed
            x = ops.layer_norm(t, x, dim, f"{name}.layer_norm", trainable=not frozen, strided=True)
        elif i == 0:
            x = ops.group_norm(t, x, dim, batch * dim, f"{name}.layer_norm", trainable=not frozen)
        x = ops.activation(t, x, c.feat_extract_activation)
        t.end_layer(x)
        channels = dim
    return x


def _rest(t: Tape, c, h, batch, frames, d, prefix, opts, padding, with_mask, tgt, amask) -> None:
    h = ops.dropout(t, h, c.feat_proj_dropout)
    if c.mask_time_prob > 0 or c.mask_feature_prob > 0:
        spec = t.param(f"{prefix}.masked_spec_embed", d)
        if getattr(c, "apply_spec_augment", True) and c.mask_time_prob > 0:
            # hidden_states[mask] = masked_spec_embed: in place; keeps the (batch x frames) mask
            out = Tensor(h.numel, h.dtype, True, h.storage)
            t.node([h, spec], [out], [t.new(batch * frames, "bool", False)])
            h = out
    if with_mask:
        t.new(batch * frames * d, "bool", False)  # attention_mask.unsqueeze(-1).repeat(...): a transient
    m = mask(t, batch, frames, frames, opts.attention) if padding else None
    h = _encoder(t, c, h, batch, frames, d, f"{prefix}.encoder", opts, m)
    h = ops.dropout(t, h, c.final_dropout)
    with t.scope("logits_loss"):
        logits = ops.linear(t, h, d, c.vocab_size, "lm_head")
        logp = ops.softmax(t, logits, log=True)  # log_softmax(logits, dtype=float32)
        labels = t.input(batch * tgt)
        alpha = t.new(batch * frames * (2 * tgt + 1), "f32", False)  # ctc_loss keeps log_alpha
        loss = t.new(1, "f32", True)
        t.node([logp], [loss], [logp, alpha, labels], workspace=batch * frames * (2 * tgt + 1) * 4)
    t.finish(loss, keep=[logits, amask])


def _encoder(t: Tape, c, h, batch: int, frames: int, d: int, name: str, opts, m):
    stable = getattr(c, "do_stable_layer_norm", False)
    groups = c.num_conv_pos_embedding_groups
    if c.model_type == "data2vec-audio":
        h = ops.binary(t, h, _data2vec_positions(t, c, h, batch, frames, d, f"{name}.pos_conv_embed"))
    else:
        k = c.num_conv_pos_embeddings
        pos = f"{name}.pos_conv_embed.conv"
        g = t.param(f"{pos}.parametrizations.weight.original0", k)
        v = t.param(f"{pos}.parametrizations.weight.original1", d * d // groups * k)
        w = t.new(v.numel, "f32", True)  # torch._weight_norm(v, g, dim=2): keeps v, g and the norms
        t.node([v, g], [w], [v, g, t.new(k, "f32", False)])
        out_len = frames + (1 if k % 2 == 0 else 0)
        p = ops.conv1d(t, h, d, d, k, batch, out_len, pos, groups=groups, weight=w)
        p = ops.copy(t, ops.activation(t, p, c.feat_extract_activation), batch * frames * d)
        h = ops.binary(t, h, p)
    if not stable:
        h = ops.layer_norm(t, h, d, f"{name}.layer_norm")
    h = ops.dropout(t, h, c.hidden_dropout)
    a = Attn(d, c.num_attention_heads, d // c.num_attention_heads, dropout=c.attention_dropout,
             names=("q_proj", "k_proj", "v_proj", "out_proj"))
    wavlm, bias = c.model_type == "wavlm", None
    for i in range(c.num_hidden_layers):
        layer = f"{name}.layers.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m, bias])[0]
        x = ops.layer_norm(t, h, d, f"{layer}.layer_norm") if stable else h
        if wavlm:
            x, bias = _wavlm_attention(t, c, x, bias, batch, frames, d, f"{layer}.attention")
        else:
            x = attention(t, x, None, a, f"{layer}.attention", batch, frames, frames, attention=opts.attention,
                          mask4d=m, causal=False)
        attn_residual = h  # a local variable until the layer returns
        h = ops.binary(t, h, ops.dropout(t, x, c.hidden_dropout))
        if not stable:
            h = ops.layer_norm(t, h, d, f"{layer}.layer_norm")
        x = ops.layer_norm(t, h, d, f"{layer}.final_layer_norm") if stable else h
        x = mlp(t, x, d, c.intermediate_size, f"{layer}.feed_forward", c.hidden_act, act_dropout=c.activation_dropout,
                names=("intermediate_dense", "output_dense"))
        h = ops.binary(t, h, ops.dropout(t, x, c.hidden_dropout))
        if not stable:
            h = ops.layer_norm(t, h, d, f"{layer}.final_layer_norm")
        t.use(attn_residual)
        t.end_layer(h)
    if stable:
        h = ops.layer_norm(t, h, d, f"{name}.layer_norm")
    return h


def _data2vec_positions(t: Tape, c, h, batch: int, frames: int, d: int, name: str):
    """Data2VecAudio: ``num_conv_pos_embeddings`` grouped convolutions, each with an affine-free LayerNorm
    over channels (the output transposed) and the activation."""
    k = c.conv_pos_kernel_size
    p = h
    for j in range(c.num_conv_pos_embeddings):
        layer = f"{name}.layers.{j}"
        p = ops.conv1d(t, p, d, d, k, batch, frames + (1 if k % 2 == 0 else 0), f"{layer}.conv",
                       groups=c.num_conv_pos_embedding_groups, strided_grad=True)
        p = ops.layer_norm(t, p, d, f"{layer}.layer_norm", weightless=True, strided=True)
        p = ops.activation(t, p, c.feat_extract_activation)
    return p


@op_kind("activations_attention")
def _wavlm_attention(t: Tape, c, x, bias, batch: int, frames: int, d: int, name: str):
    """WavLM: a gated relative position bias (the first layer's, repeated per row, reused by the others)
    added inside ``F.multi_head_attention_forward`` (eager, attention weights returned); returns (out, bias)."""
    heads = c.num_attention_heads
    hd, scores_n = d // heads, batch * heads * frames * frames
    if bias is None:  # compute_bias: bucket ids, rel_attn_embed, permute, repeat(bsz, 1, 1, 1)
        buckets = t.new(frames * frames, "i64", False)
        values = ops.embedding(t, buckets, frames * frames, c.num_buckets, heads, f"{name}.rel_attn_embed")
        bias = ops.copy(t, values, scores_n)
    g = ops.linear(t, x, hd, 8, f"{name}.gru_rel_pos_linear")  # per head: (batch, heads, frames, 8)
    pairs = t.new(g.numel // 4, g.dtype, g.requires_grad)  # view(..., 2, 4).sum(-1)
    t.node([g], [pairs], [])
    g = ops.unary(t, pairs, "output")  # sigmoid
    const = t.param(f"{name}.gru_rel_pos_const", heads)
    gate_a, gate_b = ops.split(t, g, (1, 1))
    gate = ops.unary(t, ops.binary(t, gate_a, ops.unary(t, ops.binary(t, gate_b, const, saves=True)), saves=True))
    gated = ops.binary(t, gate, bias, saves=True)
    # the input is hidden_states.transpose(0, 1): each projection folds it to 2-D, a copy its matmul keeps
    q = ops.scale(t, ops.linear(t, _folded(t, x), d, d, f"{name}.q_proj"))  # q * scaling (need_weights=True)
    k = ops.linear(t, _folded(t, x), d, d, f"{name}.k_proj")
    v = ops.linear(t, _folded(t, x), d, d, f"{name}.v_proj")
    dtype = t.compute(q, k)
    qc, kc, gc = t.cast(q, dtype), t.cast(k, dtype), t.cast(gated, dtype)
    scores = t.new(scores_n, dtype, qc.requires_grad or kc.requires_grad or gc.requires_grad)  # baddbmm(bias, q, k^T)
    t.node([qc, kc, gc], [scores], [qc, kc])
    probs = ops.dropout(t, ops.softmax(t, scores), c.attention_dropout)
    dtype = t.compute(probs, v)
    pc, vc = t.cast(probs, dtype), t.cast(v, dtype)
    out = t.new(batch * frames * d, dtype, pc.requires_grad or vc.requires_grad)
    t.node([pc, vc], [out], [pc, vc])
    out = ops.linear(t, ops.copy(t, out), d, d, f"{name}.out_proj")
    mean = t.new(probs.numel // heads, probs.dtype, probs.requires_grad)  # the weights' mean over heads (dropped)
    t.node([probs], [mean], [])
    t.use(mean)
    return out, bias


def _folded(t: Tape, x):
    """``x.reshape(-1, d)`` of a transposed input inside a matmul (after autocast's cast): a copy."""
    return ops.copy(t, t.cast(x, t.compute(x)))


def trace_whisper(t: Tape, c, batch: int, frames: int, tgt: int, opts, padding: bool) -> None:
    """``WhisperForConditionalGeneration``: two convolutions, pre-LN encoder and decoder, tied projection."""
    d = c.d_model
    feats = t.input(batch * c.num_mel_bins * frames, "f32")
    labels = t.input(batch * tgt)
    dec_ids = t.new(batch * tgt, "i64", False)  # shift_tokens_right(labels)
    ckpt = opts.gradient_checkpointing
    src = (frames + 1) // 2
    with t.scope("activations_feature_encoder"):
        x = ops.activation(t, ops.conv1d(t, feats, c.num_mel_bins, d, 3, batch, frames, "model.encoder.conv1"),
                           "gelu")
        x = ops.activation(t, ops.conv1d(t, x, d, d, 3, batch, src, "model.encoder.conv2"), "gelu")
    pos_ids = t.new(c.max_source_positions, "i64", False)
    pos = ops.embedding(t, pos_ids, c.max_source_positions, c.max_source_positions, d,
                        "model.encoder.embed_positions", trainable=False)
    h = ops.dropout(t, ops.binary(t, x, pos), c.dropout)
    for i in range(c.encoder_layers):
        h = t.begin_layer(i, ckpt, [h])[0]
        h = _whisper_layer(t, c, h, None, batch, src, src, f"model.encoder.layers.{i}", opts, c.encoder_attention_heads,
                           c.encoder_ffn_dim, None)
        t.end_layer(h)
    enc = ops.layer_norm(t, h, d, "model.encoder.layer_norm")
    tie = "model.decoder.embed_tokens.weight" if getattr(c, "tie_word_embeddings", True) else None
    x = ops.embedding(t, dec_ids, batch * tgt, c.vocab_size, d, "model.decoder.embed_tokens")
    pos_ids = t.new(batch * tgt, "i64", False)
    pos = ops.embedding(t, pos_ids, batch * tgt, c.max_target_positions, d, "model.decoder.embed_positions")
    h = ops.dropout(t, ops.binary(t, x, pos), c.dropout)
    self_mask = mask(t, batch, tgt, tgt, opts.attention) if opts.attention == "eager" else None
    for i in range(c.decoder_layers):
        layer = c.encoder_layers + i
        h, enc_in = t.begin_layer(layer, ckpt, [h, enc, self_mask], cast=(0, 1))[:2]
        h = _whisper_layer(t, c, h, enc_in, batch, tgt, src, f"model.decoder.layers.{i}", opts,
                           c.decoder_attention_heads, c.decoder_ffn_dim, self_mask)
        t.end_layer(h)
    h = ops.layer_norm(t, h, d, "model.decoder.layer_norm")
    t.use(enc)
    loss, logits = lm_loss(t, h, d, c.vocab_size, batch * tgt, labels, name="proj_out", tie=tie, upcast=False)
    t.finish(loss, keep=[logits, enc])


def _whisper_layer(t: Tape, c, h, enc, batch, q_len, src, name, opts, heads, ffn, self_mask):
    d = c.d_model
    a = Attn(d, heads, d // heads, dropout=c.attention_dropout, k_bias=False, head_major=True)
    parts = [("self_attn", None, self_mask, enc is not None)]
    if enc is not None:
        parts.append(("encoder_attn", enc, None, False))
    for part, kv, m, causal in parts:
        x = ops.layer_norm(t, h, d, f"{name}.{part}_layer_norm")
        k_len = src if kv is not None else q_len
        x = attention(t, x, kv, a, f"{name}.{part}", batch, q_len, k_len, attention=opts.attention, mask4d=m,
                      causal=causal)
        h = ops.binary(t, h, ops.dropout(t, x, c.dropout))
    x = ops.layer_norm(t, h, d, f"{name}.final_layer_norm")
    x = mlp(t, x, d, ffn, name, c.activation_function, act_dropout=c.activation_dropout)
    return ops.binary(t, h, ops.dropout(t, x, c.dropout))
