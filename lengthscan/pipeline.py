"""The library entry point ``lengthscan.audit``: source -> sample -> measure -> stats -> outputs.

Named ``pipeline`` so that the function ``lengthscan.audit`` is never shadowed by a submodule.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import __version__
from .cache import CacheReader, CacheWriter, cached_path, field_key
from .measure import (
    AudioSettings,
    ColumnError,
    check_columns,
    measure_batch,
    role_fields,
)
from .records import (
    AuditResult,
    Limit,
    Measured,
)
from .sampling import DEFAULT_SEED, SamplePlan, plan_sample
from .scan import BATCH_ROWS, Batch, iter_batches
from .sources import SplitSource, open_source
from .tally import SplitTally
from .tokens import DEFAULT_MAX_CHARS, TokenCounter

Progress = Callable[[str, int, int], None]
"""Called as ``progress(split, rows_done, rows_total)`` while measuring."""

__all__ = ["audit", "ColumnError"]


def audit(source, *, tokenizer=None, input: str | None = None, target: str | None = None,
          audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
          split: str | None = None, sample=None, full: bool = False, seed: int = DEFAULT_SEED,
          out: str | Path | None = None, overwrite: bool = False, cache: bool = True,
          max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS,
          progress: Progress | None = None, command: str | None = None) -> AuditResult:
    """Measure the lengths of the ``input``/``audio`` and ``target`` columns of ``source``.

    ``source`` is anything ``open_source`` opens (path, glob, directory, audio folder, hub id,
    Dataset or DatasetDict). ``tokenizer`` is a local directory, a hub name or a loaded tokenizer
    (default: ``model``). ``model`` also gives the model's limits, sampling rate and frame rule.
    ``sample`` is a row count or a fraction; ``full`` measures every row. With ``out``, writes
    ``lengths.parquet``, ``report.json`` and ``report.html`` there atomically.
    """
    started = time.perf_counter()
    ctx = _model_context(model, tokenizer)
    settings = _audio_settings(ctx, sampling_rate) if audio else AudioSettings()
    fields = role_fields(input=input, target=target, audio=audio, audio_settings=settings)
    counter = _counter(fields, tokenizer, model, ctx, max_chars)
    model_limits = _model_limits(ctx)
    limits = _limits(fields, counter, model_limits)
    if out is not None:
        from .writer import check_writable

        check_writable(Path(out), overwrite=overwrite)
    src = open_source(source, split=split)
    check_columns(src, fields)

    output = _Output.start(Path(out), fields, src) if out is not None else None
    try:
        splits, cached = [], []
        for split_src in src.splits:
            plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
            tally = SplitTally(fields, limits)
            cached += _measure_split(split_src, plan, fields, counter, settings, tally, cache=cache,
                                     batch_rows=batch_rows, output=output, progress=progress,
                                     with_split=src.has_splits)
            splits.append(tally.split_audit(split_src.name, plan, seed))
        result = AuditResult(
            source=src.spec, source_fingerprint=src.fingerprint, splits=tuple(splits),
            tokenizer=counter.info(cached=set(cached)) if counter else None,
            fields=tuple(s for f in fields for s in f.specs), seed=seed, command=command, version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=len(cached),
            seconds=time.perf_counter() - started,
            model=model_limits.to_dict() if model_limits else None,
            audio={"sampling_rate": settings.sampling_rate,
                   "frame_rule": _rule_dict(settings.frame_rule)} if audio else None,
        )
        if output is not None:
            output.finish(result)
        return result
    except BaseException:
        if output is not None:
            output.abort()
        raise


# -- set-up: model, tokenizer, limits --------------------------------------------------------------

def _model_context(model, tokenizer):
    if model is None:
        return None
    from .limits import load_model_context

    tok = tokenizer.tokenizer if isinstance(tokenizer, TokenCounter) else tokenizer
    return load_model_context(str(model), tokenizer=tok)


def _model_limits(ctx):
    if ctx is None:
        return None
    from .limits import model_limits

    return model_limits(ctx)


def _audio_settings(ctx, sampling_rate: int | None) -> AudioSettings:
    from .audio import frame_rule

    rule = frame_rule(feature_extractor=ctx.feature_extractor, config=ctx.config) if ctx else None
    rate = sampling_rate or (getattr(ctx.feature_extractor, "sampling_rate", None) if ctx else None) \
        or (rule.sampling_rate if rule else None)
    return AudioSettings(rate, rule)


def _counter(fields, tokenizer, model, ctx, max_chars: int):
    """The token counter text fields need: the given tokenizer, else the model's own."""
    if not any(f.kind == "text" for f in fields):
        return None
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    if ctx is not None and ctx.tokenizer is not None:
        name = tokenizer if isinstance(tokenizer, (str, Path)) else model
        return TokenCounter(ctx.tokenizer, max_chars=max_chars, name=str(name))
    if tokenizer is None:
        raise ColumnError("text columns need a tokenizer: --tokenizer DIR_OR_NAME (or a --model that has one)")
    return TokenCounter(tokenizer, max_chars=max_chars)


