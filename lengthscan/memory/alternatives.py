"""Changes to the run that make a batch fit, each priced: the advice after "does not fit".

Besides length limits (``advice.py``), the changes a demanding engineer tries, cheapest first
(what each costs the run, not its memory): gradient checkpointing (about a third more compute,
same result), an 8-bit optimizer (bitsandbytes' AdamW: same updates within quantization noise),
bf16 weights (no fp32 master copy: bf16 optimizer state), LoRA (r=16 on every linear layer: a
different training run), QLoRA (LoRA on a 4-bit NF4 base), and LoRA or QLoRA with checkpointing.
Each is priced on the same batch shape; the first that fits is the advice.
"""

from __future__ import annotations

from dataclasses import replace

from lengthscan.memory.adapters import Lora
from lengthscan.memory.api import estimate
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.quant import Quantization

#: the adapter and base the LoRA and QLoRA alternatives price (a common recipe)
LORA = Lora(r=16, alpha=32, dropout=0.05, targets=("all-linear",), source="advice")
NF4 = Quantization("nf4", True, "bf16", source="advice")


def candidates(options: MemoryOptions) -> list[tuple[str, str, MemoryOptions]]:
    """(name, flags, options) of each change not already made, cheapest first."""
    out = []
    ckpt = replace(options, gradient_checkpointing=True)
    if not options.gradient_checkpointing:
        out.append(("gradient checkpointing", "--gradient-checkpointing", ckpt))
    if options.optimizer in ("adamw_torch_fused", "adamw_torch", "adamw_torch_loop", "paged_adamw_32bit"):
        out.append(("an 8-bit optimizer", "--optimizer adamw_bnb_8bit", replace(options, optimizer="adamw_bnb_8bit")))
    low = "bf16" if options.precision in ("bf16", "fp32") else "fp16"
    if options.torch_dtype == "fp32" and options.adapter is None:
        out.append((f"{low} weights", f"--torch-dtype {low}", replace(options, torch_dtype=low)))
    if options.adapter is None:
        lora = replace(options, adapter=LORA, torch_dtype=low, precision=low if options.precision == "fp32"
                       else options.precision)
        out.append(("LoRA (r=16, all-linear)", f"--lora-r 16 --lora-dropout 0.05 --torch-dtype {low}", lora))
    if options.quantization is None:
        base = options if options.adapter is not None else replace(options, adapter=LORA)
        qlora = replace(base, quantization=NF4, torch_dtype=low, precision=low if options.precision == "fp32"
                        else options.precision)
        flags = "--quantization-config <bnb 4-bit NF4>" + ("" if options.adapter else " --lora-r 16")
        out.append(("QLoRA (4-bit NF4 base)" if options.adapter is None else "a 4-bit NF4 base", flags, qlora))
        if not options.gradient_checkpointing:
            out.append(("QLoRA and gradient checkpointing", flags + " --gradient-checkpointing",
                        replace(qlora, gradient_checkpointing=True)))
    return out


def alternatives(config, shape: Shape, options: MemoryOptions, usable_bytes: int) -> dict:
    """Each change priced on ``shape``, and the first that fits ``usable_bytes`` (None: none does)."""
    rows = []
    for name, flags, changed in candidates(options):
        try:
            peak = estimate(config, shape, changed).peak_bytes
        except ValueError:  # a family that cannot take it (a model without linear layers to adapt ...)
            continue
        rows.append({"change": name, "flags": flags, "peak_bytes": peak, "fits": peak <= usable_bytes})
    first = next((r for r in rows if r["fits"]), None)
    return {"shape": shape.to_dict(), "usable_bytes": usable_bytes, "options": rows,
            "cheapest": None if first is None else first["change"]}


def advice_line(found: dict, size) -> str:
    """One sentence: the cheapest change that fits and its peak, or that none does."""
    if not found["options"]:
        return ""
    first = next((r for r in found["options"] if r["fits"]), None)
    if first is None:
        best = min(found["options"], key=lambda r: r["peak_bytes"])
        return (f"no single change fits: the smallest peak is {size(best['peak_bytes'])} with {best['change']} "
                f"({best['flags']}); limit the lengths too")
    return f"cheapest change that fits: {first['change']} ({first['flags']}): peak {size(first['peak_bytes'])}"
