"""Mergeable statistics records: one measurement's stats, the input x target pair, limit checks, a split's audit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lengthscan.measure.limits import Ceiling
from lengthscan.measure.records import BOUNDED_FLAGS, FLAG_CODES, FLAG_MISSING, MEASURED_FLAGS, FieldSpec
from lengthscan.stats.histograms import (
    RATIO_SCALE,
    Histogram,
    JointHistogram,
    Summary,
    display_bins,
    merge_histograms,
    merge_joint,
    summarize,
)


@dataclass(frozen=True, eq=False)
class FieldStats:
    """Mergeable statistics of one measurement over some rows.

    ``histogram`` holds every measured length (empty strings included) in integer units of
    1/``spec.scale``; ``flags`` counts rows per flag name (missing, empty, too_long,
    missing_file, unreadable, truncated); ``decoded`` counts audio measured by decoding because its
    header had no reliable length. Rows without a length keep their reason, never silently skipped.
    """

    spec: FieldSpec
    rows: int = 0
    flags: dict = field(default_factory=dict)
    histogram: Histogram = field(default_factory=Histogram)
    decoded: int = 0

    @property
    def missing(self) -> int:
        return self.flags.get("missing", 0)

    @property
    def empty(self) -> int:
        return self.flags.get("empty", 0)

    @property
    def unmeasured(self) -> int:
        """Rows with a value but no length (too long, missing or unreadable file)."""
        skip = MEASURED_FLAGS + BOUNDED_FLAGS + (FLAG_MISSING,)
        return sum(n for name, n in self.flags.items() if FLAG_CODES[name] not in skip)

    @property
    def bounded(self) -> int:
        """Rows decided by a bound in decide-only mode (no exact length)."""
        return sum(n for name, n in self.flags.items() if FLAG_CODES[name] in BOUNDED_FLAGS)

    def merge(self, other: "FieldStats") -> "FieldStats":
        if other.spec != self.spec:
            raise ValueError(f"cannot merge {self.spec} with {other.spec}")
        return FieldStats(
            self.spec,
            self.rows + other.rows,
            {k: self.flags.get(k, 0) + other.flags.get(k, 0) for k in sorted({*self.flags, *other.flags})},
            merge_histograms([self.histogram, other.histogram]),
            self.decoded + other.decoded,
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, FieldStats) and self.to_dict(False) == other.to_dict(False)

    def summary(self, sampled: bool = False) -> Summary:
        return summarize(self.histogram, sampled=sampled, scale=self.spec.scale)

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
            "bounded": self.bounded,
            "flags": dict(self.flags),
            "decoded": self.decoded,
            **self.summary(sampled).to_dict(),
            "scale": self.spec.scale,
            "histogram": self.histogram.to_dict(),
            "display_histogram": display_bins(self.histogram, self.spec.scale),
        }


@dataclass(frozen=True, eq=False)
class PairStats:
    """Joint input x target distribution and the target/input ratio, over rows with both."""

    input_name: str
    target_name: str
    joint: JointHistogram = field(default_factory=JointHistogram)
    ratio: Histogram = field(default_factory=Histogram)
    x_scale: int = 1
    y_scale: int = 1

    def merge(self, other: "PairStats") -> "PairStats":
        return PairStats(
            self.input_name,
            self.target_name,
            merge_joint([self.joint, other.joint]),
            merge_histograms([self.ratio, other.ratio]),
            self.x_scale,
            self.y_scale,
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
            "x_scale": self.x_scale,
            "y_scale": self.y_scale,
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
    unit: str = "row"
    blocks: int | None = None          # a block sample: the blocks drawn, of ``blocks_total``
    blocks_total: int | None = None

    def to_dict(self) -> dict:
        return {
            "mode": "full" if self.full else "sample",
            "unit": None if self.full else self.unit,
            "rows_total": self.rows_total,
            "rows_measured": self.rows_measured,
            "seed": self.seed,
            "requested": self.requested,
            "reason": self.reason,
            "blocks_drawn": self.blocks,
            "blocks_total": self.blocks_total,
        }


@dataclass(frozen=True)
class CeilingCheck:
    """Rows over one ceiling, the longest of them, and, when sampled, the whole split's estimate."""

    limit: Ceiling
    over: int
    measured: int
    estimate: float
    interval: tuple[float, float]
    worst: tuple[tuple[int, float], ...] = ()
    unknown: int = 0  # rows decide-only's bounds leave undecided against this limit

    @property
    def name(self) -> str:
        return self.limit.name

    def to_dict(self) -> dict:
        return {
            "name": self.limit.name,
            "measure": self.limit.measure,
            "limit": self.limit.value,
            "origin": self.limit.origin,
            "over_in_measured": self.over,
            "measured": self.measured,
            "estimated_over": self.estimate,
            "interval": list(self.interval),
            "worst_rows": [{"row": r, "value": v} for r, v in self.worst],
            "unknown_by_bound": self.unknown,
        }


@dataclass(frozen=True)
class SplitAudit:
    """The audit of one split."""

    split: str
    sample: SampleInfo
    fields: tuple[FieldStats, ...]
    pair: PairStats | None
    limits: tuple[CeilingCheck, ...] = ()
    chat: dict | None = None  # ``stats.chat.ChatTally.to_dict()`` of a conversation field
    design: dict | None = None  # a block sample: measurement -> ``stats.design.block_summary``
    truncated: dict | None = None  # role -> [(row, length)]: the first truncated audio files, measured
    preference: dict | None = None  # ``stats.preference.PairTally.to_dict()`` of a preference field

    def _roles(self) -> dict:
        """Per role (input, target): its column and why rows have no length (the flags it shares);
        the first truncated audio files by row, with the length they were measured at."""
        out = {}
        for f in self.fields:
            if f.spec.role not in out:
                out[f.spec.role] = {"column": f.spec.column, "kind": f.spec.kind, "flags": dict(f.flags),
                                    "decoded": f.decoded}
                listed = (self.truncated or {}).get(f.spec.role)
                if listed:
                    out[f.spec.role]["truncated_rows"] = [{"row": r, "value": v, "measure": f.spec.name}
                                                          for r, v in listed]
        return out

    def field(self, name: str) -> FieldStats:
        for f in self.fields:
            if f.spec.name == name:
                return f
        raise KeyError(name)

    def _field_dict(self, f: FieldStats, sampled: bool) -> dict:
        """A field's statistics; a block sample's intervals are its cluster bootstrap's, with the design."""
        out = f.to_dict(sampled)
        design = (self.design or {}).get(f.spec.name)
        if design is not None:
            if design["intervals"] is not None:
                out["intervals"] = {k: list(v) for k, v in design["intervals"].items()}
            out["design"] = {k: v for k, v in design.items() if k != "intervals"}
        return out

    def to_dict(self) -> dict:
        sampled = not self.sample.full
        return {
            "split": self.split,
            "sample": self.sample.to_dict(),
            "fields": {f.spec.name: self._field_dict(f, sampled) for f in self.fields},
            "roles": self._roles(),
            "pair": self.pair.to_dict(sampled) if self.pair else None,
            "limits": [c.to_dict() for c in self.limits],
            **({"chat": self.chat} if self.chat is not None else {}),
            **({"preference": self.preference} if self.preference is not None else {}),
        }