def _limits(fields, counter, model_limits) -> list[Limit]:
    measured = {s.name for f in fields for s in f.specs}
    limits = []
    if model_limits is not None:
        limits += [Limit(m.name, m.value, m.origin) for m in model_limits.limits if m.name in measured]
    elif counter is not None and "input_tokens" in measured:
        max_len = counter.info().model_max_length
        if max_len is not None:
            limits.append(Limit("input_tokens", max_len, "tokenizer.model_max_length"))
    return limits


def _rule_dict(rule) -> dict | None:
    if rule is None:
        return None
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(rule).items()}


# -- measuring one split ---------------------------------------------------------------------------

def _measure_split(split_src: SplitSource, plan: SamplePlan, fields, counter, settings: AudioSettings,
                   tally: SplitTally, *, cache: bool, batch_rows: int, output, progress, with_split: bool) -> list[str]:
    """Measure the plan's rows of one split into ``tally`` (and the outputs); returns the roles
    whose lengths came from the cache."""
    text = [f for f in fields if f.kind == "text"]
    keys = {f.role: field_key(split_src.fingerprint, f.column, f.primary.name, counter.hash, counter.max_chars)
            for f in text} if cache and text else {}
    readers = {role: CacheReader(p) for role, k in keys.items() if (p := cached_path(k)) is not None}
    writers = {role: CacheWriter(k) for role, k in keys.items() if plan.full and role not in readers}
    to_measure = [f for f in fields if f.role not in readers]
    columns = list(dict.fromkeys(f.column for f in to_measure))
    batches = (iter_batches(split_src, columns, indices=plan.indices, batch_rows=batch_rows) if columns
               else _row_batches(plan, batch_rows))
    done = 0
    try:
        for batch in batches:
            measured = measure_batch(batch, to_measure, split_src, counter=counter, audio=settings)
            for f in fields:
                if f.role in readers:
                    lengths, flags = readers[f.role].take(batch.rows)
                    measured[f.role] = Measured({f.primary: lengths}, flags, _too_long_errors(flags, counter))
                elif f.role in writers:
                    writers[f.role].write(measured[f.role].values[f.primary], measured[f.role].flags)
            tally.add(batch.rows, measured)
            if output is not None:
                located = split_src.locate(batch.rows) if split_src.multi_file else None
                output.lengths.write(batch.rows, split=split_src.name if with_split else None,
                                     located=located, measured=measured)
            done += batch.rows.size
            if progress is not None:
                progress(split_src.name, done, plan.size)
        if done != plan.size:
            raise RuntimeError(f"split {split_src.name}: measured {done} rows, expected {plan.size}")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.commit()
    return list(readers)


def _too_long_errors(flags: np.ndarray, counter) -> list | None:
    from .records import FLAG_TOO_LONG

    if not (flags == FLAG_TOO_LONG).any():
        return None
    return [f"longer than --max-chars {counter.max_chars:,} characters" if k == FLAG_TOO_LONG else None
            for k in flags]


def _row_batches(plan: SamplePlan, batch_rows: int):
    rows = np.arange(plan.rows_total, dtype=np.int64) if plan.indices is None else plan.indices
    for k in range(0, rows.size, batch_rows):
        yield Batch(rows[k:k + batch_rows], pa.record_batch([], schema=pa.schema([])))


# -- outputs ---------------------------------------------------------------------------------------

@dataclass
class _Output:
    final: Path
    tmp: Path
    lengths: object

    @classmethod
    def start(cls, final: Path, fields, src) -> "_Output":
        from .writer import LengthsWriter, lengths_schema, staging_dir

        tmp = staging_dir(final)
        multi = any(s.multi_file for s in src.splits)
        schema = lengths_schema(fields, with_split=src.has_splits, multi_file=multi)
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
