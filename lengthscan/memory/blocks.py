"""Blocks shared by the families: attention (eager or SDPA, grouped KV heads), masks, the LM loss."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.memory import fused_head, ops
from lengthscan.memory.ops import op_kind
from lengthscan.memory.tape import Tape, Tensor


@dataclass(frozen=True)
class Attn:
    """One attention module's shape: ``heads`` query heads, ``kv_heads`` key/value heads."""

    d_in: int
    heads: int
    head_dim: int
    kv_heads: int | None = None
    bias: bool = True
    out_bias: bool | None = None
    dropout: float = 0.0
    kv_dim: int | None = None  # width of the key/value input (cross-attention)
    names: tuple = ("q_proj", "k_proj", "v_proj", "out_proj")
    k_bias: bool | None = None
    head_major: bool = False  # q/k/v made contiguous as (batch, heads, seq, dim) before attention (Whisper)
    q_scale: bool = False  # q_proj(x) * scaling before the attention (OPT): a new tensor
    sliced_qkv: bool = False  # a fused projection sliced (Phi-3's qkv[..., a:b]) rather than split or chunked


def mask(t: Tape, batch: int, q_len: int, k_len: int, attention: str) -> Tensor:
    """The 4-D mask transformers builds for a padded batch: bool for SDPA, an additive float for eager."""
    return t.new(batch * q_len * k_len, "bool" if attention != "eager" else "f32", False, "activations_masks")


def causal_masks(t: Tape, batch: int, seq: int, attention: str, padding: bool, windows: dict) -> dict:
    """The causal masks a decoder builds, by layer type (``windows``: each type's window, None for full attention).

    Eager: an additive float mask for each, always. SDPA/flash: none for a full-attention type unless the
    batch is padded (``is_causal``); a bool one for a sliding type once the sequence reaches its window.
    """
    return {kind: mask(t, batch, seq, seq, attention)
            if attention == "eager" or padding or (window is not None and seq >= window) else None
            for kind, window in windows.items()}


@op_kind("activations_attention")
def attention(t: Tape, x: Tensor, kv: Tensor | None, a: Attn, name: str, batch: int, q_len: int, k_len: int, *,
              attention: str, mask4d: Tensor | None, causal: bool, rotary: tuple | None = None,
              fused_qkv: bool = False, eager_softmax_fp32: bool = False, qk_norm: tuple | None = None,
              rotary_part: float | None = None, softcap: bool = False) -> Tensor:
    """q/k/v projections, attention, the output projection; returns the projection's output.

    ``qk_norm``: ``(head_dim, eps)`` RMSNorm over each query and key head (Qwen3), ``(head_dim, eps, True)``
    Gemma's ``(1 + weight)`` one (Gemma 3). ``softcap``: eager scores soft-capped, ``tanh(s / cap) * cap``
    (Gemma 2; flash kernels cap inside the kernel, at no memory).

    ``rotary_part``: Phi-3 and GPT-NeoX rotate the first part of each head (``q[..., :rotary_dim]``)
    and concatenate the rest back, a copy of q and k even when the whole head rotates.
    """
    kv = x if kv is None else kv
    kv_heads = a.kv_heads or a.heads
    q_dim, kv_out = a.heads * a.head_dim, kv_heads * a.head_dim
    qn, kn, vn, on = a.names
    k_bias = a.bias if a.k_bias is None else a.k_bias
    if fused_qkv:  # GPT-2's c_attn: one projection, split into views
        qkv = ops.linear(t, x, a.d_in, q_dim + 2 * kv_out, f"{name}.{qn}", a.bias)
        q, k, v = ops.split(t, qkv, (q_dim, kv_out, kv_out), slices=a.sliced_qkv)
    else:
        q = ops.linear(t, x, a.d_in, q_dim, f"{name}.{qn}", a.bias)
        if a.q_scale:
            q = ops.scale(t, q)
        k = ops.linear(t, kv, a.kv_dim or a.d_in, kv_out, f"{name}.{kn}", k_bias)
        v = ops.linear(t, kv, a.kv_dim or a.d_in, kv_out, f"{name}.{vn}", a.bias)
    if qk_norm is not None:  # Qwen3, Gemma 3: RMSNorm over each head
        plus_one = len(qk_norm) > 2 and bool(qk_norm[2])
        q = ops.rms_norm(t, q, qk_norm[0], f"{name}.q_norm", plus_one=plus_one)
        k = ops.rms_norm(t, k, qk_norm[0], f"{name}.k_norm", plus_one=plus_one)
    if rotary is not None:
        if rotary_part is None:
            q, k = _rotate(t, q, rotary), _rotate(t, k, rotary)
        else:
            q = ops.copy(t, _rotate(t, _rotary_slice(t, q, rotary_part), rotary), q.numel)
            k = ops.copy(t, _rotate(t, _rotary_slice(t, k, rotary_part), rotary), k.numel)
    n_rep = a.heads // kv_heads
    q_n, k_n = batch * q_len * q_dim, batch * k_len * kv_out
    # repeat_kv: expand then reshape, a copy (a view with a single KV head: the expanded dim folds in)
    repeat = n_rep > 1 and kv_heads > 1
    if attention == "eager":
        if repeat:
            k, v = ops.copy(t, k, k_n * n_rep), ops.copy(t, v, k_n * n_rep)
        elif n_rep > 1:
            k, v = ops.view(t, k, k_n * n_rep), ops.view(t, v, k_n * n_rep)
        out = _eager(t, q, k, v, batch * a.heads * q_len * k_len, mask4d, a.dropout, causal, eager_softmax_fp32,
                     batch * q_len * a.heads * a.head_dim, softcap)
    else:
        if repeat and mask4d is not None:  # transformers enables SDPA's GQA only without a mask
            k, v = ops.copy(t, k, k_n * n_rep), ops.copy(t, v, k_n * n_rep)
        # SDPA's kernels write their output as (batch, seq, heads, dim): transpose(1, 2).contiguous() is
        # free, unless the CPU kernel follows a head-major query's layout (CUDA's always write seq-major)
        out = _sdpa(t, q, k, v, q_n, batch * a.heads * q_len, mask4d)
        if a.head_major:
            out = ops.copy(t, out)
    return ops.linear(t, out, q_dim, a.d_in, f"{name}.{on}", a.bias if a.out_bias is None else a.out_bias)


