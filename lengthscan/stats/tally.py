"""Accumulate one split's statistics batch by batch: field histograms, the input x target pair,
and rows over each limit. Everything here merges exactly, so batches, processes or machines can
each tally their rows and the merged result is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthscan.measure.limits import Ceiling
from lengthscan.measure.records import FLAG_NAMES, FLAG_OK, FLAG_TRUNCATED, FieldSpec, Measured
from lengthscan.sources.sampling import BlockDesign, SamplePlan
from lengthscan.stats.chat import ChatTally
from lengthscan.stats.design import block_summary
from lengthscan.stats.histograms import (
    RATIO_SCALE,
    Histogram,
    JointHistogram,
    merge_histograms,
    metric_values,
    proportion_interval,
    ratio_units,
    ratio_units_of,
)
from lengthscan.stats.preference import PairTally
from lengthscan.stats.records import CeilingCheck, FieldStats, PairStats, SampleInfo, SplitAudit

#: Longest rows kept per limit for the report (all of them are in ``lengths.parquet``).
WORST_ROWS = 100


def stats_from_lengths(spec: FieldSpec, values: np.ndarray, flags: np.ndarray,
                       decoded: np.ndarray | None = None) -> FieldStats:
    """Statistics of one batch of per-row values (negative or NaN where there is no length)."""
    valid = values >= 0
    units = values[valid] if spec.scale == 1 else np.rint(values[valid] * spec.scale)
    codes, counts = np.unique(flags[flags != FLAG_OK], return_counts=True)
    return FieldStats(
        spec,
        rows=int(values.size),
        flags={FLAG_NAMES[int(c)]: int(n) for c, n in zip(codes, counts)},
        histogram=Histogram.of(units.astype(np.int64)),
        decoded=int(decoded.sum()) if decoded is not None else 0,
    )


def pair_from_lengths(x_spec: FieldSpec, y_spec: FieldSpec, x: np.ndarray, y: np.ndarray) -> PairStats:
    """Pair statistics of one batch, over rows where both values exist and the input is > 0.

    The joint histogram is on integer units (milliseconds for seconds); the ratio is y per x unit.
    """
    both = (x > 0) & (y >= 0)
    xs, ys = x[both], y[both]
    xi = xs if x_spec.scale == 1 else np.rint(xs * x_spec.scale)
    yi = ys if y_spec.scale == 1 else np.rint(ys * y_spec.scale)
    return PairStats(x_spec.name, y_spec.name, JointHistogram.of(xi.astype(np.int64), yi.astype(np.int64)),
                     Histogram.of(ratio_units(ys, xs)), x_spec.scale, y_spec.scale)


@dataclass
class CeilingTally:
    """Rows over one limit: their count and the ``WORST_ROWS`` longest (row, value)."""

    limit: Ceiling
    over: int = 0
    unknown: int = 0  # rows decided by a decide-only bound that says nothing about this limit
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, rows: np.ndarray, values: np.ndarray, bounds=None) -> None:
        """``bounds``: (at_least, at_most) of rows with no exact length in decide-only mode (-1:
        none). A row whose lower bound is over the limit counts as over (it is not a longest row:
        its length is unknown); one whose bounds do not settle the limit counts as unknown."""
        over = values > self.limit.value  # NaN and -1 (no length) are never over
        if bounds is not None:
            at_least, at_most = bounds
            bounded = (at_least >= 0) | (at_most >= 0)
            over_by_bound = at_least > self.limit.value
            settled = over_by_bound | ((at_most >= 0) & (at_most <= self.limit.value))
            self.over += int(over_by_bound.sum())
            self.unknown += int((bounded & ~settled).sum())
        if not over.any():
            return
        self.over += int(over.sum())
        self.rows = np.concatenate([self.rows, rows[over]])
        self.values = np.concatenate([self.values, values[over].astype(np.float64)])
        if self.rows.size > 4 * WORST_ROWS:
            self._prune()

    def merge(self, other: "CeilingTally") -> "CeilingTally":
        """Add ``other``'s rows (the same limit, other rows) into this tally."""
        self.over += other.over
        self.unknown += other.unknown
        self.rows = np.concatenate([self.rows, other.rows])
        self.values = np.concatenate([self.values, other.values])
        if self.rows.size > 4 * WORST_ROWS:
            self._prune()
        return self

    def _prune(self) -> None:
        order = np.lexsort((self.rows, -self.values))[:WORST_ROWS]
        self.rows, self.values = self.rows[order], self.values[order]

    def check(self, sample: SampleInfo, deff: float | None = None) -> CeilingCheck:
        """Rows over the limit, and the split's estimate; ``deff`` (a block sample's design effect)
        widens the interval to that of n / deff rows."""
        self._prune()
        n, total = sample.rows_measured, sample.rows_total
        if deff is not None and deff > 1 and n:
            n_eff = max(1, int(n / deff))
            lo, hi = proportion_interval(int(round(self.over * n_eff / n)), n_eff, total)
        else:
            lo, hi = proportion_interval(self.over, n, total)
        estimate = self.over / n * total if n else 0.0
        worst = tuple((int(r), _plain(v)) for r, v in zip(self.rows, self.values))
        return CeilingCheck(self.limit, self.over, n, estimate, (lo * total, hi * total), worst, self.unknown)


