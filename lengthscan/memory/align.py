"""Align the CPU measurement with what CUDA kernels keep (validation only; torch imported inside).

CPU kernels differ from CUDA's in three places; :func:`cuda_like` aligns them (docs/memory.md):

* dropout: CPU ``F.dropout`` multiplies by a float noise tensor saved for backward (4 bytes an
  element in fp32); CUDA's fused kernel saves a bool mask (1 byte) and allocates nothing else.
  ``F.dropout`` is routed to a function doing just that (mask, output; in backward, the gradient).
* SDPA with dropout: CPU falls back to the math kernel, which saves the attention matrix; CUDA's
  flash and memory-efficient kernels draw the dropout inside the kernel and save an RNG seed. The
  attention dropout of SDPA is set to 0 (same memory as CUDA's kernels).
* autocast: CUDA runs layer_norm, group_norm, softmax, log_softmax, sum, exp, pow ... in fp32
  (outputs fp32); CPU autocast runs them in the input's precision. CUDA's fp32 policies are
  registered for the AutocastCPU dispatch key while measuring.
* ``torch.is_autocast_enabled()`` without a device asks about CUDA: under CPU autocast peft's
  bitsandbytes LoRA layers take the path they take without autocast (casting the input to the
  adapter's dtype, and its output back). While measuring it answers for the CPU's autocast, as it
  answers for CUDA's on a GPU.

The fused AdamW kernel (the Trainer's default ``adamw_torch_fused``) and the foreach one run on CPU
with the same allocations as on CUDA, so the optimizer needs no alignment.
"""

from __future__ import annotations

import contextlib

#: CUDA autocast's fp32 ops (aten/src/ATen/autocast_mode.h, AT_FORALL_FP32) that HF models use.
_FP32_OPS = ("layer_norm", "native_layer_norm", "group_norm", "rms_norm", "exp", "log", "rsqrt", "reciprocal",
             "pow.Tensor_Scalar", "pow.Tensor_Tensor", "softplus", "nll_loss", "mse_loss", "logsumexp")
