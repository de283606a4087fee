"""One measuring pass over a split: cached lengths where there are, the measure step (in this
process or in workers) for the rest, into a tally and the lengths file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lengthscan.measure.batch import measure_batch
from lengthscan.measure.cache import CacheReader, CacheWriter, cached_path, field_key
from lengthscan.measure.records import Measured
from lengthscan.sources.sampling import SamplePlan
from lengthscan.sources.scan import Batch, iter_batches
from lengthscan.sources.source import SplitSource
from lengthscan.stats.tally import SplitTally

if TYPE_CHECKING:
    from lengthscan.engines.setup import Setup


def measure_split(split_src: SplitSource, plan: SamplePlan, setup: Setup, tally: SplitTally, *, cache: bool,
                  batch_rows: int, output, progress, with_split: bool, num_proc: int = 1,
                  columns: list[str] | None = None, on_batch=None, with_ids: bool = False) -> list[str]:
    """Measure the plan's rows of one split into ``tally`` and ``output.lengths``; returns the
    roles whose lengths came from the cache. ``columns`` (default: those measured) are read, and
    ``on_batch(batch, measured)`` sees every batch after that (``clean``'s single pass), with the
    token ids when ``with_ids``."""
    fields, counter, settings = setup.fields, setup.counter, setup.settings
    text = [f for f in fields if f.kind == "text"]
    keys = {f.role: field_key(split_src.fingerprint, f.column, f.primary.name, counter.hash, counter.max_chars)
            for f in text} if cache and text else {}
    readers = {role: CacheReader(p) for role, k in keys.items() if (p := cached_path(k)) is not None}
    writers = {role: CacheWriter(k) for role, k in keys.items()
               if plan.full and role not in readers and role not in setup.decide_limits}
    to_measure = [f for f in fields if f.role not in readers]
    if columns is None:
        columns = list(dict.fromkeys(f.column for f in to_measure))
    batches = (iter_batches(split_src, columns, indices=plan.indices, batch_rows=batch_rows) if columns
               else _row_batches(plan, batch_rows))
    done = 0
    try:
        for batch, measured in _measured(batches, to_measure, split_src.layout(), counter, settings, num_proc,
                                         setup.decide_limits, with_ids):
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
            if on_batch is not None:
                on_batch(batch, measured)
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


def _measured(batches, fields, layout, counter, settings, num_proc: int, decide_limits=None, with_ids=False):
    """(batch, measurements) in row order: in this process, or in ``num_proc`` worker processes.

    One process is the default and usually the fastest: the fast tokenizer threads over a batch
    by itself. Workers (spawned, each loading the tokenizer once) run with those threads off, as
    ``datasets.map(num_proc=...)`` does; results and their order are the same either way.
    """
    if num_proc <= 1 or not fields:
        for batch in batches:
            yield batch, measure_batch(batch, fields, layout, counter=counter, audio=settings,
                                       decide_limits=decide_limits, with_ids=with_ids)
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(num_proc, initializer=_worker_init,
                  initargs=(counter, fields, layout, settings, decide_limits, with_ids)) as pool:
        pending = []
        for batch in batches:
            pending.append((batch, pool.apply_async(_worker_measure, (batch,))))
            if len(pending) >= 2 * num_proc:
                head, job = pending.pop(0)
                yield head, job.get()
        for head, job in pending:
            yield head, job.get()


_WORKER: dict = {}


def _worker_init(counter, fields, layout, settings, decide_limits, with_ids=False) -> None:
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(counter=counter, fields=fields, layout=layout, settings=settings, decide_limits=decide_limits,
                   with_ids=with_ids)


def _worker_measure(batch):
    w = _WORKER
    return measure_batch(batch, w["fields"], w["layout"], counter=w["counter"], audio=w["settings"],
                         decide_limits=w["decide_limits"], with_ids=w["with_ids"])


def _too_long_errors(flags: np.ndarray, counter) -> list | None:
    from lengthscan.measure.records import FLAG_TOO_LONG

    if not (flags == FLAG_TOO_LONG).any():
        return None
    return [f"longer than --max-chars {counter.max_chars:,} characters" if k == FLAG_TOO_LONG else None
            for k in flags]


def _row_batches(plan: SamplePlan, batch_rows: int):
    rows = np.arange(plan.rows_total, dtype=np.int64) if plan.indices is None else plan.indices
    for k in range(0, rows.size, batch_rows):
        yield Batch(rows[k:k + batch_rows], pa.record_batch([], schema=pa.schema([])))
