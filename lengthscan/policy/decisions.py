"""The decide pass: measured lengths in (a Parquet file, in row order), decisions out.

Shared by ``audit --limit`` (what clean would do) and ``clean`` (what it does). The measured
file is read back in row order, a batch at a time, so memory stays flat; every row is counted
under its decision and reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lengthscan.measure.records import FLAG_CODES
from lengthscan.policy.rules import DECISIONS, DROP, KEEP, TRUNCATE, Decisions, decide, parse_rule
from lengthscan.stats.histograms import proportion_interval


class MeasuredCursor:
    """Reads a measured-lengths Parquet file forward: ``take(n)`` returns the next ``n`` rows."""

    def __init__(self, path):
        self._batches = pq.ParquetFile(path).iter_batches(batch_size=65536)
        self._buffer: pa.Table | None = None

    def take(self, n: int) -> pa.Table:
        parts, have = [], 0
        while have < n:
            if self._buffer is None or self._buffer.num_rows == 0:
                self._buffer = pa.Table.from_batches([next(self._batches)])
            piece = self._buffer.slice(0, n - have)
            self._buffer = self._buffer.slice(piece.num_rows)
            parts.append(piece)
            have += piece.num_rows
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def base_and_flags(table: pa.Table, fields) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Measurement arrays (-1/NaN where none) and flag codes per role, from a lengths table."""
    base, flags = {}, {}
    for f in fields:
        for spec in f.specs:
            col = table.column(spec.name)
            if spec.unit == "seconds":
                base[spec.name] = col.to_numpy(zero_copy_only=False).astype(np.float64)
            else:
                values = col.fill_null(-1).to_numpy().astype(np.int64)
                for bound in (f"{spec.name}_at_least", f"{spec.name}_at_most"):
                    if bound in table.column_names:  # decide-only: a proven bound decides the row
                        b = table.column(bound).fill_null(-1).to_numpy().astype(np.int64)
                        values = np.where(values >= 0, values, b)
                base[spec.name] = values
        names = table.column(f"{f.role}_flag").to_pylist()
        flags[f.role] = np.asarray([FLAG_CODES[x] if x else 0 for x in names], np.int8)
        for name in f.notes:  # a conversation's side columns: where training starts, its end-of-turn token
            if name in table.column_names:
                col = table.column(name)
                base[name] = (col.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int64)
                              if pa.types.is_boolean(col.type) else col.fill_null(-1).to_numpy().astype(np.int64))
    return base, flags


def row_errors(table: pa.Table, fields) -> dict:
    """role -> the per-row messages of conversation fields (the template's own words), which their
    reasons carry."""
    return {f.role: table.column(f"{f.role}_error").to_pylist() for f in fields if f.kind.errors_in_reasons}


@dataclass(frozen=True, eq=False)
class BatchDecision:
    """One batch of rows decided: its measurements as measured (``base``), their flags by role and
    the decision table (what the writer then applies: truncation, cropping, the rejects)."""

    base: dict
    flags: dict
    decisions: Decisions


def decide_batch(measured: pa.Table, fields, resolved, *, special: dict[str, int],
                 keep_empty_targets: bool = False) -> BatchDecision:
    """The decisions of one batch's rows of the measured lengths (``lengths.parquet``'s columns):
    the policy's step of a clean, taken before its rows are written."""
    base, flags = base_and_flags(measured, fields)
    return BatchDecision(base, flags, decide(base, flags, resolved, special=special,
                                             keep_empty_targets=keep_empty_targets,
                                             errors=row_errors(measured, fields)))


def decide_rows(spec, measured: pa.Table) -> BatchDecision:
    """``decide_batch`` with a clean's resolved rules (``spec``: a ``write.clean_rows.CleanSpec``:
    its fields, resolved rules, special-token lengths and ``keep_empty_targets``)."""
    return decide_batch(measured, spec.fields, spec.resolved, special=spec.special,
                        keep_empty_targets=spec.keep_empty_targets)


def decision_columns(d: Decisions) -> dict[str, pa.Array]:
    """``decision``, ``reason`` and ``reasons`` columns for ``lengths.parquet`` and ``rejects``."""
    return {
        "decision": pa.array(d.names(), pa.string()),
        "reason": pa.array(d.reason, pa.string()),
        "reasons": pa.array(d.reasons, pa.list_(pa.string())),
    }


#: A quoted value in a reason (Python's ``repr`` of a string): an image's path or URL, a role.
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def redacted(reason: str | None) -> str | None:
    """``reason`` as ``--redact`` reports it: every value it quotes from the data (an image's path,
    URL or data URI, a role) replaced by '…'; the rest (the rule, the flag, what is wrong) kept."""
    return None if reason is None else _QUOTED.sub("'…'", reason)