#: CUDA's fp32_set_opt_dtype ops: an unset dtype becomes float32.
_FP32_SET_DTYPE = ("softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "prod")


@contextlib.contextmanager
def cuda_like():
    """Patch dropout, SDPA dropout and CPU autocast policies to keep what CUDA kernels keep."""
    import torch
    import torch.nn.functional as F

    original_dropout, original_sdpa = F.dropout, F.scaled_dot_product_attention
    fused = _fused_dropout(torch)

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and input.numel():
            return fused.apply(input, p)
        return original_dropout(input, p, training, inplace)

    def sdpa(*args, **kwargs):
        kwargs["dropout_p"] = 0.0
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        return original_sdpa(*args, **kwargs)

    original_enabled = torch.is_autocast_enabled

    def is_autocast_enabled(device_type=None):
        return original_enabled("cpu" if device_type is None else device_type)

    lib = _register_fp32_autocast(torch)
    F.dropout, F.scaled_dot_product_attention = dropout, sdpa
    torch.is_autocast_enabled = is_autocast_enabled
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = original_dropout, original_sdpa
        torch.is_autocast_enabled = original_enabled
        lib._destroy()  # torch.library.Library's own private: no public way to unregister the kernels


def _fused_dropout(torch):
    """Dropout allocating what CUDA's fused kernel does: a bool mask (kept) and the output.

    (CPU's ``native_dropout`` also makes a float copy of the mask in forward and backward.)
    """

    class FusedDropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            dropped = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(p)
            ctx.save_for_backward(dropped)
            ctx.scale = 1 / (1 - p)
            return x.masked_fill(dropped, 0).mul_(ctx.scale)

        @staticmethod
        def backward(ctx, grad):
            (dropped,) = ctx.saved_tensors
            return grad.masked_fill(dropped, 0).mul_(ctx.scale), None

    return FusedDropout


def _register_fp32_autocast(torch):
    from torch._C import DispatchKey, DispatchKeySet, _ExcludeDispatchKeyGuard  # torch's own (no public guard)

    low = (torch.bfloat16, torch.float16)
    keys = DispatchKeySet(DispatchKey.AutocastCPU)

    def up(t):
        return t.float() if isinstance(t, torch.Tensor) and t.dtype in low else t

    def fp32(op):
        def kernel(*args, **kwargs):
            with _ExcludeDispatchKeyGuard(keys):
                args = [[up(x) for x in a] if isinstance(a, (list, tuple)) else up(a) for a in args]
                return op(*args, **{k: up(v) for k, v in kwargs.items()})
        return kernel

    def set_dtype(op, name):
        position = {"softmax": 2, "log_softmax": 2, "cumsum": 2, "prod": 1, "sum": 1 if name == "sum.default" else 3}
        index = position[name.split(".")[0]]

        def kernel(*args, **kwargs):
            with _ExcludeDispatchKeyGuard(keys):
                first = args[0]
                if first.is_floating_point() and first.dtype != torch.float64 and kwargs.get("dtype") is None \
                        and (len(args) <= index or args[index] is None):
                    if len(args) > index:
                        args = (*args[:index], torch.float32, *args[index + 1:])
                    else:
                        kwargs["dtype"] = torch.float32
                return op(*args, **kwargs)
        return kernel

    lib = torch.library.Library("aten", "IMPL")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel" for CPU's own fp32 ops
        for name in _FP32_OPS:
            base, _, overload = name.partition(".")
            lib.impl(name, fp32(getattr(getattr(torch.ops.aten, base), overload or "default")), "AutocastCPU")
        for name in _FP32_SET_DTYPE:
            base, _, overload = name.partition(".")
            full = f"{base}.{overload or 'default'}"
            lib.impl(name, set_dtype(getattr(getattr(torch.ops.aten, base), overload or "default"), full),
                     "AutocastCPU")
    return lib


@contextlib.contextmanager
def fused_head_like():
    """TRL's fused log-probability head (``trl.kernels.chunked_logprob``) as it allocates on CUDA.

    Without Triton, TRL folds each ``(tokens, 32768)`` tile with torch ops (several fp32 temporaries
    the tile's size) where CUDA runs a Triton kernel that allocates nothing; and it accumulates the
    gradients with ``acc.addmm_(a.float(), b.float())`` (fp32 copies of the tile and the weight chunk)
    where CUDA's ``addmm(out_dtype=float32)`` copies nothing. While measuring, the fold runs one
    position and 4,096 words at a time and the accumulation in blocks of 256 along the longer dimension: the same
    results, with temporaries too small to matter (16 KiB each: well under 1% of the smallest step measured;
    fewer pieces keep the profiler's events, which it records per operation, few)."""
    import trl.kernels.chunked_logprob as kernel

    saved = kernel._forward_tile, kernel._backward_tile, kernel._addmm_fp32

    def in_pieces(fold, width=4096):
        def run(tile, stride, *rest, **kwargs):
            *vectors, start, n_cols = rest  # the per-position vectors, then vocab_start and n_cols
            for i in range(tile.shape[0]):
                rows = [v[i:i + 1] for v in vectors]
                for j in range(0, n_cols, width):
                    fold(tile[i:i + 1, j:j + width], stride, *rows, start + j, min(width, n_cols - j), **kwargs)
        return run

    def addmm_blocks(acc, a, b, block=256):
        if a.dtype == acc.dtype and b.dtype == acc.dtype:
            acc.addmm_(a, b)
        elif a.shape[1] >= a.shape[0]:  # contract in blocks: (M, k) and (k, N) copies
            for j in range(0, a.shape[1], block):
                acc.addmm_(a[:, j:j + block].float(), b[j:j + block].float())
        else:  # rows in blocks: (k, K) copies, and b's once
            wide = b.float()
            for i in range(0, a.shape[0], block):
                acc[i:i + block].addmm_(a[i:i + block].float(), wide)

    kernel._forward_tile, kernel._backward_tile = in_pieces(saved[0]), in_pieces(saved[1])
    kernel._addmm_fp32 = addmm_blocks
    try:
        yield
    finally:
        kernel._forward_tile, kernel._backward_tile, kernel._addmm_fp32 = saved
