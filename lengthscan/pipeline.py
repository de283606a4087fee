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


@dataclass(frozen=True)
class Setup:
    """What measuring needs, resolved once from the user's options."""

    fields: tuple
    counter: TokenCounter | None
    settings: AudioSettings
    model_limits: object | None  # limits.ModelLimits
    limits: list[Limit]
    decide_limits: dict = field(default_factory=dict)  # role -> upper token limit (decide-only mode)

    @property
    def specs(self) -> tuple:
        return tuple(s for f in self.fields for s in f.specs)

    def audio_dict(self) -> dict | None:
        if not any(f.kind == "audio" for f in self.fields):
            return None
        return {"sampling_rate": self.settings.sampling_rate, "frame_rule": _rule_dict(self.settings.frame_rule)}


def prepare(*, tokenizer=None, input=None, target=None, audio=None, model=None, sampling_rate=None,
            max_chars: int = DEFAULT_MAX_CHARS) -> Setup:
    """Load the model's context, choose the fields and their measurements, the counter and limits."""
    ctx = _model_context(model, tokenizer)
    settings = _audio_settings(ctx, sampling_rate) if audio else AudioSettings()
    fields = role_fields(input=input, target=target, audio=audio, audio_settings=settings)
    counter = _counter(fields, tokenizer, model, ctx, max_chars)
    model_limits = _model_limits(ctx)
    return Setup(fields, counter, settings, model_limits, _limits(fields, counter, model_limits))


def audit(source, *, tokenizer=None, input: str | None = None, target: str | None = None,
          audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
          split: str | None = None, sample=None, full: bool = False, seed: int = DEFAULT_SEED,
          limits=(), action: str = "drop", keep_empty_targets: bool = False, crop_audio: bool = False,
          fail_over=None, out: str | Path | None = None, overwrite: bool = False, cache: bool = True,
          max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS, redact: bool = False,
          num_proc: int = 1, progress: Progress | None = None, command: str | None = None) -> AuditResult:
    """Measure the lengths of the ``input``/``audio`` and ``target`` columns of ``source``.

    ``source`` is anything ``open_source`` opens (path, glob, directory, audio folder, hub id,
    Dataset or DatasetDict). ``tokenizer`` is a local directory, a hub name or a loaded tokenizer
    (default: ``model``). ``model`` also gives the model's limits, sampling rate and frame rule.
    ``sample`` is a row count or a fraction; ``full`` measures every row. ``limits`` are
    ``clean``'s rules: the audit then reports what clean would do to each row (with ``action``,
    ``keep_empty_targets``, ``crop_audio``), and ``fail_over`` ('1%' or a row count) marks the
    result failed when more rows would be dropped or truncated. With ``out``, writes
    ``lengths.parquet``, ``report.json`` and ``report.html`` there atomically; ``redact`` keeps
    every text of the data out of the report (row ids and lengths only). ``num_proc`` > 1 measures
    in worker processes (same results, same order).
    """
    from .decisions import check_rule_metrics, parse_fail_over, parse_rules

    started = time.perf_counter()
    rules = parse_rules(limits)
    gate_spec = parse_fail_over(fail_over)
    setup = prepare(tokenizer=tokenizer, input=input, target=target, audio=audio, model=model,
                    sampling_rate=sampling_rate, max_chars=max_chars)
    check_rule_metrics(rules, setup.fields)
    if out is not None:
        from .writer import check_writable

        check_writable(Path(out), overwrite=overwrite)
    src = open_source(source, split=split)
    check_columns(src, setup.fields)
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))

    output = _Output.start(Path(out) if out is not None else None, setup.fields, src,
                           measured_only=bool(rules), redact=redact)
    try:
        splits, cached, tallies, plans = [], [], [], []
        for split_src in src.splits:
            plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
            tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, seed))
            cached += measure_split(split_src, plan, setup, tally, cache=cache, batch_rows=batch_rows,
                                    output=output, progress=progress, with_split=src.has_splits,
                                    num_proc=num_proc)
            splits.append(tally.split_audit(split_src.name, plan, seed))
            tallies.append(tally)
            plans.append(plan)
        decisions = None
        if rules:
            from .decisions import gate

            resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
            dtallies = output.decide(src, plans, setup, resolved, keep_empty_targets)
            decisions = {"rules": [r.to_dict() for r in resolved], "basis": basis, "action": action,
                         "splits": [t.to_dict() for t in dtallies], "fail_over": fail_over,
                         "gate": gate(gate_spec, dtallies)}
        result = AuditResult(
            source=src.spec, source_fingerprint=src.fingerprint, splits=tuple(splits),
            tokenizer=setup.counter.info(cached=set(cached)) if setup.counter else None,
            fields=setup.specs, seed=seed, command=command, version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=len(cached),
            seconds=time.perf_counter() - started,
            model=setup.model_limits.to_dict() if setup.model_limits else None,
            audio=setup.audio_dict(), decisions=decisions,
            batches=simulate_batches(src, tallies, setup, seed, of="source"),
        )
        output.finish(result)
        return result
    except BaseException:
        output.abort()
        raise


