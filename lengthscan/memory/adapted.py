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
* DoRA: ``lora_A`` applied to an identity matrix (``in x in``, kept), the full ``lora_B @
  lora_A`` and the base weight for the weight norm, and a second ``lora_B(lora_A(x))``; the base
  output and the LoRA output are kept for the magnitude's gradient.
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
    out = _lora(t, x, out, n_in, n_out, name, lora, quantized)
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


def _lora(t: Tape, x: Tensor, result: Tensor, n_in: int, n_out: int, name: str, lora, quantized: bool) -> Tensor:
    adapter = t.plan.dtype(f"{name}.lora_A.default.weight")
    bnb = quantized
    if bnb and t.plan.quantization.four_bit:
        result = ops.copy(t, result)  # peft: "for 4bit, we need to defensively clone here"
    converts = not bnb or t.low is None  # peft's bnb layers skip the casts under autocast
    res_dtype = result.dtype
    xa = t.cast(x, adapter) if converts else x
    d = _dropout(t, xa, lora.dropout)
    if lora.use_dora:
        return _dora(t, d, result, n_in, n_out, name, lora)
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


def _dora(t: Tape, d: Tensor, result: Tensor, n_in: int, n_out: int, name: str, lora) -> Tensor:
    """peft's DoraLinearLayer.forward (see the module's docstring)."""
    mag = t.param(f"{name}.lora_magnitude_vector.default.weight", n_out)
    eye = t.new(n_in * n_in, t.plan.dtype(f"{name}.lora_A.default.weight"), False)
    ea = ops.dense(t, eye, n_in, lora.r, f"{name}.lora_A.default", bias=False)
    lw = ops.dense(t, ea, lora.r, n_out, f"{name}.lora_B.default", bias=False)  # (in x out), then .T: a view
    lw = t.cast(lw, d.dtype)
    w_numel = n_in * n_out  # the weight norm, detached: weight + scaling * lora_weight, then its row norms
    t.use(lw)
    t.node([], [], [], forward_workspace=3 * w_numel * BYTES[d.dtype])
    norm = t.new(n_out, d.dtype, False)
    scale = ops.binary(t, mag, norm, saves=True)  # magnitude / weight_norm
    a = ops.dense(t, d, n_in, lora.r, f"{name}.lora_A.default", bias=False)
    lr = ops.dense(t, a, lora.r, n_out, f"{name}.lora_B.default", bias=False)
    first = ops.binary(t, ops.scale(t, scale), result, saves=True)  # (mag_norm_scale - 1) * base_result
    second = ops.scale(t, ops.binary(t, scale, lr, saves=True))  # mag_norm_scale * lora_result * scaling
    return ops.binary(t, result, ops.binary(t, first, second))
