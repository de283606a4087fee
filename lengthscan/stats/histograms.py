"""Exact, mergeable length statistics: pure numpy, no I/O, no printing.

Everything starts from a sparse histogram of integer lengths (distinct value -> count). Count,
mean, min, max and nearest-rank percentiles follow exactly from it, two shards' histograms merge
into exactly the histogram of their union, and display bins are derived from it. Accumulate,
merge, then display: three separate steps, as lhotse does for its cut statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Percentiles reported for every length (nearest rank, numpy ``method="inverted_cdf"``).
PERCENTILES: tuple[float, ...] = (25, 50, 75, 90, 95, 99, 99.5, 99.9)

#: Ratios are kept as integers in these units (1/1000) so that they merge exactly too.
RATIO_SCALE = 1000

#: z for two-sided 95% intervals.
Z95 = 1.959963984540054


@dataclass(frozen=True, eq=False)
class Histogram:
    """Sparse counts of integer values: ``values`` sorted and distinct, ``counts`` > 0."""

    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, data) -> "Histogram":
        """Histogram of an array of integer values."""
        arr = np.asarray(data, dtype=np.int64).ravel()
        if arr.size == 0:
            return cls()
        values, counts = np.unique(arr, return_counts=True)
        return cls(values.astype(np.int64), counts.astype(np.int64))

    @classmethod
    def from_pairs(cls, values, counts) -> "Histogram":
        """Histogram from (value, count) lists, as stored in ``report.json``."""
        return merge_histograms([cls(np.asarray(values, np.int64), np.asarray(counts, np.int64))])

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Histogram)
            and np.array_equal(self.values, other.values)
            and np.array_equal(self.counts, other.counts)
        )

    def to_dict(self) -> dict:
        return {"values": self.values.tolist(), "counts": self.counts.tolist()}


def merge_histograms(parts) -> Histogram:
    """Exactly the histogram of the union of ``parts``."""
    parts = [p for p in parts if p.values.size]
    if not parts:
        return Histogram()
    values = np.concatenate([p.values for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    uniq, inverse = np.unique(values, return_inverse=True)
    summed = np.zeros(uniq.size, np.int64)
    np.add.at(summed, inverse, counts)
    keep = summed > 0
    return Histogram(uniq[keep], summed[keep])


def nearest_rank_index(n: int, percent: float) -> int:
    """0-based rank of the ``percent`` percentile of ``n`` sorted values, as numpy's inverted_cdf."""
    virtual = n * (percent / 100.0) - 1
    lower = math.floor(virtual)
    index = lower if virtual == lower else lower + 1
    return min(max(index, 0), n - 1)


def value_at_rank(hist: Histogram, index: int) -> int:
    """The ``index``-th smallest value (0-based) of the histogram."""
    cum = np.cumsum(hist.counts)
    return int(hist.values[int(np.searchsorted(cum, index + 1, side="left"))])


def percentiles(hist: Histogram, qs=PERCENTILES) -> dict[str, int | None]:
    """Nearest-rank percentiles, keyed ``p50``, ``p99.9`` ..."""
    n = hist.n
    return {pkey(q): (value_at_rank(hist, nearest_rank_index(n, q)) if n else None) for q in qs}


def pkey(q: float) -> str:
    """``99.9`` -> ``'p99.9'``, ``50`` -> ``'p50'``."""
    return f"p{q:g}"


def percentile_interval(hist: Histogram, q: float, z: float = Z95) -> tuple[int, int | None]:
    """Distribution-free interval for a population percentile from a sample's histogram.

    The order statistics whose ranks bound ``n*q`` +- z * sqrt(n q (1-q)) (normal approximation
    to the binomial rank distribution). The upper end is None when it lies beyond the sample's
    largest value: the sample cannot say how far the tail goes.
    """
    n = hist.n
    p = q / 100.0
    half = z * math.sqrt(n * p * (1 - p))
    lo = max(int(math.floor(n * p - half)), 1)
    hi = int(math.ceil(n * p + half)) + 1
    lower = value_at_rank(hist, min(lo, n) - 1)
    upper = value_at_rank(hist, hi - 1) if hi <= n else None
    return lower, upper


