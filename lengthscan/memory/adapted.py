"""Linear layers as the launched run builds them: bitsandbytes-quantized, with a LoRA adapter, or both.

:func:`linear` replaces :func:`lengthscan.memory.ops.linear` on a tape whose plan quantizes or
adapts layers (``WeightPlan.active``). What each keeps, as the installed libraries run it:

* ``bnb.nn.Linear4bit``: the input cast to the compute dtype; ``MatMul4Bit`` dequantizes the
  whole weight into that dtype (a transient the size of the weight, in forward and again in
  backward, with the absmax of a double-quantized state), keeps only the packed weight (never a
  copy of the input: the weight trains no gradient), and the output is cast back to the input's
  dtype.
* ``bnb.nn.Linear8bitLt`` (LLM.int8): ``bnb.matmul`` keeps its input for backward and
  dequantizes the int8 weight into the input's dtype for the product (forward and backward).
* LoRA (peft ``lora.Linear``): ``result = base(x)``; ``x`` cast to the adapter's dtype; dropout
  (a new tensor and its mask even when nothing needs a gradient); ``lora_B(lora_A(x)) *
  scaling`` added; the sum cast back to the base output's dtype. peft's bitsandbytes layers clone
  the 4-bit output first and, under autocast, skip the casts.
* DoRA (peft ``DoraLinearLayer.forward``): ``lora_B(lora_A(eye))`` on an ``in x in`` identity,
  cast to the input's dtype, and the base weight cast likewise, for the weight norm (two
  weight-sized transients); only the norm's detached value is used, so that graph (the identity's
  autocast copy, ``lora_A``'s output) is unreachable from the loss and dies with forward's locals.
  ``magnitude / weight_norm`` keeps the norm; a second ``lora_B(lora_A(x))``; with dropout,
  ``F.linear(dropout(x), weight)`` keeps autocast's (uncached: a frozen tensor) copy of the weight,
  without it the base output (minus its bias) is reused. ``(scale - 1) * base`` and ``scale * lora``
  are fp32 (the magnitude is) and keep the base and LoRA outputs; ``result + dora`` is fp32, cast
  back to the base output's dtype (not by peft's bitsandbytes layers under autocast). Measured
  (bf16 weights and autocast, Llama and Qwen2, ``all-linear`` and ``q_proj,v_proj``, dropout 0 and
  0.05, with and without checkpointing; QLoRA): within 1.5% (docs/memory.md).
"""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.tape import BYTES, Tape, Tensor

#: linear layers that are a model's output embeddings (peft's all-linear leaves them out; so does
#: transformers' bitsandbytes quantizer)
OUTPUT_LAYERS = ("lm_head", "proj_out", "cls.predictions.decoder", "lm_head.decoder", "generator_lm_head",
                 "vocab_projector")
#: classification heads: the model's last module (left unquantized), peft's SEQ_CLS head
CLASS_HEADS = ("classifier", "classifier.out_proj", "score")


def linear(t: Tape, x: Tensor, n_in: int, n_out: int, name: str, bias: bool = True, tie: str | None = None,
           trainable: bool = True, bias_tie: str | None = None) -> Tensor:
    """``nn.Linear`` on ``x``, quantized and/or adapted as the tape's plan says."""
    plan = t.plan
    t.linears.append(name)
    q = plan.quantization
    # transformers skips the output embeddings and the module of the model's last parameter, named without its
    # ".weight": a head ending in a bias ("classifier.bias") is not recognised, and is quantized
    defaults = OUTPUT_LAYERS + (() if bias or bias_tie else CLASS_HEADS)
    quantized = q is not None and tie is None and not q.skipped(name, defaults)
    if quantized:
        out = _quantized(t, x, n_in, n_out, name, bias, trainable)
    else:
        out = ops.dense(t, x, n_in, n_out, name, bias, tie, trainable, bias_tie)
    lora = plan.lora
    output_layer = name in OUTPUT_LAYERS or (lora is not None and lora.task_type == "SEQ_CLS"
                                             and name in ("classifier", "score"))
    if lora is None or not lora.targets_module(name, output_layer=output_layer):
        return out
    t.adapted.append(name)
    if lora.bias == "lora_only" and (bias or bias_tie):
        b = t.params[bias_tie or f"{name}.bias"]
        b.trainable = b.tensor.requires_grad = True
    b = t.params.get(bias_tie or f"{name}.bias") if bias or bias_tie else None
    out = _lora(t, x, out, n_in, n_out, name, lora, quantized, b.tensor if b is not None else None)
    t.use(x)  # the caller holds the layer's input until the layer returns
    return out


