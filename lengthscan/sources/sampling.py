"""Seeded samples of row positions, by row or by block: never "the first N rows".

A row sample is defined by row positions only, as the sorted
``numpy.random.default_rng(seed).choice(n_rows, n, replace=False)``, so it is the same whatever
the process count, the engine, or the order in which batches are read.

A block sample (``unit="block"``) draws whole Parquet row groups and measures every row in them:
a uniform 1% row sample touches 1 - 0.99^R of the row groups of R rows (63% at R = 100, all from
R = 1,000), so it reads nearly every byte; 1% of the blocks reads about 1%. The draw is
stratified by file: file i is due n * G_i / N of its G_i blocks (n rows wanted of N, so every
file in proportion to its rows when its groups are alike); each file gets the whole part of
that, the fractions are shared out by one systematic draw over the files (so a file due 0.3
blocks gets one with probability 0.3), each file's blocks are chosen at random among its own,
and while the rows drawn fall short of n, further blocks are added at random. It depends only on
the seed and on the files' row-group sizes in order: the same files draw the same rows wherever
they live. ``BlockDesign`` keeps the blocks, for the statistics (``stats.design``).
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


#: A local Parquet source larger than this is block-sampled by default (a scan of it takes minutes).
BLOCK_DEFAULT_BYTES = 2 << 30


class SampleError(ValueError):
    """A --sample value that is neither a positive row count nor a fraction in (0, 1)."""


@dataclass(frozen=True, eq=False)
class BlockDesign:
    """The blocks a block sample drew: each one's first row and end (global row positions, in row
    order), its file (the stratum), and how many blocks the split has."""

    starts: np.ndarray
    stops: np.ndarray
    files: np.ndarray
    blocks_total: int

    @property
    def count(self) -> int:
        return int(self.starts.size)

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        """The drawn block (0..count-1) each sampled row lies in."""
        return np.searchsorted(self.starts, rows, side="right") - 1


@dataclass(frozen=True)
class SamplePlan:
    """Rows to measure in one split: ``indices`` is None for a full pass; ``design`` the blocks of a
    block sample (None for rows)."""

    indices: np.ndarray | None
    rows_total: int
    requested: str | None
    reason: str
    unit: str = "row"
    design: BlockDesign | None = None

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


def plan_sample(n_rows: int, *, sample=None, full: bool = False, seed: int = DEFAULT_SEED,
                unit: str = "row", blocks: list | None = None, why_unit: str = "") -> SamplePlan:
    """Decide which rows of a split to measure.

    ``full`` measures every row; ``sample`` (rows or a fraction) draws a sample; neither measures
    every row of a small split and a sample of ``DEFAULT_SAMPLE_ROWS`` of a large one. With
    ``unit="block"`` the sample draws whole blocks (``blocks``: each file's row-group sizes; a
    source without them, JSON Lines or CSV, is sampled by row, said in the reason). ``why_unit``
    says why this unit was chosen, for the reason.
    """
    if full and sample is not None:
        raise SampleError("give either --full or --sample, not both")
    if full:
        return SamplePlan(None, n_rows, "full", "--full: every row measured")
    amount = parse_sample(sample)
    if amount is None and n_rows <= FULL_UP_TO:
        return SamplePlan(None, n_rows, None, f"default: every row measured ({n_rows:,} <= {FULL_UP_TO:,} rows)")
    if amount is None:
        n, head = DEFAULT_SAMPLE_ROWS, f"default: {DEFAULT_SAMPLE_ROWS:,}-row sample of {n_rows:,} rows (over " \
                                       f"{FULL_UP_TO:,}; --full measures all)"
    else:
        n = amount if isinstance(amount, int) else max(1, int(round(amount * n_rows)))
        head = f"--sample {sample}"
        if n >= n_rows:
            return SamplePlan(None, n_rows, str(sample), f"{head}: covers all {n_rows:,} rows, every row measured")
    requested = None if amount is None else str(sample)
    if unit == "block" and blocks:
        design = draw_blocks(blocks, n, seed)
        indices = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(design.starts, design.stops)])
        if indices.size >= n_rows:
            return SamplePlan(None, n_rows, requested, f"{head}: the blocks drawn cover all {n_rows:,} rows, every "
                                                       "row measured")
        return SamplePlan(indices, n_rows, requested,
                          f"{head}: {indices.size:,} of {n_rows:,} rows in {design.count:,} of {design.blocks_total:,} "
                          f"blocks (Parquet row groups, or runs of pages of huge ones), seed {seed}{why_unit}", "block",
                          design)
    note = ("; --sample-unit block: these files have no row groups (JSON Lines, CSV ...), so rows are sampled while "
            "the files are read whole") if unit == "block" else ""
    return SamplePlan(sample_indices(n_rows, n, seed), n_rows, requested,
                      f"{head}: {n:,} of {n_rows:,} rows, seed {seed}{note}")


def draw_blocks(blocks: list, n: int, seed: int) -> BlockDesign:
    """Whole blocks with at least ``n`` rows in all, stratified by file (see the module docstring).
    ``blocks``: each file's blocks' row counts, in row order."""
    rng = np.random.default_rng(seed)
    sizes = [np.asarray(b, dtype=np.int64) for b in blocks]
    rows_total = int(sum(s.sum() for s in sizes))
    due = np.array([n * s.size / rows_total for s in sizes])
    whole = np.floor(due)
    cum = np.cumsum(due - whole)
    # one systematic draw: file i gets an extra block when u + j lies in (cum[i-1], cum[i]] for some j
    u = rng.random()
    prev = np.concatenate([[0.0], cum[:-1]])
    extra = np.floor(cum - u + 1) - np.floor(prev - u + 1)
    counts = np.minimum(whole + extra, [s.size for s in sizes]).astype(np.int64)
    chosen = [np.sort(rng.choice(s.size, size=int(k), replace=False)) if k else np.zeros(0, np.int64)
              for s, k in zip(sizes, counts)]
    taken = sum(int(s[c].sum()) for s, c in zip(sizes, chosen))
    if taken < n:  # the blocks drawn were smaller than their files' average: add blocks at random
        rest = [(i, g) for i, s in enumerate(sizes) for g in np.setdiff1d(np.arange(s.size), chosen[i])]
        order = rng.permutation(len(rest))
        added: dict[int, list] = {}
        for k in order:
            if taken >= n:
                break
            i, g = rest[k]
            added.setdefault(i, []).append(g)
            taken += int(sizes[i][g])
        chosen = [np.sort(np.concatenate([c, np.asarray(added.get(i, []), np.int64)])) for i, c in enumerate(chosen)]
    starts, stops, files, offset = [], [], [], 0
    for i, (s, c) in enumerate(zip(sizes, chosen)):
        bounds = offset + np.concatenate([[0], np.cumsum(s)])
        starts.append(bounds[c])
        stops.append(bounds[c + 1])
        files.append(np.full(c.size, i, np.int64))
        offset = int(bounds[-1])
    return BlockDesign(np.concatenate(starts).astype(np.int64), np.concatenate(stops).astype(np.int64),
                       np.concatenate(files), int(sum(s.size for s in sizes)))


def choose_unit(requested: str | None, *, remote: bool, has_blocks: bool, local_bytes) -> tuple[str, str]:
    """(unit, why) for a split: the unit asked, else block for a remote Parquet source and a local
    one over ``BLOCK_DEFAULT_BYTES`` (``local_bytes()`` gives its size), else row."""
    if requested is not None:
        return requested, ""
    if has_blocks and remote:
        return "block", " (block: the default for remote Parquet; --sample-unit row draws rows)"
    if has_blocks and local_bytes() > BLOCK_DEFAULT_BYTES:
        return "block", (f" (block: the default for Parquet over {BLOCK_DEFAULT_BYTES >> 30} GiB; --sample-unit row "
                         "draws rows)")
    return "row", ""
