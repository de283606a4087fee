"""Optimizers by the Trainer's names (``TrainingArguments.optim``): their state and step temporaries.

State is per trained parameter tensor, as each implementation allocates it on the first step:

* ``adamw_torch_fused`` (the Trainer's default), ``adamw_torch`` (foreach), ``adamw_torch_loop``
  (``foreach=False``): ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype (a bf16-loaded
  model keeps bf16 moments) and a 4-byte ``step``. Step temporaries: none for the fused kernel;
  ``_foreach_sqrt(exp_avg_sq)`` for every parameter at once (foreach); two buffers of the largest
  parameter (the loop).
* ``adamw_bnb_8bit`` (= ``adamw_8bit``) and ``paged_adamw_8bit``: bitsandbytes' blockwise 8-bit
  moments: one byte an element each, an fp32 absmax per block of 256; tensors under 4,096
  elements keep fp32 moments. ``paged_adamw_32bit``: fp32 moments. Paged state lives in CUDA
  unified memory: device-resident until the driver evicts it under pressure; the estimate counts
  it resident and reports it as ``optimizer_state_paged`` too.
* ``adafactor`` (``Adafactor(scale_parameter=False, relative_step=False)``, no first moment):
  factored fp32 second moments (a row and a column vector) for matrices, a full one for vectors; the
  step's ``update`` tensors in fp32 for the largest parameter.
* ``sgd``: no momentum (the Trainer passes only ``lr``): no state.
"""

from __future__ import annotations

from lengthscan.memory.tape import BYTES

#: the Trainer's names, and lengthscan's older ones
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_torch_loop", "adamw_bnb_8bit", "adamw_8bit",
              "paged_adamw_8bit", "paged_adamw_32bit", "adafactor", "sgd")
ALIASES = {"adamw": "adamw_torch_fused", "adamw_foreach": "adamw_torch", "adamw_loop": "adamw_torch_loop",
           "adamw_8bit": "adamw_bnb_8bit"}
#: bitsandbytes: tensors smaller than this keep 32-bit state (``min_8bit_size``); the 8-bit block
MIN_8BIT_SIZE, BLOCK_8BIT = 4096, 256
EIGHT_BIT = ("adamw_bnb_8bit", "paged_adamw_8bit")
PAGED = ("paged_adamw_8bit", "paged_adamw_32bit")


def canonical(name: str) -> str:
    """The Trainer's name for ``name`` (an alias resolved); ValueError when it is not priced."""
    name = ALIASES.get(name, name)
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)} (the Trainer's optim names), "
                         f"not {name!r}")
    return name


def state_bytes(name: str, params) -> int:
    """Bytes of optimizer state for the trained parameters ``params`` (objects with ``numel``,
    ``dtype`` and ``shape``: rows x columns, or None for a vector)."""
    name = canonical(name)
    total = 0
    for p in params:
        n, w = p.numel, BYTES[p.dtype]
        if name.startswith("adamw_torch"):
            total += 2 * n * w + 4
        elif name in EIGHT_BIT:
            total += 2 * (n + 4 * -(-n // BLOCK_8BIT)) if n >= MIN_8BIT_SIZE else 8 * n
        elif name == "paged_adamw_32bit":
            total += 8 * n
        elif name == "adafactor":
            rows, cols = p.shape if p.shape else (n, None)
            total += 4 * ((rows + cols) if cols else n) + 4  # fp32 (a low-precision gradient is upcast), RMS
    return total


def temporaries(name: str, params) -> int:
    """Bytes the optimizer step allocates beyond its state (and frees before it returns)."""
    name = canonical(name)
    params = list(params)
    if name == "adamw_torch":
        return sum(p.numel * BYTES[p.dtype] for p in params)
    if name == "adamw_torch_loop":
        return 2 * max((p.numel * BYTES[p.dtype] for p in params), default=0)
    if name == "adafactor":  # update = grad**2 + eps, its factored approximation, the fp32 copy of a low dtype
        return 3 * max((p.numel * 4 for p in params), default=0)
    return 0


def paged(name: str) -> bool:
    return canonical(name) in PAGED