@dataclass
class DecisionTally:
    """Rows per decision and per reason for one split; extrapolated when the split was sampled."""

    split: str
    rows_total: int
    measured: int = 0
    counts: dict = field(default_factory=lambda: {name: 0 for name in DECISIONS.values()})
    by_reason: dict = field(default_factory=dict)
    redact: bool = False            # reasons counted without the values they quote (``redacted``)

    def add(self, d: Decisions) -> None:
        self.measured += d.decision.size
        for code, name in DECISIONS.items():
            self.counts[name] += int((d.decision == code).sum())
        for code, reason in zip(d.decision, d.reason):
            if reason is not None:
                key = (DECISIONS[int(code)], redacted(reason) if self.redact else reason)
                self.by_reason[key] = self.by_reason.get(key, 0) + 1

    def merge(self, other: "DecisionTally") -> "DecisionTally":
        """Add ``other``'s counts (other rows of the same split) into this tally."""
        self.measured += other.measured
        for name, n in other.counts.items():
            self.counts[name] += n
        for key, n in other.by_reason.items():
            self.by_reason[key] = self.by_reason.get(key, 0) + n
        return self

    @property
    def changed(self) -> int:
        """Rows dropped or truncated."""
        return self.counts["drop"] + self.counts["truncate"]

    def to_dict(self) -> dict:
        sampled = self.measured < self.rows_total
        out = {"split": self.split, "rows": self.rows_total, "measured": self.measured,
               "kept": self.counts["keep"], "truncated": self.counts["truncate"], "dropped": self.counts["drop"],
               "by_reason": [{"decision": d, "reason": r, "rows": n}
                             for (d, r), n in sorted(self.by_reason.items(), key=lambda kv: (-kv[1], kv[0]))]}
        if sampled:
            out["estimated"] = {}
            for name in ("keep", "truncate", "drop"):
                lo, hi = proportion_interval(self.counts[name], self.measured, self.rows_total)
                share = self.counts[name] / self.measured if self.measured else 0.0
                out["estimated"][name] = {"rows": share * self.rows_total,
                                          "interval": [lo * self.rows_total, hi * self.rows_total]}
        return out


def parse_rules(texts) -> tuple:
    """Parse ``--limit`` texts (RuleError on the first malformed one)."""
    return tuple(parse_rule(t) for t in texts or ())


def check_rule_metrics(rules, fields) -> None:
    """Every metric a rule names is measured here, or a RuleError saying what to add."""
    from lengthscan.policy.rules import RuleError

    measured = {s.name for f in fields for s in f.specs}
    for r in rules:
        for part in r.parts:
            if part not in measured:
                hint = {"input_tokens": "--input", "target_tokens": "--target", "input_seconds": "--audio",
                        "input_samples": "--audio with --sampling-rate or --model",
                        "input_frames": "--audio with a --model that has a frame rule"}.get(
                    part, "--messages COL, or --prompt COL --completion COL")
                raise RuleError(f"limit rule {r.text!r}: {part} is not measured (add {hint}); "
                                f"measured here: {', '.join(sorted(measured))}")


def special_lengths(counter, fields) -> dict[str, int]:
    """Per text role, the length of the empty string: the special tokens every row carries."""
    if counter is None:
        return {}
    return {f.role: n for f in fields if (n := f.kind.empty_length(f, counter)) is not None}


def parse_fail_over(value) -> tuple[str, float] | None:
    """``'1%'`` -> ('percent', 1.0); ``'250'`` -> ('rows', 250); None stays None."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 <= share <= 100:
                raise ValueError
            return "percent", share
        rows = int(text)
        if rows < 0:
            raise ValueError
        return "rows", float(rows)
    except ValueError:
        from lengthscan.policy.rules import RuleError

        raise RuleError(f"--fail-over {value!r}: give a share of rows (1%) or a row count (250)") from None


def gate(fail_over, tallies: list[DecisionTally]) -> str | None:
    """None when the gate passes, else the one-line reason it failed."""
    if fail_over is None:
        return None
    kind, limit = fail_over
    total = sum(t.rows_total for t in tallies)
    measured = sum(t.measured for t in tallies)
    changed = sum(t.changed for t in tallies)
    if measured < total and measured:  # sampled: judge the estimate for the whole source
        changed = changed / measured * total
    if kind == "percent":
        share = 100 * changed / total if total else 0.0
        if share > limit:
            return f"gate failed: {share:.2f}% of {total:,} rows would be dropped or truncated (--fail-over {limit:g}%)"
        return None
    if changed > limit:
        return f"gate failed: {changed:,.0f} of {total:,} rows would be dropped or truncated (--fail-over {limit:g})"
    return None


__all__ = ["DROP", "KEEP", "TRUNCATE", "DecisionTally", "MeasuredCursor", "base_and_flags", "decide",
           "decision_columns", "gate", "parse_fail_over", "parse_rules", "redacted", "special_lengths"]


def decide_file(measured_path, splits, fields, resolved, *, special: dict, keep_empty_targets: bool,
                out_path=None, redact: bool = False) -> list[DecisionTally]:
    """The decide pass: the measured lengths at ``measured_path`` (every split's rows in order;
    ``splits`` is ``[(name, rows_total, rows_measured)]``) decided by ``resolved``, counted per
    split (``redact``: reasons without the values they quote), and written with their decision
    columns to ``out_path`` (None: counted only)."""
    cursor = MeasuredCursor(measured_path)
    writer, tallies = None, []
    for name, rows_total, size in splits:
        tally = DecisionTally(name, rows_total, redact=redact)
        for start in range(0, size, 65536):
            table = cursor.take(min(65536, size - start))
            base, flags = base_and_flags(table, fields)
            d = decide(base, flags, resolved, special=special, keep_empty_targets=keep_empty_targets,
                       errors=row_errors(table, fields))
            tally.add(d)
            if out_path is not None:
                for col_name, col in decision_columns(d).items():
                    table = table.append_column(col_name, col)
                writer = writer or pq.ParquetWriter(out_path, table.schema)
                writer.write_table(table)
        tallies.append(tally)
    if writer is not None:
        writer.close()
    return tallies