def _plain(v: float):
    return int(v) if float(v).is_integer() else float(v)


#: Truncated audio files listed by row (and length) in a split's report.
LISTED_TRUNCATED = 20


@dataclass
class SplitTally:
    """Mergeable statistics of one split, accumulated batch by batch (merged every few batches)."""

    fields: tuple
    ceilings: list[Ceiling]
    ratios: tuple[str, ...] = ()  # ratio metrics (``a/b``) whose distribution rules need
    parts: dict = field(default_factory=dict)
    pairs: list[PairStats] = field(default_factory=list)
    ceiling_tallies: list[CeilingTally] = field(default_factory=list)
    ratio_parts: dict = field(default_factory=dict)
    chat: ChatTally | None = None  # conversation counts (a chat field)
    preference: PairTally | None = None  # preference pair counts (a pair field)
    keep_positions: np.ndarray | None = None  # which measured rows to keep lengths of (None: all)
    kept: list = field(default_factory=list)  # (rows, input values, target values) per batch
    seen: int = 0
    design: BlockDesign | None = None  # a block sample's blocks: each measurement's values kept by block
    by_block: dict = field(default_factory=dict)  # spec -> [(block ids, integer units)] of rows with a length
    truncated: dict = field(default_factory=dict)  # role -> (rows, lengths) of truncated audio files, the first few

    def __post_init__(self):
        self.ceiling_tallies = [CeilingTally(limit) for limit in self.ceilings]
        if self.chat is None and any(f.role == "chat" for f in self.fields):
            self.chat = ChatTally()
        if self.preference is None and any(f.role == "pair" for f in self.fields):
            self.preference = PairTally()

    def _pair_fields(self):
        """The (x, y) measurements of the pair statistics: input x target, or a conversation's
        prompt x completion tokens (None: no pair)."""
        if len(self.fields) == 2:
            return self.fields[0].primary, self.fields[1].primary
        return self.fields[0].kind.pair(self.fields[0]) if len(self.fields) == 1 else None

    def add(self, rows: np.ndarray, measured: dict[str, Measured]) -> None:
        by_name, bounds = {}, {}
        for f in self.fields:
            m = measured[f.role]
            for spec in f.specs:
                values = m.values[spec]
                by_name[spec.name] = values
                if m.bounds and spec in m.bounds:
                    bounds[spec.name] = m.bounds[spec]
                bucket = self.parts.setdefault(spec, [])
                bucket.append(stats_from_lengths(spec, values, m.flags, m.decoded))
                if self.design is not None:
                    valid = values >= 0
                    units = values[valid] if spec.scale == 1 else np.rint(values[valid] * spec.scale)
                    self.by_block.setdefault(spec, []).append((self.design.block_of(rows[valid]),
                                                               units.astype(np.int64)))
                if len(bucket) >= 32:
                    bucket[:] = [merge_all(bucket)]
        pair = self._pair_fields()
        if pair is not None:
            x, y = pair
            self.pairs.append(pair_from_lengths(x, y, by_name[x.name], by_name[y.name]))
            if len(self.pairs) >= 32:
                self.pairs[:] = [merge_all(self.pairs)]
        if self.chat is not None:
            m = measured[self.fields[0].role]
            self.chat.add(by_name, m.notes, rows, media=getattr(m, "media", None))
        if self.preference is not None:
            self.preference.add(by_name, measured[self.fields[0].role].notes)
        for f in self.fields:  # a truncated audio file has a length (the audio it holds): named in the report
            hit = np.flatnonzero(measured[f.role].flags == FLAG_TRUNCATED)
            if len(hit):
                self._add_truncated(f.role, rows[hit], np.asarray(by_name[f.primary.name])[hit])
        for lt in self.ceiling_tallies:
            lt.add(rows, by_name[lt.limit.measure], bounds.get(lt.limit.measure))
        self._keep_lengths(rows, by_name)
        for metric in self.ratios:
            bucket = self.ratio_parts.setdefault(metric, [])
            bucket.append(Histogram.of(ratio_units_of(metric_values(metric, by_name))))
            if len(bucket) >= 32:
                bucket[:] = [merge_histograms(bucket)]

    def merge(self, other: "SplitTally") -> "SplitTally":
        """Add ``other`` (a tally of other rows of the same split and fields, e.g. a block measured
        by another worker) into this one; every part merges exactly. The lengths ``other`` kept for
        the batch simulation are appended after this tally's own."""
        for spec, stats in other.parts.items():
            self._bucket(self.parts.setdefault(spec, []), stats)
        self._bucket(self.pairs, other.pairs)
        for lt, part in zip(self.ceiling_tallies, other.ceiling_tallies):
            lt.merge(part)
        for metric, hists in other.ratio_parts.items():
            bucket = self.ratio_parts.setdefault(metric, [])
            bucket.extend(hists)
            if len(bucket) >= 32:
                bucket[:] = [merge_histograms(bucket)]
        if self.chat is not None and other.chat is not None:
            self.chat.merge(other.chat)
        if self.preference is not None and other.preference is not None:
            self.preference.merge(other.preference)
        for spec, pieces in other.by_block.items():
            self.by_block.setdefault(spec, []).extend(pieces)
        for role, (r, v) in other.truncated.items():
            self._add_truncated(role, r, v)
        self.kept.extend(other.kept)
        self.seen += other.seen
        return self

    def _add_truncated(self, role: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Keep the ``LISTED_TRUNCATED`` first truncated files (by row) of ``role``."""
        have = self.truncated.get(role)
        if have is not None:
            rows, values = np.concatenate([have[0], rows]), np.concatenate([have[1], values])
        order = np.argsort(rows, kind="stable")[:LISTED_TRUNCATED]
        self.truncated[role] = (rows[order], values[order])

    @staticmethod
    def _bucket(bucket: list, items: list) -> None:
        bucket.extend(items)
        if len(bucket) >= 32:
            bucket[:] = [merge_all(bucket)]

    def _keep_lengths(self, rows: np.ndarray, by_name: dict) -> None:
        """Keep the primary lengths of (a bounded, uniform subset of) the rows for the batch simulation."""
        inputs = [f for f in self.fields if f.role in ("input", "chat")]
        targets = [f for f in self.fields if f.role == "target"]
        x = by_name[inputs[0].primary.name] if inputs else None
        y = by_name[targets[0].primary.name] if targets else None
        take = np.arange(rows.size)
        if self.keep_positions is not None:
            lo, hi = np.searchsorted(self.keep_positions, [self.seen, self.seen + rows.size])
            take = self.keep_positions[lo:hi] - self.seen
        self.seen += rows.size
        self.kept.append((rows[take], None if x is None else x[take], None if y is None else y[take]))

    def kept_lengths(self):
        """(rows, input lengths or None, target lengths or None) kept for the batch simulation."""
        rows = np.concatenate([k[0] for k in self.kept]) if self.kept else np.zeros(0, np.int64)
        def cat(i):
            if not self.kept or self.kept[0][i] is None:
                return None
            return np.concatenate([k[i] for k in self.kept])
        return rows, cat(1), cat(2)

    def histograms(self) -> dict[str, tuple[Histogram, int]]:
        """Metric -> (histogram in integer units, scale): every measurement and the tracked ratios."""
        out = {}
        for f in self.fields:
            for spec in f.specs:
                parts = self.parts.get(spec)
                out[spec.name] = (merge_all(parts).histogram if parts else Histogram(), spec.scale)
        for metric in self.ratios:
            out[metric] = (merge_histograms(self.ratio_parts.get(metric, [])), RATIO_SCALE)
        return out

    def split_audit(self, name: str, plan: SamplePlan, seed: int) -> SplitAudit:
        design = plan.design
        sample = SampleInfo(plan.full, plan.rows_total, plan.size, seed, plan.requested, plan.reason, plan.unit,
                            design.count if design is not None else None,
                            design.blocks_total if design is not None else None)
        stats = tuple(merge_all(self.parts[s]) if self.parts.get(s) else FieldStats(s)
                      for f in self.fields for s in f.specs)
        by_block = None
        if design is not None:
            by_block = {}
            for s in (s for f in self.fields for s in f.specs):
                pieces = self.by_block.get(s, [])
                blocks = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, np.int64)
                units = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int64)
                by_block[s.name] = block_summary(units, blocks, design.count, seed, s.scale, design.files)
        pair = None
        if (xy := self._pair_fields()) is not None:
            x, y = xy
            pair = merge_all(self.pairs) if self.pairs else PairStats(x.name, y.name, x_scale=x.scale,
                                                                      y_scale=y.scale)
        limits = tuple(lt.check(sample, _effective(by_block, lt.limit.measure)) for lt in self.ceiling_tallies)
        chat = self.chat.to_dict() if self.chat is not None else None
        truncated = {role: [(int(r), _plain(v)) for r, v in zip(*rv)] for role, rv in self.truncated.items()}
        preference = self.preference.to_dict() if self.preference is not None else None
        return SplitAudit(name, sample, stats, pair, limits, chat=chat, design=by_block, truncated=truncated or None,
                          preference=preference)


def _effective(by_block: dict | None, measure: str) -> float | None:
    """A block sample's rows-worth for a limit on ``measure``: n over its design effect (None: a row sample)."""
    if by_block is None or measure not in by_block or by_block[measure]["design_effect"] is None:
        return None
    return max(1.0, by_block[measure]["design_effect"])


def merge_all(items):
    """``items[0].merge(items[1]).merge(...)``: one record of many mergeable ones."""
    out = items[0]
    for item in items[1:]:
        out = out.merge(item)
    return out
