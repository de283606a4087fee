"""Limits for a memory budget: the longest lengths and largest batch whose predicted peak fits."""

from __future__ import annotations

from collections.abc import Callable

from lengthscan.memory.api import estimate
from lengthscan.memory.options import MemoryOptions, Shape


def usable_bytes(budget_bytes: int, margin: float = 0.1) -> int:
    """The part of a device's memory a prediction may use: ``budget x (1 - margin)``.

    The margin covers what the model leaves out (allocator fragmentation and reserve, cuBLAS and
    cuDNN workspaces) and its own error; 10% suits the validated families.
    """
    if not 0 <= margin < 1:
        raise ValueError("margin must be in [0, 1)")
    return int(budget_bytes * (1 - margin))


def largest_fitting(config, budget_bytes: int, make_shape: Callable[[int], Shape], high: int, *,
                    options: MemoryOptions = MemoryOptions(), low: int = 1, margin: float = 0.1) -> int | None:
    """The largest ``n`` in ``[low, high]`` whose ``make_shape(n)`` is predicted to fit, or None.

    The peak never decreases when the batch or a length grows, so a bisection finds it in about
    log2(high - low) estimates. ``make_shape`` maps ``n`` to a batch shape, e.g.
    ``lambda n: Shape(8, n, 128, padding=True)`` for the longest input at batch 8 and 128 target
    tokens, or ``lambda n: Shape(n, 1024, 128, padding=True)`` for the largest batch.
    """
    limit = usable_bytes(budget_bytes, margin)

    def fits(n: int) -> bool:
        return estimate(config, make_shape(n), options).peak_bytes <= limit

    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low