def _quantized(t: Tape, x: Tensor, n_in: int, n_out: int, name: str, bias: bool, trainable: bool) -> Tensor:
    q = t.plan.quantization
    numel = n_in * n_out
    w = t.param(f"{name}.weight", numel, stored=("u8", q.weight_bytes(numel, n_out)))
    b = t.param(f"{name}.bias", n_out, trainable) if bias else None
    rows = x.numel // n_in
    if q.four_bit:  # Linear4bit.forward: x.to(compute_dtype), MatMul4Bit, .to(input dtype)
        compute = q.compute_dtype or x.dtype
        xc = t.cast(x, compute)
        mm = t.low or compute  # F.linear on the dequantized weight, under autocast when it is on
        xm = xc if mm == compute else t.cast(xc, mm)
        dq = numel * BYTES[compute] + q.absmax_temporary(numel)
        fw = dq + (numel * BYTES[mm] if mm != compute else 0)
        out = t.new(rows * n_out, mm, ops.needs_grad(x, b))
        t.use(x)
        t.node([xm, w, b], [out], [], forward_workspace=fw, workspace=numel * BYTES[mm] + q.absmax_temporary(numel))
        return t.cast(out, x.dtype)
    # LLM.int8: MatMul8bitFp (CPU, XPU) and MatMul8bitLt (CUDA) keep the input itself for backward
    dtype = x.dtype
    mm = t.low or dtype
    fw = numel * BYTES[dtype] + 4 * n_out  # CB.to(A.dtype) * SCB / 127
    if mm != dtype:  # autocast casts the input and the dequantized weight for the product
        fw += x.numel * BYTES[mm] + numel * BYTES[mm]
    out = t.new(rows * n_out, mm, ops.needs_grad(x, b))
    back = numel * BYTES[dtype] + (rows * n_out * BYTES[dtype] if mm != dtype else 0)
    # ``ctx.A = A``: kept on the context, which checkpointing's saved-tensor hooks never see
    t.node([x, w, b], [out], [x if x.requires_grad else None], forward_workspace=fw, workspace=back, outside=True)
    return out


def _lora(t: Tape, x: Tensor, result: Tensor, n_in: int, n_out: int, name: str, lora, quantized: bool,
          bias: Tensor | None = None) -> Tensor:
    adapter = t.plan.dtype(f"{name}.lora_A.default.weight")
    bnb = quantized
    if bnb and t.plan.quantization.four_bit:
        result = ops.copy(t, result)  # peft: "for 4bit, we need to defensively clone here"
    converts = not bnb or t.low is None  # peft's bnb layers skip the casts under autocast
    res_dtype = result.dtype
    xa = t.cast(x, adapter) if converts else x
    d = _dropout(t, xa, lora.dropout)
    if lora.use_dora:
        out = _dora(t, d, result, n_in, n_out, name, lora, quantized, bias)
        t.use(xa)
        return t.cast(out, res_dtype) if converts else out  # the variant's sum is fp32 (an fp32 magnitude)
    a = ops.dense(t, d, n_in, lora.r, f"{name}.lora_A.default", bias=False)
    b = ops.dense(t, a, lora.r, n_out, f"{name}.lora_B.default", bias=False)
    s = ops.scale(t, b)
    t.use(xa)  # peft's forward holds its cast input (``x = self._cast_input_dtype(x, ...)``) until it returns
    if bnb and converts:
        s = t.cast(s, res_dtype)
    out = ops.binary(t, result, s)
    return out if bnb else t.cast(out, res_dtype)


