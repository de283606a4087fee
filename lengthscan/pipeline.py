"""The library entry point ``lengthscan.audit``: source -> sample -> measure -> stats -> outputs.

Named ``pipeline`` so that the function ``lengthscan.audit`` is never shadowed by a submodule.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import __version__
from .cache import CacheReader, CacheWriter, cached_path, field_key
from .records import (
    AuditResult,
    FieldSpec,
    FieldStats,
    LimitCheck,
    PairStats,
    SampleInfo,
    SplitAudit,
    pair_from_lengths,
    stats_from_lengths,
)
from .sampling import DEFAULT_SEED, SamplePlan, plan_sample
from .scan import BATCH_ROWS, Batch, iter_batches
from .sources import Source, SplitSource, open_source
from .stats import proportion_interval
from .tokens import DEFAULT_MAX_CHARS, TokenCounter

Progress = Callable[[str, int, int], None]
"""Called as ``progress(split, rows_done, rows_total)`` while measuring."""


class ColumnError(ValueError):
    """A named column is missing or does not hold text (exit code 2)."""


def field_specs(input: str | None = None, target: str | None = None) -> tuple[FieldSpec, ...]:
    """The measured fields for ``--input``/``--target`` column names."""
    specs = tuple(FieldSpec(role, col) for role, col in (("input", input), ("target", target)) if col)
    if not specs:
        raise ColumnError("name at least one text column: --input COLUMN and/or --target COLUMN")
    return specs


def audit(source, *, tokenizer=None, input: str | None = None, target: str | None = None,
          model: str | None = None, split: str | None = None, sample=None, full: bool = False,
          seed: int = DEFAULT_SEED, out: str | Path | None = None, overwrite: bool = False,
          cache: bool = True, max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS,
          progress: Progress | None = None, command: str | None = None) -> AuditResult:
    """Measure token lengths of ``input`` and/or ``target`` columns of ``source``.

    ``source`` is anything ``open_source`` opens (a path, glob, directory, hub id, Dataset or
    DatasetDict). ``tokenizer`` is a local directory, a hub name or a loaded tokenizer; it
    defaults to ``model``. ``sample`` is a row count or a fraction; ``full`` measures every row.
    With ``out``, writes ``lengths.parquet``, ``report.json`` and ``report.html`` there,
    atomically. Returns the frozen ``AuditResult``.
    """
    started = time.perf_counter()
    specs = field_specs(input, target)
    tokenizer = tokenizer if tokenizer is not None else model
    if tokenizer is None:
        raise ColumnError("give a tokenizer: --tokenizer DIR_OR_NAME (or --model)")
    from .writer import check_writable

    if out is not None:
        check_writable(Path(out), overwrite=overwrite)
    src = open_source(source, split=split)
    _check_columns(src, specs)
    counter = tokenizer if isinstance(tokenizer, TokenCounter) else TokenCounter(tokenizer, max_chars=max_chars)

    output = _Output.start(Path(out), specs, src) if out is not None else None
    try:
        splits, hits = [], 0
        for split_src in src.splits:
            plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
            measured, split_hits = _measure_split(split_src, plan, specs, counter, cache=cache,
                                                  batch_rows=batch_rows, output=output,
                                                  progress=progress, with_split=src.has_splits)
            hits += split_hits
            splits.append(_split_audit(split_src, plan, seed, measured, counter))
        result = AuditResult(
            source=src.spec, source_fingerprint=src.fingerprint, splits=tuple(splits),
            tokenizer=counter.info(), fields=specs, seed=seed, command=command, version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=hits,
            seconds=time.perf_counter() - started,
        )
        if output is not None:
            output.finish(result)
        return result
    except BaseException:
        if output is not None:
            output.abort()
        raise


# -- measuring one split ---------------------------------------------------------------------------

@dataclass
class _Tally:
    """Mergeable statistics accumulated batch by batch (merged every few batches)."""

    specs: tuple[FieldSpec, ...]
    parts: dict[FieldSpec, list[FieldStats]] = field(default_factory=dict)
    pairs: list[PairStats] = field(default_factory=list)

    def add(self, measured: dict[FieldSpec, tuple[np.ndarray, np.ndarray]]) -> None:
        for spec, (lengths, flags) in measured.items():
            bucket = self.parts.setdefault(spec, [])
            bucket.append(stats_from_lengths(spec, lengths, flags))
            if len(bucket) >= 32:
                bucket[:] = [_merge_all(bucket)]
        if len(self.specs) == 2:
            (x_spec, (x, _)), (y_spec, (y, _)) = measured.items()
            self.pairs.append(pair_from_lengths(x_spec.name, y_spec.name, x, y))
            if len(self.pairs) >= 32:
                self.pairs[:] = [_merge_all(self.pairs)]

    def fields(self) -> tuple[FieldStats, ...]:
        return tuple(_merge_all(self.parts[s]) if self.parts.get(s) else FieldStats(s) for s in self.specs)

    def pair(self) -> PairStats | None:
        if len(self.specs) != 2:
            return None
        return _merge_all(self.pairs) if self.pairs else PairStats(self.specs[0].name, self.specs[1].name)


def _merge_all(items):
    out = items[0]
    for item in items[1:]:
        out = out.merge(item)
    return out


def _measure_split(split_src: SplitSource, plan: SamplePlan, specs, counter: TokenCounter, *, cache: bool,
                   batch_rows: int, output, progress: Progress | None, with_split: bool):
    keys = {s: field_key(split_src.fingerprint, s.column, s.name, counter.hash, counter.max_chars) for s in specs}
    readers = {s: CacheReader(p) for s in specs if cache and (p := cached_path(keys[s])) is not None}
    writers = {s: CacheWriter(keys[s]) for s in specs if cache and plan.full and s not in readers}
    columns = list(dict.fromkeys(s.column for s in specs if s not in readers))
    batches = (iter_batches(split_src, columns, indices=plan.indices, batch_rows=batch_rows) if columns
               else _row_batches(plan, batch_rows))
    tally, done = _Tally(specs), 0
    try:
        for batch in batches:
            measured = {}
            for spec in specs:
                if spec in readers:
                    measured[spec] = readers[spec].take(batch.rows)
                    continue
                texts = _texts(batch, spec, split_src)
                try:
                    measured[spec] = counter.count(texts, spec.role)
                except TypeError as exc:  # a non-string that slipped past the type check
                    raise ColumnError(f"column {spec.column!r}: {exc}") from None
                if spec in writers:
                    writers[spec].write(*measured[spec])
            tally.add(measured)
            if output is not None:
                located = split_src.locate(batch.rows) if split_src.multi_file else None
                output.lengths.write(batch.rows, split=split_src.name if with_split else None,
                                     located=located, measured=measured)
            done += batch.rows.size
            if progress is not None:
                progress(split_src.name, done, plan.size)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    if done != plan.size:
        for w in writers.values():
            w.abort()
        raise RuntimeError(f"split {split_src.name}: measured {done} rows, expected {plan.size}")
    for w in writers.values():
        w.commit()
    return tally, len(readers)


def _row_batches(plan: SamplePlan, batch_rows: int):
    rows = np.arange(plan.rows_total, dtype=np.int64) if plan.indices is None else plan.indices
    for k in range(0, rows.size, batch_rows):
        yield Batch(rows[k:k + batch_rows], pa.record_batch([], schema=pa.schema([])))


def _texts(batch: Batch, spec: FieldSpec, split_src: SplitSource) -> list:
    """The column's values as Python strings (None kept); anything that is not text is an error."""
    col = batch.table.column(spec.column)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type):
        return col.to_pylist()
    if pa.types.is_string_view(col.type):
        return col.cast(pa.large_string()).to_pylist()
    if getattr(col.type, "extension_name", None) == "arrow.json":
        # datasets stores a JSON column of mixed value types as JSON text: decode, then check
        import json

        values = [None if v is None else json.loads(v) for v in col.storage.to_pylist()]
        bad = next((i for i, v in enumerate(values) if v is not None and not isinstance(v, str)), None)
        if bad is None:
            return values
        _not_text(spec, split_src, batch, bad, values[bad], "mixed JSON values")
    valid = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
    if valid.size == 0:
        return [None] * len(col)
    _not_text(spec, split_src, batch, int(valid[0]), col[int(valid[0])].as_py(), str(col.type))


