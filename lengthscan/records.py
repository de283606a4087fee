"""Every record that crosses a module boundary: plain frozen dataclasses.

Names say the role and the unit: a measurement is ``{role}_{unit}`` (``input_tokens``,
``target_tokens``); ``to_dict()`` gives what ``report.json`` stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .stats import (
    RATIO_SCALE,
    Histogram,
    JointHistogram,
    Summary,
    binned,
    log_bins,
    merge_histograms,
    merge_joint,
    ratio_units,
    summarize,
)

#: Version of the layout of ``report.json``; bump on any incompatible change.
SCHEMA_VERSION = 1

ROLES = ("input", "target")

#: Per-row flag codes, as stored in ``lengths.parquet`` (``{role}_flag``).
FLAG_OK, FLAG_MISSING, FLAG_EMPTY, FLAG_TOO_LONG = 0, 1, 2, 3
FLAG_NAMES = {FLAG_OK: None, FLAG_MISSING: "missing", FLAG_EMPTY: "empty", FLAG_TOO_LONG: "too_long"}


@dataclass(frozen=True)
class FieldSpec:
    """One measured column: its role (input or target), source column and unit."""

    role: str
    column: str
    unit: str = "tokens"

    @property
    def name(self) -> str:
        return f"{self.role}_{self.unit}"


@dataclass(frozen=True, eq=False)
class FieldStats:
    """Mergeable statistics of one measurement over some rows.

    ``histogram`` holds every measured length (empty strings included); ``missing`` counts None
    values, ``empty`` the empty strings among the measured, ``unmeasured`` rows too long to
    tokenize within ``max_chars`` (recorded, never silently skipped).
    """

    spec: FieldSpec
    rows: int = 0
    missing: int = 0
    empty: int = 0
    unmeasured: int = 0
    histogram: Histogram = field(default_factory=Histogram)

    def merge(self, other: "FieldStats") -> "FieldStats":
        if other.spec != self.spec:
            raise ValueError(f"cannot merge {self.spec} with {other.spec}")
        return FieldStats(
            self.spec,
            self.rows + other.rows,
            self.missing + other.missing,
            self.empty + other.empty,
            self.unmeasured + other.unmeasured,
            merge_histograms([self.histogram, other.histogram]),
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, FieldStats) and self.to_dict(False) == other.to_dict(False)

    def summary(self, sampled: bool = False) -> Summary:
        return summarize(self.histogram, sampled=sampled)

    def to_dict(self, sampled: bool = False) -> dict:
        return {
            "name": self.spec.name,
            "role": self.spec.role,
            "column": self.spec.column,
            "unit": self.spec.unit,
            "rows": self.rows,
            "missing": self.missing,
            "empty": self.empty,
            "unmeasured": self.unmeasured,
            **self.summary(sampled).to_dict(),
            "histogram": self.histogram.to_dict(),
            "display_histogram": display_histogram(self.histogram),
        }


@dataclass(frozen=True, eq=False)
class PairStats:
    """Joint input x target distribution and the target/input ratio, over rows with both."""

    input_name: str
    target_name: str
    joint: JointHistogram = field(default_factory=JointHistogram)
    ratio: Histogram = field(default_factory=Histogram)

    def merge(self, other: "PairStats") -> "PairStats":
        return PairStats(
            self.input_name,
            self.target_name,
            merge_joint([self.joint, other.joint]),
            merge_histograms([self.ratio, other.ratio]),
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, PairStats) and self.to_dict() == other.to_dict()

    @property
    def rows(self) -> int:
        return self.ratio.n

    def to_dict(self, sampled: bool = False) -> dict:
        return {
            "x": self.input_name,
            "y": self.target_name,
            "rows": self.rows,
            "ratio": {
                "name": f"{self.target_name}/{self.input_name}",
                "resolution": 1 / RATIO_SCALE,
                **summarize(self.ratio, sampled=sampled, scale=RATIO_SCALE).to_dict(),
            },
            "joint": self.joint.to_dict(),
        }


@dataclass(frozen=True)
class SampleInfo:
    """Which rows were measured and why."""

    full: bool
    rows_total: int
    rows_measured: int
    seed: int
    requested: str | None
    reason: str

    def to_dict(self) -> dict:
        return {
            "mode": "full" if self.full else "sample",
            "rows_total": self.rows_total,
            "rows_measured": self.rows_measured,
            "seed": self.seed,
            "requested": self.requested,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer as measured: its name, class, a hash of its files, and the count method per role."""

    name: str
    cls: str
    is_fast: bool
    hash: str
    methods: dict[str, str]
    model_max_length: int | None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "class": self.cls,
            "is_fast": self.is_fast,
            "hash": self.hash,
            "methods": dict(self.methods),
            "model_max_length": self.model_max_length,
        }


