"""The ops the modeled families use, with what each keeps for backward (torch's derivatives.yaml).

Every function takes the :class:`~lengthscan.memory.tape.Tape` first and returns its output
tensor(s). Sizes are element counts; the caller knows the shapes.
"""

from __future__ import annotations

import functools

from lengthscan.memory.tape import Tape, Tensor


def op_kind(kind: str):
    """Decorator: report the activations the op allocates as ``kind`` (a row of the memory breakdown)."""
    def wrap(fn):
        @functools.wraps(fn)
        def op(t: Tape, *args, **kwargs):
            with t.scope(kind):
                return fn(t, *args, **kwargs)
        return op
    return wrap


def needs_grad(*xs) -> bool:
    """Whether any of ``xs`` (None allowed) needs a gradient: an op's output then does too."""
    return any(x is not None and x.requires_grad for x in xs)


# -- elementwise -----------------------------------------------------------------------------------


def unary(t: Tape, x: Tensor, save: str = "", dtype: str | None = None) -> Tensor:
    """An elementwise op; ``save`` is "input", "output" or "" (what its backward needs)."""
    x = t.use(x)
    out = t.new(x.numel, dtype or x.dtype, x.requires_grad)
    t.node([x], [out], [x] if save == "input" else [out] if save == "output" else [])
    return out


def binary(t: Tape, a: Tensor, b: Tensor, saves: bool = False) -> Tensor:
    """``a + b`` (``saves=False``) or ``a * b`` (each operand kept for the other's gradient).

    With a bf16/fp16 operand and an fp32 one, CPU's TensorIterator first copies the low-precision
    operand to fp32 (CUDA casts inside the kernel): a transient the size of that copy.
    """
    dtype = t.promote(a, b)
    out = t.new(max(a.numel, b.numel), dtype, needs_grad(a, b))
    saved = [b if a.requires_grad else None, a if b.requires_grad else None] if saves else []
    upcast = sum(x.numel * 4 for x in (a, b) if dtype == "f32" and x.dtype in ("bf16", "f16"))
    t.node([a, b], [out], saved, forward_workspace=upcast)
    return out


def scale(t: Tape, x: Tensor) -> Tensor:
    """``x * python_number``: a new tensor, nothing kept."""
    return unary(t, x)


def view(t: Tape, x: Tensor, numel: int | None = None) -> Tensor:
    """A view (reshape of a contiguous tensor, transpose, expand ...): no allocation."""
    out = Tensor(numel or x.numel, x.dtype, x.requires_grad, x.storage)
    t.node([t.use(x)], [out], [], alias=True)
    return out


def split(t: Tape, x: Tensor, widths: tuple, slices: bool = False) -> list:
    """``x.split(widths, dim=-1)``: views; backward concatenates the parts' gradients into one.

    ``slices``: ``x[..., a:b]`` for each part instead; each part's backward writes its gradient into
    zeros shaped like ``x``, added to the others' (one more such buffer at a time).
    """
    total = sum(widths)
    outs = [Tensor(x.numel // total * w, x.dtype, x.requires_grad, x.storage) for w in widths]
    t.node([t.use(x)], outs, [], workspace=x.nbytes if slices else 0)
    return outs


def select(t: Tape, x: Tensor, numel: int) -> Tensor:
    """``x[:, 0]``: a view; backward writes its gradient into zeros shaped like ``x``."""
    out = Tensor(numel, x.dtype, x.requires_grad, x.storage)
    t.node([t.use(x)], [out], [])
    return out


def copy(t: Tape, x: Tensor, numel: int | None = None) -> Tensor:
    """``contiguous()`` of a strided view, ``clone()``, a reshape that must copy."""
    out = t.new(numel or x.numel, x.dtype, x.requires_grad)
    t.node([t.use(x)], [out], [])
    return out


def activation(t: Tape, x: Tensor, name: str) -> Tensor:
    """``ACT2FN[name](x)`` as transformers implements it."""
    if name in ("gelu", "gelu_pytorch_tanh", "silu", "swish", "gelu_fast", "mish", "gelu_10"):
        return unary(t, x, "input")
    if name in ("relu", "tanh", "sigmoid", "relu6"):
        return unary(t, x, "output")
    if name == "gelu_new":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))
        p = unary(t, t.fp32(x), "input")  # pow(x, 3.0): autocast runs pow in fp32
        inner = binary(t, x, scale(t, p))
        th = unary(t, scale(t, inner), "output")
        return binary(t, scale(t, x), scale(t, th), saves=True)
    if name == "quick_gelu":  # x * sigmoid(1.702 * x)
        return binary(t, x, unary(t, scale(t, x), "output"), saves=True)
    return unary(t, x, "input")