#: Rows whose lengths the batch simulation keeps (a uniform sample beyond it: memory stays flat).
SIMULATION_ROWS = 1_000_000


def simulation_positions(plan: SamplePlan, seed: int):
    """Positions (in measuring order) of the rows kept for the batch simulation; None: all."""
    if plan.size <= SIMULATION_ROWS:
        return None
    from .sampling import sample_indices

    return sample_indices(plan.size, SIMULATION_ROWS, seed)


def simulate_batches(src, tallies, setup: Setup, seed: int, *, of: str) -> dict | None:
    """Padding and batches of the train split (else the first) as the installed Trainer builds them."""
    from .batches import simulate

    names = [s.name for s in src.splits]
    i = names.index("train") if "train" in names else 0
    rows, x, y = tallies[i].kept_lengths()
    if x is None or rows.size == 0:
        return None
    audio = any(f.kind == "audio" and f.role == "input" for f in setup.fields)
    out = simulate(x, y, rows=rows, seed=seed, unit="seconds" if audio else "tokens")
    out.update({"split": names[i], "of": of, "split_rows": src.splits[i].num_rows})
    return out


def resolve_for(rules, src, tallies, setup: Setup, action: str, crop_audio: bool):
    """Resolve rules on the train split's distributions (all splits merged when there is none)."""
    from .policy import resolve_rules

    names = [s.name for s in src.splits]
    if "train" in names:
        basis, hists = "train", tallies[names.index("train")].histograms()
    else:
        basis = names[0] if len(names) == 1 else "all splits merged"
        per = [t.histograms() for t in tallies]
        from .stats import merge_histograms

        hists = {k: (merge_histograms([p[k][0] for p in per]), per[0][k][1]) for k in per[0]}
    return resolve_rules(rules, histograms=hists, default_action=action, model_limits=setup.model_limits,
                         crop_audio=crop_audio, basis=basis), basis


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
        max_len = counter.model_max_length()
        if max_len is not None:
            limits.append(Limit("input_tokens", max_len, "tokenizer.model_max_length"))
    return limits


def _rule_dict(rule) -> dict | None:
    if rule is None:
        return None
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(rule).items()}


# -- measuring one split ---------------------------------------------------------------------------

def measure_split(split_src: SplitSource, plan: SamplePlan, setup: Setup, tally: SplitTally, *, cache: bool,
                  batch_rows: int, output, progress, with_split: bool, num_proc: int = 1) -> list[str]:
    """Measure the plan's rows of one split into ``tally`` and ``output.lengths``; returns the
    roles whose lengths came from the cache."""
    fields, counter, settings = setup.fields, setup.counter, setup.settings
    text = [f for f in fields if f.kind == "text"]
    keys = {f.role: field_key(split_src.fingerprint, f.column, f.primary.name, counter.hash, counter.max_chars)
            for f in text} if cache and text else {}
    readers = {role: CacheReader(p) for role, k in keys.items() if (p := cached_path(k)) is not None}
    writers = {role: CacheWriter(k) for role, k in keys.items()
               if plan.full and role not in readers and role not in setup.decide_limits}
    to_measure = [f for f in fields if f.role not in readers]
    columns = list(dict.fromkeys(f.column for f in to_measure))
    batches = (iter_batches(split_src, columns, indices=plan.indices, batch_rows=batch_rows) if columns
               else _row_batches(plan, batch_rows))
    done = 0
    try:
        for batch, measured in _measured(batches, to_measure, split_src.layout(), counter, settings, num_proc,
                                         setup.decide_limits):
            for f in fields:
                if f.role in readers:
                    lengths, flags = readers[f.role].take(batch.rows)
                    measured[f.role] = Measured({f.primary: lengths}, flags, _too_long_errors(flags, counter))
                elif f.role in writers:
                    writers[f.role].write(measured[f.role].values[f.primary], measured[f.role].flags)
            tally.add(batch.rows, measured)
            if output.lengths is not None:
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