def proportion_interval(k: int, n: int, population: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion k/n sampled without replacement from ``population``."""
    if n == 0:
        return 0.0, 1.0
    if n >= population:
        return k / n, k / n
    fpc = math.sqrt((population - n) / max(population - 1, 1))
    zz = z * fpc
    p = k / n
    denom = 1 + zz * zz / n
    centre = (p + zz * zz / (2 * n)) / denom
    half = zz * math.sqrt(p * (1 - p) / n + zz * zz / (4 * n * n)) / denom
    lower = 0.0 if k == 0 else max(0.0, centre - half)
    upper = 1.0 if k == n else min(1.0, centre + half)
    return lower, upper


def log_bins(max_value: int, per_octave: int = 4) -> np.ndarray:
    """Display bin edges: 0, 1, 2, ... then log-spaced (``per_octave`` bins per doubling).

    Edges are integers and strictly increasing; the last edge is > ``max_value`` so every value
    falls in ``[edges[i], edges[i+1])``.
    """
    edges = [0, 1, 2, 3, 4]
    k = 2 * per_octave + 1
    while edges[-1] <= max_value:
        edge = int(math.ceil(2 ** (k / per_octave)))
        if edge > edges[-1]:
            edges.append(edge)
        k += 1
    return np.asarray(edges, np.int64)


def binned(hist: Histogram, edges: np.ndarray) -> np.ndarray:
    """Counts of the histogram's values in ``[edges[i], edges[i+1])``."""
    idx = np.searchsorted(edges, hist.values, side="right") - 1
    out = np.zeros(len(edges) - 1, np.int64)
    np.add.at(out, idx, hist.counts)
    return out


@dataclass(frozen=True)
class Summary:
    """What one histogram says: exact when ``sampled`` is False."""

    count: int
    min: int | None
    mean: float | None
    max: int | None
    percentiles: dict[str, int | None]
    intervals: dict[str, tuple[int, int | None]] | None = None

    def to_dict(self) -> dict:
        out = {
            "count": self.count,
            "min": self.min,
            "mean": self.mean,
            "max": self.max,
            "percentiles": dict(self.percentiles),
        }
        if self.intervals is not None:
            out["intervals"] = {k: list(v) for k, v in self.intervals.items()}
        return out


def summarize(hist: Histogram, *, sampled: bool = False, scale: int = 1) -> Summary:
    """Count, min, mean, max and percentiles; 95% intervals when the histogram is a sample.

    ``scale`` divides every value (ratios are stored in integer units of 1/``scale``).
    """
    n = hist.n
    if n == 0:
        return Summary(0, None, None, None, {pkey(q): None for q in PERCENTILES})

    def conv(v):
        return v if scale == 1 or v is None else v / scale

    total = int((hist.values * hist.counts).sum())
    pct = {k: conv(v) for k, v in percentiles(hist).items()}
    intervals = None
    if sampled:
        intervals = {}
        for q in PERCENTILES:
            lo, hi = percentile_interval(hist, q)
            intervals[pkey(q)] = (conv(lo), conv(hi))
    return Summary(
        count=n,
        min=conv(int(hist.values[0])),
        mean=total / n / scale,
        max=conv(int(hist.values[-1])),
        percentiles=pct,
        intervals=intervals,
    )


def ratio_units(numer: np.ndarray, denom: np.ndarray) -> np.ndarray:
    """``numer/denom`` rounded to integer units of 1/RATIO_SCALE (denom > 0)."""
    return np.rint(numer.astype(np.float64) * RATIO_SCALE / denom.astype(np.float64)).astype(np.int64)


def metric_values(metric: str, base: dict[str, np.ndarray]) -> np.ndarray:
    """A measurement's values (NaN where none), or a ratio: x/0 is +inf for x > 0 and NaN for 0/0."""
    if "/" not in metric:
        return _as_float(base[metric])
    num_name, den_name = metric.split("/")
    num, den = _as_float(base[num_name]), _as_float(base[den_name])
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    out[(den == 0) & (num == 0)] = np.nan
    return out


def ratio_units_of(metric_values_: np.ndarray) -> np.ndarray:
    """Finite ratio values in integer units of 1/RATIO_SCALE (for percentile and z resolution)."""
    v = metric_values_[np.isfinite(metric_values_)]
    return np.rint(v * RATIO_SCALE).astype(np.int64)


def _as_float(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float64)
    out[~(out >= 0)] = np.nan
    return out


@dataclass(frozen=True, eq=False)
class JointHistogram:
    """Counts of (input bin, target bin) pairs on shared log-spaced integer bins.

    Bins are a fixed function of the value (``bin_index``), not of the data, so joint
    histograms of two shards add up exactly.
    """

    pairs: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, x: np.ndarray, y: np.ndarray) -> "JointHistogram":
        if len(x) == 0:
            return cls()
        keys = np.stack([bin_index(x), bin_index(y)], axis=1)
        pairs, counts = np.unique(keys, axis=0, return_counts=True)
        return cls(pairs.astype(np.int64), counts.astype(np.int64))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, JointHistogram)
            and np.array_equal(self.pairs, other.pairs)
            and np.array_equal(self.counts, other.counts)
        )

    def to_dict(self) -> dict:
        edges = JOINT_EDGES
        return {
            "edges": edges.tolist(),
            "cells": [[int(a), int(b), int(c)] for (a, b), c in zip(self.pairs, self.counts)],
        }


def merge_joint(parts) -> JointHistogram:
    parts = [p for p in parts if p.counts.size]
    if not parts:
        return JointHistogram()
    pairs = np.concatenate([p.pairs for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    summed = np.zeros(len(uniq), np.int64)
    np.add.at(summed, inverse.ravel(), counts)
    return JointHistogram(uniq, summed)


#: Fixed edges for joint histograms, wide enough for any token or frame count.
JOINT_EDGES = log_bins(2**40, per_octave=2)


def bin_index(values: np.ndarray) -> np.ndarray:
    return np.searchsorted(JOINT_EDGES, np.asarray(values, np.int64), side="right") - 1


def display_bins(hist: Histogram, scale: int = 1) -> dict:
    """Counts on log-spaced integer bins ``[edges[i], edges[i+1])``, trimmed to the data.

    Edges are in the measurement's unit (divided by ``scale``).
    """
    if hist.n == 0:
        return {"edges": [], "counts": []}
    edges = log_bins(int(hist.values[-1]))
    counts = binned(hist, edges)
    first = int(np.searchsorted(edges, hist.values[0], side="right") - 1)
    shown = edges[first:] if scale == 1 else edges[first:] / scale
    return {"edges": shown.tolist(), "counts": counts[first:].tolist()}
