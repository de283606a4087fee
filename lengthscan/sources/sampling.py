"""Seeded uniform samples of row positions: never "the first N rows".

The sample is defined by row positions only, as the sorted
``numpy.random.default_rng(seed).choice(n_rows, n, replace=False)``, so it is the same whatever
the process count, the engine, or the order in which batches are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Seed used when none is given; reported in every output.
DEFAULT_SEED = 0

#: With no --sample/--full: measure every row up to this many rows ...
FULL_UP_TO = 200_000
#: ... and a sample of this many rows above it.
DEFAULT_SAMPLE_ROWS = 100_000


class SampleError(ValueError):
    """A --sample value that is neither a positive row count nor a fraction in (0, 1)."""


@dataclass(frozen=True)
class SamplePlan:
    """Rows to measure in one split: ``indices`` is None for a full pass."""

    indices: np.ndarray | None
    rows_total: int
    requested: str | None
    reason: str

    @property
    def full(self) -> bool:
        return self.indices is None

    @property
    def size(self) -> int:
        return self.rows_total if self.indices is None else int(self.indices.size)


def parse_sample(value: str | int | float | None) -> int | float | None:
    """``"600"`` -> 600 rows; ``"0.01"``, ``"1%"`` -> that fraction of rows (``"1.0"``, ``"100%"``:
    every row); None stays None. An int is a row count, a float a fraction (a whole float above 1
    a row count)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SampleError(f"--sample {value!r}: not a number")
    number = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
            except ValueError:
                raise SampleError(f"--sample {value!r}: give a row count (600), a fraction (0.01) or a percentage "
                                  "(1%)") from None
            if text.endswith("%") and not 0 < number <= 1:
                raise SampleError(f"--sample {value!r}: a percentage must lie in (0%, 100%]")
    if isinstance(number, int):
        if number < 1:
            raise SampleError(f"--sample {value!r}: a row count must be >= 1")
        return number
    if number != number or number in (float("inf"), float("-inf")):
        raise SampleError(f"--sample {value!r}: not a finite number")
    if number > 1 and number.is_integer():
        return int(number)
    if not 0 < number <= 1:
        raise SampleError(f"--sample {value!r}: a fraction must lie in (0, 1] (1.0: every row), or give a whole "
                          "row count")
    return float(number)


def sample_indices(n_rows: int, n: int, seed: int) -> np.ndarray:
    """The sorted ``default_rng(seed).choice(n_rows, n, replace=False)``."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_rows, size=n, replace=False)).astype(np.int64)


def plan_sample(n_rows: int, *, sample=None, full: bool = False, seed: int = DEFAULT_SEED) -> SamplePlan:
    """Decide which rows of a split to measure.

    ``full`` measures every row; ``sample`` (rows or a fraction) draws a uniform sample; neither
    measures every row of a small split and a sample of ``DEFAULT_SAMPLE_ROWS`` of a large one.
    """
    if full and sample is not None:
        raise SampleError("give either --full or --sample, not both")
    if full:
        return SamplePlan(None, n_rows, "full", "--full: every row measured")
    amount = parse_sample(sample)
    if amount is None:
        if n_rows <= FULL_UP_TO:
            return SamplePlan(None, n_rows, None, f"default: every row measured ({n_rows:,} <= {FULL_UP_TO:,} rows)")
        indices = sample_indices(n_rows, DEFAULT_SAMPLE_ROWS, seed)
        return SamplePlan(
            indices, n_rows, None,
            f"default: {DEFAULT_SAMPLE_ROWS:,}-row sample of {n_rows:,} rows (over {FULL_UP_TO:,}); "
            "--full measures all",
        )
    n = amount if isinstance(amount, int) else max(1, int(round(amount * n_rows)))
    if n >= n_rows:
        return SamplePlan(None, n_rows, str(sample),
                          f"--sample {sample}: covers all {n_rows:,} rows, every row measured")
    return SamplePlan(sample_indices(n_rows, n, seed), n_rows, str(sample),
                      f"--sample {sample}: {n:,} of {n_rows:,} rows, seed {seed}")