def _rotary_slice(t: Tape, x: Tensor, part: float) -> Tensor:
    """``x[..., :rotary_dim]`` (and ``x[..., rotary_dim:]``, even empty): slices, see :func:`ops.split`."""
    out = Tensor(int(x.numel * part), x.dtype, x.requires_grad, x.storage)
    t.node([t.use(x)], [out], [], workspace=x.nbytes)
    return out


def _rotate(t: Tape, x: Tensor, rotary: tuple) -> Tensor:
    """``x * cos + rotate_half(x) * sin``: keeps cos and sin (shared by every layer)."""
    cos, sin = rotary
    a = ops.binary(t, x, cos, saves=True)
    half = ops.copy(t, ops.unary(t, x))  # cat(-x2, x1): a negation, then the concatenation
    b = ops.binary(t, half, sin, saves=True)
    return ops.binary(t, a, b)


def _sdpa(t: Tape, q: Tensor, k: Tensor, v: Tensor, out_numel: int, rows: int, mask4d: Tensor | None) -> Tensor:
    dtype = t.compute(q, k, v)
    q, k, v = t.cast(q, dtype), t.cast(k, dtype), t.cast(v, dtype)
    bias = None
    if mask4d is not None:  # SDPA turns a bool mask into an additive one of the query's dtype, per call
        t.use(mask4d)
        bias = t.new(mask4d.numel, dtype, False)
    out = t.new(out_numel, dtype, ops.needs_grad(q, k, v))
    lse = t.new(rows, "f32", False)
    t.node([q, k, v, bias, lse], [out], [q, k, v, out, lse, bias])  # the mask and lse live until the kernel ends
    return out


def _eager(t: Tape, q, k, v, scores_numel: int, mask4d, p: float, causal: bool, softmax_fp32: bool,
           out_numel: int, softcap: bool = False) -> Tensor:
    dtype = t.compute(q, k)
    qc, kc = t.cast(q, dtype), t.cast(k, dtype)
    scores = t.new(scores_numel, dtype, ops.needs_grad(qc, kc))
    t.node([qc, kc], [scores], [qc, kc])
    scores = ops.scale(t, scores)
    if softcap:
        scores = soft_cap(t, scores)
    if mask4d is not None:
        scores = ops.binary(t, scores, mask4d)
    probs = ops.softmax(t, scores)
    if softmax_fp32 and t.low:  # softmax(..., dtype=float32).to(query.dtype)
        probs = t.cast(probs, q.dtype)
    probs = ops.dropout(t, probs, p)
    dtype = t.compute(probs, v)
    pc, vc = t.cast(probs, dtype), t.cast(v, dtype)
    out = t.new(out_numel, dtype, ops.needs_grad(pc, vc))
    t.node([pc, vc], [out], [pc, vc])
    return ops.copy(t, out)  # transpose(1, 2).contiguous()