def _measured(batches, fields, layout, counter, settings, num_proc: int, decide_limits=None):
    """(batch, measurements) in row order: in this process, or in ``num_proc`` worker processes.

    One process is the default and usually the fastest: the fast tokenizer threads over a batch
    by itself. Workers (spawned, each loading the tokenizer once) run with those threads off, as
    ``datasets.map(num_proc=...)`` does; results and their order are the same either way.
    """
    if num_proc <= 1 or not fields:
        for batch in batches:
            yield batch, measure_batch(batch, fields, layout, counter=counter, audio=settings,
                                       decide_limits=decide_limits)
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(num_proc, initializer=_worker_init,
                  initargs=(counter, fields, layout, settings, decide_limits)) as pool:
        pending = []
        for batch in batches:
            pending.append((batch, pool.apply_async(_worker_measure, (batch,))))
            if len(pending) >= 2 * num_proc:
                head, job = pending.pop(0)
                yield head, job.get()
        for head, job in pending:
            yield head, job.get()


_WORKER: dict = {}


def _worker_init(counter, fields, layout, settings, decide_limits) -> None:
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(counter=counter, fields=fields, layout=layout, settings=settings, decide_limits=decide_limits)


def _worker_measure(batch):
    w = _WORKER
    return measure_batch(batch, w["fields"], w["layout"], counter=w["counter"], audio=w["settings"],
                         decide_limits=w["decide_limits"])


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
    """Where measured lengths go: ``lengths.parquet`` in a staging directory beside ``final``.

    With rules, the measured lengths are written first to ``.measured.parquet`` and the decide
    pass writes ``lengths.parquet`` with the decision columns. Without ``final`` (a library call
    with no ``out``), a temporary directory holds what the decide pass needs, or nothing is kept.
    """

    final: Path | None
    tmp: Path | None
    lengths: object
    measured_path: Path | None
    redact: bool = False

    @classmethod
    def start(cls, final: Path | None, fields, src, *, measured_only: bool = False,
              redact: bool = False) -> "_Output":
        import tempfile

        from .writer import LengthsWriter, lengths_schema, staging_dir

        if final is None and not measured_only:
            return cls(None, None, None, None)
        tmp = staging_dir(final) if final is not None else Path(tempfile.mkdtemp(prefix="lengthscan-"))
        multi = any(s.multi_file for s in src.splits)
        schema = lengths_schema(fields, with_split=src.has_splits, multi_file=multi)
        path = tmp / (".measured.parquet" if measured_only else "lengths.parquet")
        return cls(final, tmp, LengthsWriter(path, schema), path if measured_only else None, redact)

    def decide(self, src, plans, setup: Setup, resolved, keep_empty_targets: bool):
        """The decide pass over the measured lengths; writes ``lengths.parquet`` with decisions."""
        import pyarrow.parquet as pq

        from .decisions import (
            DecisionTally,
            MeasuredCursor,
            base_and_flags,
            decide,
            decision_columns,
            special_lengths,
        )

        self.lengths.close()
        self.lengths = None
        special = special_lengths(setup.counter, setup.fields)
        cursor = MeasuredCursor(self.measured_path)
        writer, tallies = None, []
        for split_src, plan in zip(src.splits, plans):
            tally = DecisionTally(split_src.name, plan.rows_total)
            for start in range(0, plan.size, 65536):
                table = cursor.take(min(65536, plan.size - start))
                base, flags = base_and_flags(table, setup.fields)
                d = decide(base, flags, resolved, special=special, keep_empty_targets=keep_empty_targets)
                tally.add(d)
                for name, col in decision_columns(d).items():
                    table = table.append_column(name, col)
                if self.final is not None:
                    writer = writer or pq.ParquetWriter(self.tmp / "lengths.parquet", table.schema)
                    writer.write_table(table)
            tallies.append(tally)
        if writer is not None:
            writer.close()
        self.measured_path.unlink()
        return tallies

    def finish(self, result: AuditResult) -> None:
        if self.lengths is not None:
            self.lengths.close()
        if self.final is None:
            self.abort()
            return
        from .report.html import write_html
        from .writer import publish, write_json

        data = result.to_dict()
        write_json(self.tmp / "report.json", data)
        write_html(self.tmp / "report.html", data, redact=self.redact)
        publish(self.tmp, self.final)

    def abort(self) -> None:
        import shutil

        try:
            if self.lengths is not None:
                self.lengths.close()
        except Exception:
            pass
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