def _not_text(spec: FieldSpec, split_src: SplitSource, batch: Batch, i: int, value, kind: str):
    row = int(batch.rows[i])
    where = f"row {row}"
    if split_src.multi_file:
        files, file_rows = split_src.locate(np.asarray([row]))
        where += f" ({files[0]}, row {int(file_rows[0])} of that file)"
    raise ColumnError(f"column {spec.column!r} holds {kind}, not text: {where} has {type(value).__name__} "
                      f"value {str(value)[:60]!r}")


def _check_columns(src: Source, specs) -> None:
    for split_src in src.splits:
        have = split_src.column_names
        for spec in specs:
            if spec.column not in have:
                where = f" (split {split_src.name})" if src.has_splits else ""
                raise ColumnError(f"{src.spec}{where}: no column {spec.column!r} for --{spec.role}; "
                                  f"columns are: {', '.join(have)}")


# -- statistics of one split -----------------------------------------------------------------------

def _split_audit(split_src: SplitSource, plan: SamplePlan, seed: int, tally: _Tally, counter) -> SplitAudit:
    fields = tally.fields()
    sample = SampleInfo(plan.full, plan.rows_total, plan.size, seed, plan.requested, plan.reason)
    limits = []
    max_len = counter.info().model_max_length
    for stats in fields:
        if max_len is not None and stats.spec.role == "input":
            limits.append(limit_check(stats, max_len, "tokenizer.model_max_length", sample))
    return SplitAudit(split_src.name, sample, fields, tally.pair(), tuple(limits))


def limit_check(stats: FieldStats, limit: int, origin: str, sample: SampleInfo) -> LimitCheck:
    """Rows of ``stats`` over ``limit``; extrapolated to the split with a 95% interval."""
    hist = stats.histogram
    over = int(hist.counts[hist.values > limit].sum())
    n, total = sample.rows_measured, sample.rows_total
    lo, hi = proportion_interval(over, n, total)
    estimate = over / n * total if n else 0.0
    return LimitCheck(f"{stats.spec.name} > {limit}", limit, origin, over, n, estimate, (lo * total, hi * total))


# -- outputs ---------------------------------------------------------------------------------------

@dataclass
class _Output:
    final: Path
    tmp: Path
    lengths: object

    @classmethod
    def start(cls, final: Path, specs, src: Source) -> "_Output":
        from .writer import LengthsWriter, lengths_schema, staging_dir

        tmp = staging_dir(final)
        multi = any(s.multi_file for s in src.splits)
        schema = lengths_schema(list(specs), with_split=src.has_splits, multi_file=multi)
        return cls(final, tmp, LengthsWriter(tmp / "lengths.parquet", schema))

    def finish(self, result: AuditResult) -> None:
        from .report.html import write_html
        from .writer import publish, write_json

        self.lengths.close()
        data = result.to_dict()
        write_json(self.tmp / "report.json", data)
        write_html(self.tmp / "report.html", data)
        publish(self.tmp, self.final)

    def abort(self) -> None:
        import shutil

        try:
            self.lengths.close()
        except Exception:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