def _dropout(t: Tape, x: Tensor, p: float) -> Tensor:
    """``nn.Dropout(p)`` in training: a new tensor and a mask (kept when a gradient flows), even
    when nothing needs a gradient; ``nn.Identity`` for p = 0."""
    if not p:
        return x
    if x.requires_grad:
        return ops.dropout(t, x, p)
    out = t.new(x.numel, x.dtype, False)
    mask = t.new(x.numel, "bool", False)
    t.node([x], [out], [mask])
    t.use(mask)
    return out


def _dora(t: Tape, d: Tensor, result: Tensor, n_in: int, n_out: int, name: str, lora, quantized: bool,
          bias: Tensor | None) -> Tensor:
    """peft's DoraLinearVariant.forward and DoraLinearLayer.forward (see the module's docstring): ``result
    + dora`` on the (dropped-out) adapter input ``d``."""
    mag = t.param(f"{name}.lora_magnitude_vector.default.weight", n_out)
    io, r, x_dtype = n_in * n_out, lora.r, d.dtype
    # get_lora_weight: lora_B(lora_A(eye)).T, cast to x's dtype. Only its detached value is used: its graph
    # (the eye's cast, lora_A's output, both saved) is unreachable from the loss and dies when forward returns
    eye = t.new(n_in * n_in, t.plan.dtype(f"{name}.lora_A.default.weight"), False)
    wa = t.param(f"{name}.lora_A.default.weight", n_in * r, shape=(r, n_in))
    wb = t.param(f"{name}.lora_B.default.weight", r * n_out, shape=(n_out, r))
    mm = t.compute(eye, wa)
    eye_c = t.cast(eye, mm)
    ea = _product(t, eye_c, t.cast(wa, mm), n_in * r)
    lw = _product(t, ea, t.cast(wb, mm), io)
    t.use(eye)  # get_lora_weight's local
    lw = t.cast(lw, x_dtype)
    # weight = dequantize_module_weight(base_layer).to(x.dtype): a copy unless already x's dtype, held to the end
    base = t.params.get(f"{name}.weight")
    weight = _to(t, base.tensor, x_dtype) if base is not None and not quantized else t.new(io, x_dtype, False)
    # get_weight_norm (detached): weight + scaling * lora_weight (two transients), its row norms
    norm = t.new(n_out, x_dtype, False)
    t.node([weight, lw], [norm], [], forward_workspace=2 * io * BYTES[x_dtype])
    mns = ops.binary(t, mag, norm, saves=True)  # magnitude / weight_norm: keeps weight_norm
    lr = ops.dense(t, ops.dense(t, d, n_in, r, f"{name}.lora_A.default", bias=False), r, n_out,
                   f"{name}.lora_B.default", bias=False)
    if lora.dropout:  # base_result = F.linear(dropout(x), weight): autocast's cast of weight is not cached
        wc = _to(t, weight, t.compute(d, weight))  # a frozen tensor: autocast caches no cast of it
        dc = t.cast(d, wc.dtype)
        base_result = t.new(result.numel, wc.dtype, d.requires_grad)
        t.node([dc, wc], [base_result], [wc if d.requires_grad else None])
    elif bias is not None:  # base_result = result - bias
        base_result = ops.binary(t, result, bias)
    else:
        base_result = result
    first = ops.binary(t, ops.scale(t, mns), base_result, saves=True)  # (mag_norm_scale - 1) * base_result
    second = ops.scale(t, ops.binary(t, mns, lr, saves=True))  # mag_norm_scale * lora_result * scaling
    dora = ops.binary(t, first, second)
    for x in (eye_c, ea, lw, weight):  # forward's locals (and the dead graph) die when it returns
        t.use(x)
    out = ops.binary(t, result, dora)
    t.use(d)  # the variant's local
    return out


def _to(t: Tape, x: Tensor, dtype: str) -> Tensor:
    """``x.to(dtype)`` outside autocast's weight cache: a new tensor unless already ``dtype``."""
    if x.dtype == dtype:
        return t.use(x)
    out = t.new(x.numel, dtype, x.requires_grad)
    t.node([x], [out], [])
    return out


def _product(t: Tape, x: Tensor, w: Tensor, numel: int) -> Tensor:
    """``x @ w.T`` in a graph nothing backpropagates through: the output only, nothing kept."""
    out = t.new(numel, x.dtype, False)
    t.use(w)
    t.node([x], [out], [])
    return out
