"""The measuring loop: every split of a source, measured by an engine, into tallies and sinks.

One loop for audit, clean (its single pass and the first of its two passes) and, through
``audit``, the memory data mode. What differs between running in this process, in worker
processes or on Ray is one parameter, the engine, which turns a split and its sample plan into
``(batch, measurements)`` in row order:

    for split:   plan -> engine.measure(split, plan) -> cache -> tally.add -> sinks.write -> progress

The engine and the sinks are the two interfaces of ``engines.protocols`` (``Engine``, ``Sink``):
``LocalEngine`` here, ``engines.ray.engine.RayEngine`` for Ray. ``single_pass`` engines give
batches that carry the source's columns when ``measure(..., keep_columns=True)`` asks, so that clean
can write while measuring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from lengthscan.engines.options import RunOptions
from lengthscan.engines.protocols import Engine, Sink
from lengthscan.engines.validity import KindCheck
from lengthscan.engines.workers import WorkerJob, add_counting, start_worker, usable_cores, worker_measure
from lengthscan.measure.batch import measure_batch
from lengthscan.measure.cache import cached_path
from lengthscan.measure.kinds import MeasureContext
from lengthscan.measure.setup import Setup
from lengthscan.measure.text.choice import FAILED, PENDING
from lengthscan.sources.sampling import SamplePlan, sample_indices
from lengthscan.sources.scan import Batch, iter_batches
from lengthscan.sources.source import Source, SplitSource
from lengthscan.stats.records import SplitAudit
from lengthscan.stats.tally import SplitTally

#: Rows whose lengths the batch simulation keeps (a uniform sample beyond it: memory stays flat).
SIMULATION_ROWS = 1_000_000
#: Rows of the batches conversations are shared out in between processes (``chat_pool``).
SHARED_BATCH_ROWS = 512
#: Without ``num_proc``: conversations of at least this many rows are measured by this process and
#: worker processes, at most this many in all (``LocalEngine.processes``).
AUTO_ROWS, AUTO_PROCESSES = 2_000, 4
#: Bytes of batches measured before transformers has loaded a first run's tokenizer that are held,
#: at most, until their counts are confirmed (``measure_here``): memory stays bounded.
HELD_BYTES = 512 << 20


@dataclass(frozen=True, eq=False)
class Measurement:
    """What measuring a source gave, per split in source order."""

    splits: tuple[SplitAudit, ...]
    tallies: tuple[SplitTally, ...]
    plans: tuple[SamplePlan, ...]
    cached: frozenset                 # roles whose lengths came from the length cache


def measure_source(src: Source, setup: Setup, engine: Engine, *, plan_for: Callable[[SplitSource], SamplePlan],
                   run: RunOptions, ratios: tuple = (), seed: int = 0, sinks: Sequence[Sink] = (),
                   all_columns: bool = False,
                   with_ids: bool = False) -> Measurement:
    """Measure every split of ``src`` by its plan (``plan_for(split)``) with ``engine``; each
    measured batch goes to every sink. ``all_columns`` reads every source column (clean's single
    pass writes them); ``with_ids`` keeps the token ids measuring made (``clean --tokenize``)."""
    splits, tallies, plans, cached = [], [], [], set()
    kinds = KindCheck(setup.fields, multi_split=len(src.splits) > 1)
    sinks = [*sinks, kinds]
    for split_src in src.splits:
        plan = plan_for(split_src)
        tally = SplitTally(setup.fields, setup.ceilings, ratios, keep_positions=simulation_positions(plan, seed),
                            design=plan.design)
        for sink in sinks:
            sink.open_split(split_src, plan)
        cached |= measure_split(split_src, plan, setup, tally, engine, run=run, sinks=sinks,
                                columns=list(split_src.column_names) if all_columns else None, with_ids=with_ids)
        for sink in sinks:
            sink.close_split(split_src)
        splits.append(tally.split_audit(split_src.name, plan, seed))
        tallies.append(tally)
        plans.append(plan)
    kinds.check()
    if setup.counter is not None:
        setup.counter.settle()  # a count-only proof made beside the counting: waited for, cached for the next run
    return Measurement(tuple(splits), tuple(tallies), tuple(plans), frozenset(cached))


def simulation_positions(plan: SamplePlan, seed: int):
    """Positions (in measuring order) of the rows kept for the batch simulation; None: all."""
    if plan.size <= SIMULATION_ROWS:
        return None
    return sample_indices(plan.size, SIMULATION_ROWS, seed)


def measure_split(split_src: SplitSource, plan: SamplePlan, setup: Setup, tally: SplitTally, engine: Engine, *,
                  run: RunOptions, sinks: Sequence[Sink] = (), columns: list[str] | None = None,
                  with_ids: bool = False) -> set:
    """Measure the plan's rows of one split into ``tally`` and the sinks; returns the roles whose
    lengths came from the cache. ``columns`` (default: those measured) are read."""
    fields = setup.fields
    cached = [f for f in fields if f.kind.cached(f)]
    use_cache = run.cache and engine.uses_cache and cached
    ctx = MeasureContext(setup.counter, chat=setup.chat)
    keys = {f.role: f.kind.cache_key(split_src.fingerprint, f, ctx) for f in cached} if use_cache else {}
    by_role = {f.role: f for f in cached}
    readers = {f.role: r for f in cached if f.role in keys
               and (p := cached_path(keys[f.role])) is not None
               and (r := _cache_open(partial(f.kind.cache_reader, rows=split_src.num_rows), f, p)) is not None}
    writers = {f.role: w for f in cached if f.role in keys
               and plan.full and f.role not in readers and f.role not in setup.decide_caps
               and (w := _cache_open(f.kind.cache_writer, f, keys[f.role])) is not None}
    to_measure = tuple(f for f in fields if f.role not in readers)
    keep_columns = columns is not None  # the sinks write the rows (clean's single pass)
    if columns is None:
        columns = list(dict.fromkeys(c for f in to_measure for c in f.columns))
    if setup.identity is not None and setup.identity.name not in columns:
        columns = [*columns, setup.identity.name]  # --id COL, for the lengths file
    done = 0
    try:
        for batch, measured in engine.measure(split_src, plan, setup, to_measure, columns, batch_rows=run.batch_rows,
                                              with_ids=with_ids, keep_columns=keep_columns):
            for f in fields:
                if f.role in readers:
                    measured[f.role] = f.kind.from_cache(f, readers[f.role], batch.rows, ctx)
                elif f.role in writers:
                    f.kind.to_cache(f, writers[f.role], measured[f.role])
            tally.add(batch.rows, measured)
            for sink in sinks:
                sink.write(split_src, batch, measured)
            done += batch.rows.size
            if run.progress is not None:
                run.progress(split_src.name, done, plan.size)
        if done != plan.size:
            raise RuntimeError(f"split {split_src.name}: measured {done} rows, expected {plan.size}")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for role, w in writers.items():
        _cache_open(lambda f, writer: writer.commit(), by_role[role], w)  # an unwritable cache: one warning
    return set(readers)


def _cache_open(opener, f, where):
    """A cache reader or writer, or None (with one warning) where the cache cannot be used: the
    cache is an optimisation, a corrupt file or an unwritable folder never stops a run."""
    import warnings

    try:
        return opener(f, where)
    except (OSError, pa.ArrowException) as exc:
        if isinstance(where, Path) and isinstance(exc, pa.ArrowException):  # a corrupt file: rebuilt this run
            try:
                where.unlink(missing_ok=True)
            except OSError:
                pass
        warnings.warn(f"lengthscan: length cache not used ({type(exc).__name__}: {exc}); measuring instead",
                      RuntimeWarning, stacklevel=2)
        return None


class LocalEngine:
    """Measure in this process, or in ``num_proc`` processes (None: ``processes`` chooses).

    For text one process is the default and usually the fastest: the fast tokenizer threads over a
    batch by itself. Workers (spawned, torch hidden where the parent hides it, the tokenizer loaded
    once unless its fast path is remembered on disk) run with those threads off, as
    ``datasets.map(num_proc=...)`` does. Where measuring is Python (``Kind.python_bound``: a chat
    template's rendering) the parent measures too, beside ``num_proc - 1`` workers: a process fewer
    (its memory) for the same cores; conversations, preference pairs and RL prompts go to workers
    that hold no tokenizer (``chat_pool``), conversations so by default once they are many
    (``processes``). Results and their order are the same either way.
    """

    name = "local"
    uses_cache = True
    single_pass = True

    def __init__(self, num_proc: int | None = None):
        self.num_proc = None if num_proc is None else max(1, int(num_proc))  # None: chosen per split (``processes``)
        self.worker_counting: dict = {}  # worker pid -> (methods, counting) of its tokenizer, as it last said
        self._early = None  # chat workers started as the run began (``early``)

    def check(self, source) -> None:
        """Every source ``open_source`` opens is measured here."""

    def early(self, source, spec):
        """Chat workers started before the run's set-up where it will want them
        (``chat_pool.early_workers``): they import while this process loads the tokenizer."""
        from lengthscan.engines.chat_pool import Early, early_workers

        wanted = early_workers(source, spec, self.num_proc, max(1, min(AUTO_PROCESSES, usable_cores())))
        if wanted < 1:
            return nullcontext()
        self._early = Early(wanted)
        return self._early

    def session(self):
        return nullcontext(self)

    def open(self, source, split: str | None, *, config: str | None = None, revision: str | None = None) -> Source:
        from lengthscan.sources.opener import open_source

        return open_source(source, split=split, config=config, revision=revision)

    def measure(self, split_src: SplitSource, plan: SamplePlan, setup: Setup, fields: tuple, columns: list[str], *,
                batch_rows: int, with_ids: bool = False, keep_columns: bool = False):
        """(batch, role -> Measured) for the plan's rows, in row order (the batches always carry
        the ``columns`` read here: ``keep_columns`` asks it of an engine that would not)."""
        raw = tuple(c for f in fields for c in f.kind.raw_columns(f))  # e.g. conversations as the file has them
        apart = (bool(fields) and all(f.kind.renders_apart for f in fields)
                 and setup.rendered_by is not None and setup.rendered_by.renders_apart)
        # preference pairs and RL prompts: worker processes where --num-proc asks (the tokenizer's ids
        # of their texts are this process's: 1.06x and 1.0x faster on 2 cores, at 1.2x the memory)
        num_proc = self.processes(plan.size, apart and setup.chat is not None)
        apart = apart and num_proc > 1
        if apart:  # batches a process takes: small enough that the processes end together
            batch_rows = min(batch_rows, SHARED_BATCH_ROWS)
        batches = (iter_batches(split_src, columns, indices=plan.indices, batch_rows=batch_rows, raw=raw) if columns
                   else row_batches(plan, batch_rows))
        layout = split_src.layout()
        workers = min(num_proc, -(-plan.size // batch_rows))  # never more processes than batches

        def here(batch: Batch, rendered: dict | None = None) -> dict:
            return measure_batch(batch, fields, layout, counter=setup.counter, audio=setup.settings,
                                 decide_caps=setup.decide_caps, with_ids=with_ids, chat=setup.chat,
                                 pairs=setup.pairs, rendered=rendered)

        if workers <= 1 or not fields:
            yield from measure_here(batches, setup.counter, here)
            return
        if apart:  # conversations: workers without the tokenizer
            from lengthscan.engines.chat_pool import chat_batches

            yield from chat_batches(batches, setup, fields, layout, workers - 1, here, with_ids=with_ids,
                                    early=self._early)
            return
        # rendering conversations is Python: the parent takes batches too, beside one worker fewer
        beside = any(f.kind.python_bound for f in fields)
        helpers = workers - 1 if beside else workers
        import multiprocessing as mp
        import pickle

        from lengthscan.torchless import torch_hidden

        job = pickle.dumps(WorkerJob(setup, fields, layout, with_ids))  # unpickled after torch is hidden
        with mp.get_context("spawn").Pool(helpers, initializer=start_worker, initargs=(job, torch_hidden())) as pool:
            yield from self._share(pool, batches, 2 * helpers, here if beside else None)

    def processes(self, rows: int, apart: bool) -> int:
        """The processes that measure ``rows``: ``num_proc`` where given; else one, but for
        conversations rendered apart (``apart``) of ``AUTO_ROWS`` rows or more: one per core this
        process may use, at most ``AUTO_PROCESSES`` (rendering is Python; each worker holds about
        60 MB and the count-only engine's tables, no tokenizer)."""
        if self.num_proc is not None:
            return self.num_proc
        if not apart or rows < AUTO_ROWS:
            return 1
        return max(1, min(AUTO_PROCESSES, usable_cores()))

    def _share(self, pool, batches, queued: int, here: Callable | None):
        """(batch, measurements) in row order, the batches measured by the pool's workers, at most
        ``queued`` of them waiting there; with ``here``, the parent measures a batch itself whenever
        that many wait (so it takes about a worker's share; None: every batch goes to the pool)."""
        from collections import deque

        pending: deque = deque()  # (batch, AsyncResult or the parent's own measurements)

        def waiting() -> int:
            return sum(1 for _, r in pending if not isinstance(r, dict) and not r.ready())

        for batch in batches:
            if here is None or waiting() < queued:
                pending.append((batch, pool.apply_async(worker_measure, (batch,))))
            else:
                pending.append((batch, here(batch)))
            while pending and (len(pending) > 2 * queued or isinstance(pending[0][1], dict)
                               or pending[0][1].ready() or (here is None and len(pending) >= queued)):
                head, result = pending.popleft()
                yield head, result if isinstance(result, dict) else self._from_worker(result.get())
        for head, result in pending:
            yield head, result if isinstance(result, dict) else self._from_worker(result.get())

    def _from_worker(self, answer: tuple) -> dict:
        """A worker's measurements; how its tokenizer counted (cumulative) kept for the report."""
        measured, pid, counting = answer
        if counting is not None:
            self.worker_counting[pid] = counting
        return measured

    def write_pass(self, src, plans, spec, measured_path, *, progress=None):
        """clean's second pass: the source read again beside the measured lengths, written here."""
        from lengthscan.policy.decisions import decide_rows
        from lengthscan.write.clean_writer import CleanWriter, second_pass

        return second_pass(CleanWriter(spec, src, progress=progress), plans, measured_path,
                           lambda measured: decide_rows(spec, measured))

    def tokenizer_info(self, counter, cached):
        """The tokenizer's report entry (None without text fields): how this process counted, with
        what the worker processes counted (their methods, and the count-only engine's tallies added)."""
        if counter is None:
            return None
        from dataclasses import replace

        info = counter.info(cached=set(cached))
        counted = list(self.worker_counting.values())
        self.worker_counting = {}
        if not counted:
            return info
        methods, counting = dict(info.methods), {role: dict(c) for role, c in info.counting.items()}
        for worker_methods, worker_counting in counted:
            methods.update(worker_methods)
            add_counting(counting, worker_counting)
        return replace(info, methods=dict(sorted(methods.items())), counting=dict(sorted(counting.items())))

    def proofs(self, setup: Setup) -> dict:
        """Decide-only mode: the proof of each role's bounds, as this process established it."""
        return proofs_of(setup)


def measure_here(batches, counter, measure: Callable):
    """(batch, ``measure(batch)``) in this process. On a first run with a tokenizer, counting begins
    while transformers loads it (``TokenCounter.speculating``): the batches measured meanwhile are
    held (at most ``HELD_BYTES``, then the load is waited for) until their counts are confirmed,
    and measured again where they are not."""
    if counter is None:
        for batch in batches:
            yield batch, measure(batch)
        return
    held: list = []
    size = 0
    with counter.speculating():
        for batch in batches:
            held.append((batch, measure(batch)))
            size += batch.table.nbytes
            state = counter.speculation(wait=size >= HELD_BYTES)
            if state != PENDING:
                yield from held if state != FAILED else [(b, measure(b)) for b, _ in held]
                held, size = [], 0
        if held and counter.speculation(wait=True) == FAILED:
            held = [(b, measure(b)) for b, _ in held]
    yield from held


def proofs_of(setup: Setup) -> dict:
    """role -> the proof of its decide-only bounds (None where none was established)."""
    counter = setup.counter
    return {role: (counter.proof(role).to_dict() if counter is not None and counter.proof(role) else None)
            for role in setup.decide_caps}


def row_batches(plan: SamplePlan, batch_rows: int):
    """Column-less batches of the plan's rows (every length came from the cache)."""
    rows = np.arange(plan.rows_total, dtype=np.int64) if plan.indices is None else plan.indices
    for k in range(0, rows.size, batch_rows):
        yield Batch(rows[k:k + batch_rows], pa.record_batch([], schema=pa.schema([])))