def dropout(t: Tape, x: Tensor, p: float) -> Tensor:
    """Training-mode dropout: CUDA's fused kernel keeps a bool mask."""
    if not p or not x.requires_grad:
        return x
    x = t.use(x)
    out = t.new(x.numel, x.dtype, True)
    mask = t.new(x.numel, "bool", False)
    t.node([x], [out], [mask])
    return out


# -- layers ----------------------------------------------------------------------------------------


def linear(t: Tape, x: Tensor, n_in: int, n_out: int, name: str, bias: bool = True, tie: str | None = None,
           trainable: bool = True, bias_tie: str | None = None) -> Tensor:
    """``nn.Linear(n_in, n_out)`` on ``x`` (weight ``name.weight``, shared with ``tie`` if given); a
    quantized or adapted layer when the tape's plan makes it one (``lengthscan/memory/adapted.py``)."""
    if t.linear_hook is not None:
        return t.linear_hook(t, x, n_in, n_out, name, bias, tie, trainable, bias_tie)
    return dense(t, x, n_in, n_out, name, bias, tie, trainable, bias_tie)


def dense(t: Tape, x: Tensor, n_in: int, n_out: int, name: str, bias: bool = True, tie: str | None = None,
          trainable: bool = True, bias_tie: str | None = None) -> Tensor:
    """A plain ``nn.Linear``: autocast casts input and weight (the weight's cast cached), keeps both."""
    w = t.param(f"{name}.weight", n_in * n_out, trainable, tie=tie, shape=(n_out, n_in))
    b = t.param(f"{name}.bias", n_out, trainable, tie=bias_tie) if bias or bias_tie else None
    dtype = t.compute(x, w)
    xc, wc = t.cast(x, dtype), t.cast(w, dtype)
    bc = t.cast(b, dtype) if b is not None else None
    out = t.new(x.numel // n_in * n_out, dtype, needs_grad(x, w, b))
    t.use(x)  # autocast cast a copy; the caller still holds the original until the op returns
    t.node([xc, wc, bc], [out], [xc if w.requires_grad else None, wc if x.requires_grad else None],
            transposed=True)
    return out


def conv1d(t: Tape, x: Tensor, c_in: int, c_out: int, kernel: int, batch: int, out_len: int, name: str,
           bias: bool = True, groups: int = 1, trainable: bool = True, weight: Tensor | None = None,
           strided_grad: bool = False, strided_input: bool = False) -> Tensor:
    """``nn.Conv1d`` to ``out_len`` frames, with the CPU kernel's scratch (oneDNN, one thread).

    oneDNN reorders input, output and weight around the convolution (transient copies: fitted
    on the measured kernels) and, for grouped convolutions (Wav2Vec2's positional one),
    accumulates the weight gradient in a scratch of about four weights plus eight input rows per
    channel.
    """
    w = weight if weight is not None else t.param(f"{name}.weight", c_out * c_in // groups * kernel, trainable)
    b = t.param(f"{name}.bias", c_out, trainable) if bias else None
    dtype = t.compute(x, w)
    xc, wc = t.cast(x, dtype), t.cast(w, dtype)
    bc = t.cast(b, dtype) if b is not None else None
    out = t.new(batch * out_len * c_out, dtype, needs_grad(x, w, b))
    t.use(x)
    xb, yb, wb = xc.nbytes, out.nbytes, wc.nbytes
    if groups > 1:
        scratch = 4 * wb + 8 * xb // batch
    else:
        scratch = xb + max(xb, yb) if c_in > 1 else yb * 3 // 2
    if strided_grad:  # the gradient arrives transposed: convolution_backward copies it first
        scratch += yb
    forward_scratch = xb + wb if c_in > 1 else yb
    if strided_input:  # a transposed input is copied contiguous, in forward and again in backward
        scratch += xb
        forward_scratch += xb
    t.node([xc, wc, bc], [out], [xc if w.requires_grad else None, wc if x.requires_grad else None],
            workspace=scratch, forward_workspace=forward_scratch)
    return out


@op_kind("activations_norms")
def layer_norm(t: Tape, x: Tensor, dim: int, name: str, bias: bool = True, trainable: bool = True,
               strided: bool = False, weightless: bool = False) -> Tensor:
    """``nn.LayerNorm(dim)``: autocast runs it in fp32; keeps input, weight, mean and rstd.

    ``strided``: the input is a transposed view, copied contiguous inside the kernel (and its
    input and gradient again in backward).
    """
    w = None if weightless else t.param(f"{name}.weight", dim, trainable)
    b = t.param(f"{name}.bias", dim, trainable) if bias and not weightless else None
    xf = t.fp32(x)
    dtype = "f32" if t.low else t.promote(x)
    out = t.new(x.numel, dtype, needs_grad(x, w, b))
    rows = x.numel // dim
    mean, rstd = t.new(rows, "f32", False), t.new(rows, "f32", False)
    t.use(x)
    t.node([xf, w, b], [out], [xf if w is not None or x.requires_grad else None, w, b, mean, rstd],
           workspace=2 * xf.nbytes if strided else 0, forward_workspace=xf.nbytes if strided else 0)
    return out


@op_kind("activations_norms")
def group_norm(t: Tape, x: Tensor, channels: int, groups_numel: int, name: str, trainable: bool = True) -> Tensor:
    """``nn.GroupNorm``: fp32 under autocast; keeps input, weight, mean and rstd (batch x groups)."""
    w = t.param(f"{name}.weight", channels, trainable)
    b = t.param(f"{name}.bias", channels, trainable)
    xf = t.fp32(x)
    out = t.new(x.numel, "f32" if t.low else x.dtype, needs_grad(x, w, b))
    mean, rstd = t.new(groups_numel, "f32", False), t.new(groups_numel, "f32", False)
    t.use(x)
    t.node([xf, w, b], [out], [xf, w, b, mean, rstd])
    return out


@op_kind("activations_norms")
def rms_norm(t: Tape, x: Tensor, dim: int, name: str, plus_one: bool = False) -> Tensor:
    """The transformers RMSNorm (Llama/T5): fp32 variance, ``weight * normed.to(input dtype)``."""
    w = t.param(f"{name}.weight", dim)
    h = t.cast(x, "f32")
    rows = x.numel // dim
    sq = unary(t, h, "input")  # pow(2) keeps h
    variance = t.new(rows, "f32", sq.requires_grad)  # mean: keeps nothing
    t.node([sq], [variance], [])
    r = unary(t, unary(t, variance), "output")  # + eps, rsqrt keeps its result
    normed = binary(t, h, r, saves=True)
    if plus_one:  # Gemma: (normed * (1.0 + weight.float())).type_as(x), the product in fp32
        return t.cast(binary(t, normed, unary(t, t.cast(w, "f32")), saves=True), x.dtype)
    normed = t.cast(normed, x.dtype)
    return binary(t, w, normed, saves=True)


@op_kind("activations_embeddings")
def embedding(t: Tape, ids: Tensor, n_ids: int, vocab: int, dim: int, name: str, tie: str | None = None,
              trainable: bool = True) -> Tensor:
    """``nn.Embedding(vocab, dim)`` looked up at ``n_ids`` positions (keeps the indices)."""
    w = t.param(f"{name}.weight", vocab * dim, trainable, tie=tie, shape=(vocab, dim))
    token_embeddings = name.rsplit(".", 1)[-1] in INPUT_EMBEDDINGS  # enable_input_require_grads' hook
    out = t.new(n_ids * dim, w.dtype, w.requires_grad or (t.input_grads and token_embeddings))
    t.node([t.use(w)], [out], [ids])
    return out


#: the token embeddings' module names (``get_input_embeddings()``)
INPUT_EMBEDDINGS = ("embed_tokens", "wte", "embed_in", "word_embeddings", "shared")


def softmax(t: Tape, x: Tensor, log: bool = False) -> Tensor:
    """``softmax``/``log_softmax``: fp32 under autocast (its dtype set to float32); keeps its output."""
    xf = t.fp32(x)
    out = t.new(xf.numel, xf.dtype, xf.requires_grad)
    t.use(x)
    t.node([xf], [out], [out])
    return out


def cross_entropy(t: Tape, logits: Tensor, labels: Tensor) -> Tensor:
    """``F.cross_entropy``: log_softmax (fp32, kept) then nll_loss (keeps target and total weight)."""
    logp = softmax(t, logits, log=True)
    loss = t.new(1, "f32", True)
    t.node([logp], [loss], [labels])
    return loss