@dataclass(frozen=True)
class LimitCheck:
    """Rows over one limit; extrapolated to the whole split with a 95% interval when sampled."""

    name: str
    limit: int
    origin: str
    over: int
    measured: int
    estimate: float
    interval: tuple[float, float]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "limit": self.limit,
            "origin": self.origin,
            "over_in_measured": self.over,
            "measured": self.measured,
            "estimated_over": self.estimate,
            "interval": list(self.interval),
        }


@dataclass(frozen=True)
class SplitAudit:
    """The audit of one split."""

    split: str
    sample: SampleInfo
    fields: tuple[FieldStats, ...]
    pair: PairStats | None
    limits: tuple[LimitCheck, ...] = ()

    def field(self, name: str) -> FieldStats:
        for f in self.fields:
            if f.spec.name == name:
                return f
        raise KeyError(name)

    def to_dict(self) -> dict:
        sampled = not self.sample.full
        return {
            "split": self.split,
            "sample": self.sample.to_dict(),
            "fields": {f.spec.name: f.to_dict(sampled) for f in self.fields},
            "pair": self.pair.to_dict(sampled) if self.pair else None,
            "limits": [c.to_dict() for c in self.limits],
        }


@dataclass(frozen=True)
class AuditResult:
    """What ``lengthscan.audit`` returns and ``report.json`` stores."""

    source: str
    source_fingerprint: str
    splits: tuple[SplitAudit, ...]
    tokenizer: TokenizerInfo | None
    fields: tuple[FieldSpec, ...]
    seed: int
    command: str | None
    version: str
    created: str
    out_dir: str | None = None
    cache_hits: int = 0
    seconds: float = 0.0

    def split(self, name: str) -> SplitAudit:
        for s in self.splits:
            if s.split == name:
                return s
        raise KeyError(name)

    @property
    def rows_measured(self) -> int:
        return sum(s.sample.rows_measured for s in self.splits)

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "lengthscan_version": self.version,
            "created": self.created,
            "command": self.command,
            "source": {"spec": self.source, "fingerprint": self.source_fingerprint},
            "tokenizer": self.tokenizer.to_dict() if self.tokenizer else None,
            "fields": [{"name": f.name, "role": f.role, "column": f.column, "unit": f.unit} for f in self.fields],
            "seed": self.seed,
            "sample_size": self.rows_measured,
            "cache_hits": self.cache_hits,
            "seconds": round(self.seconds, 3),
            "splits": [s.to_dict() for s in self.splits],
        }


def stats_from_lengths(spec: FieldSpec, lengths: np.ndarray, flags: np.ndarray) -> FieldStats:
    """Statistics of one batch of per-row lengths (-1 where unmeasured) and flags."""
    measured = lengths[lengths >= 0]
    return FieldStats(
        spec,
        rows=int(lengths.size),
        missing=int((flags == FLAG_MISSING).sum()),
        empty=int((flags == FLAG_EMPTY).sum()),
        unmeasured=int((flags == FLAG_TOO_LONG).sum()),
        histogram=Histogram.of(measured),
    )


def pair_from_lengths(x_name: str, y_name: str, x: np.ndarray, y: np.ndarray) -> PairStats:
    """Pair statistics of one batch, over rows where both lengths exist and the input is > 0."""
    both = (x > 0) & (y >= 0)
    xs, ys = x[both], y[both]
    return PairStats(x_name, y_name, JointHistogram.of(xs, ys), Histogram.of(ratio_units(ys, xs)))


def display_histogram(hist: Histogram) -> dict:
    """Counts on log-spaced integer bins ``[edges[i], edges[i+1])``, trimmed to the data."""
    if hist.n == 0:
        return {"edges": [], "counts": []}
    edges = log_bins(int(hist.values[-1]))
    counts = binned(hist, edges)
    first = int(np.searchsorted(edges, hist.values[0], side="right") - 1)
    return {"edges": edges[first:].tolist(), "counts": counts[first:].tolist()}