def soft_cap(t: Tape, x: Tensor) -> Tensor:
    """``tanh(x / cap) * cap`` (Gemma 2's scores, Gemma's final logits): three new tensors, tanh keeps its output."""
    return ops.scale(t, ops.unary(t, ops.scale(t, x), "output"))


@op_kind("activations_mlp")
def mlp(t: Tape, x: Tensor, d: int, ffn: int, name: str, act: str, *, bias: bool = True, act_dropout: float = 0.0,
        names: tuple = ("fc1", "fc2")) -> Tensor:
    """``fc2(dropout(act(fc1(x))))``."""
    h = ops.activation(t, ops.linear(t, x, d, ffn, f"{name}.{names[0]}", bias), act)
    h = ops.dropout(t, h, act_dropout)
    return ops.linear(t, h, ffn, d, f"{name}.{names[1]}", bias)


@op_kind("activations_mlp")
def gated_mlp(t: Tape, x: Tensor, d: int, ffn: int, name: str, act: str, *, bias: bool = False,
              names: tuple = ("gate_proj", "up_proj", "down_proj"), act_dropout: float = 0.0) -> Tensor:
    """``down(act(gate(x)) * up(x))`` (Llama's SwiGLU, T5 v1.1's gated GELU)."""
    g = ops.activation(t, ops.linear(t, x, d, ffn, f"{name}.{names[0]}", bias), act)
    u = ops.linear(t, x, d, ffn, f"{name}.{names[1]}", bias)
    h = ops.dropout(t, ops.binary(t, g, u, saves=True), act_dropout)
    return ops.linear(t, h, ffn, d, f"{name}.{names[2]}", bias)


@op_kind("activations_mlp")
def fused_gated_mlp(t: Tape, x: Tensor, d: int, ffn: int, name: str, act: str, *,
                    names: tuple = ("gate_up_proj", "down_proj")) -> Tensor:
    """Phi-3: ``gate, up = gate_up(x).chunk(2)``, ``down(up * act(gate))`` (views of one projection)."""
    gate, up = ops.split(t, ops.linear(t, x, d, 2 * ffn, f"{name}.{names[0]}", False), (ffn, ffn))
    h = ops.binary(t, up, ops.activation(t, gate, act), saves=True)
    return ops.linear(t, h, ffn, d, f"{name}.{names[1]}", False)


@op_kind("logits_loss")
def lm_loss(t: Tape, h: Tensor, d: int, vocab: int, rows: int, labels: Tensor, *, name: str = "lm_head",
            tie: str | None = None, bias_buffer: bool = False, upcast: bool = True, bias: bool = False,
            vocab_bias: str | None = None, softcap: bool = False) -> tuple:
    """Logits over the vocabulary and the cross-entropy loss; returns (loss, logits).

    ``bias_buffer``: BART-like ``final_logits_bias`` (an fp32 buffer: the sum is fp32 under
    autocast). ``upcast``: transformers' ``ForCausalLMLoss`` calls ``logits.float()`` first.
    ``softcap``: Gemma's ``final_logit_softcapping``, three more vocabulary-wide tensors (one kept).
    A tape with a ``head`` (a preference or RL trainer's) gets that head instead (``fused_head.py``).
    """
    if t.trl_head is not None:
        kind, batch = t.trl_head
        if kind == "score":
            return fused_head.score(t, h, d, rows, batch)
        if kind == "last_logits":
            return fused_head.last_logits(t, h, d, vocab, batch, name=name, tie=tie, bias=bias)
        return fused_head.log_probs(t, h, d, vocab, rows, batch, name=name, tie=tie, bias=bias, trainer=kind)
    logits = ops.linear(t, h, d, vocab, name, bias, tie=tie, bias_tie=vocab_bias)
    if softcap:
        logits = soft_cap(t, logits)
    if bias_buffer:
        bias_t = t.new(vocab, "f32", False, "buffers", held=True)
        logits = ops.binary(t, logits, bias_t)
    out = logits
    if upcast:
        logits = t.cast(logits, "f32")
    loss = ops.cross_entropy(t, logits, labels)
    return loss, out
