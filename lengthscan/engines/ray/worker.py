"""The Ray engine's worker actor: reads its read tasks with the local engine's readers
(``sources.formats``), measures them (``measure.batch.measure_batch``) or cleans and writes them
(``engines.ray.write.write_task``).

One pool of these actors serves a whole Ray session: every split and both passes of a clean. What
a call needs that is large or slow to set up (the run's ``Setup``, whose token counter loads its
tokenizer once; a split's parts, whose Parquet footers are read once) travels as ``Held``: a key and
an object reference, fetched by an actor the first time it sees the key and kept after.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from lengthscan.sources.source import SplitLayout

#: Objects an actor keeps (set-ups, splits, clean specs), the oldest dropped first.
KEEP = 16


@dataclass(frozen=True)
class Held:
    """An object in Ray's object store, known by ``key``: ``ref`` is a list so Ray hands it over as
    the reference, not the object, and the actor fetches it once."""

    key: str
    ref: list


@dataclass(frozen=True)
class MeasureJob:
    """What measuring one split's tasks needs besides the set-up and the split (small, per split)."""

    setup: Held
    fields: tuple
    layout: SplitLayout
    columns: list
    batch_rows: int
    raw: tuple
    with_ids: bool
    keep_columns: bool  # the rows' columns travel back (clean's single pass writes them on the driver)


class Worker:
    """A session's worker actor."""

    def __init__(self):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor, as local worker processes
        self.kept: dict = {}
        import lengthscan.measure.batch  # noqa: F401 (imported while the driver plans, not on the first call)
        import lengthscan.sources.formats  # noqa: F401

    def held(self, held: Held):
        if held.key not in self.kept:
            import ray

            while len(self.kept) >= KEEP:
                self.kept.pop(next(iter(self.kept)))
            self.kept[held.key] = ray.get(held.ref[0])
        return self.kept[held.key]

    def layout(self, fs, path: str, fmt: str):
        """One remote file's layout (``engines.ray.sources.file_layout``), for a run on a kept pool."""
        from lengthscan.engines.ray.sources import file_layout

        return file_layout(fs, path, fmt)

    def forget(self) -> None:
        """The run is over: its set-ups and splits dropped (the actor waits for the next run)."""
        self.kept.clear()

    def measure(self, job: MeasureJob, split: Held, task, take) -> tuple:
        """([(rows, role -> Measured, table or None)], traffic) of the task's rows (``take``: the
        split's sampled rows in it, None: all); the table holds the rows' columns
        (``keep_columns``), else the --id column, else is None."""
        from lengthscan.measure.batch import measure_batch
        from lengthscan.sources.formats import read_part

        setup, split_src = self.held(job.setup), self.held(split)
        part = split_src.parts[task.part]
        before = traffic(part)
        identity = setup.identity
        pieces = []
        for batch in read_part(split_src.name, part, job.columns, indices=take, batch_rows=job.batch_rows,
                               raw=job.raw, span=(task.lo, task.hi)):
            measured = measure_batch(batch, job.fields, job.layout, counter=setup.counter, audio=setup.settings,
                                     decide_caps=setup.decide_caps, with_ids=job.with_ids, chat=setup.chat,
                                     pairs=setup.pairs)
            table = batch.table if job.keep_columns else batch.table.select([identity.name]) if identity else None
            pieces.append((batch.rows, measured, table))
        return pieces, spent(part, before)

    def write(self, spec: Held, split: Held, out, task, offset: int, measured, index: int):
        """clean's second pass over one task: its rows read again (every column), cleaned and written
        as block shards (``engines.ray.write.write_task``); the ``BlockResult`` and the traffic."""
        from lengthscan.engines.ray.write import write_task
        from lengthscan.sources.formats import read_part

        spec_obj, split_src = self.held(spec), self.held(split)
        part = split_src.parts[task.part]
        before = traffic(part)
        batches = read_part(split_src.name, part, out.columns, batch_rows=spec_obj.batch_rows,
                            span=(task.lo, task.hi))
        return write_task(spec_obj, out, batches, offset, measured, index), spent(part, before)

    def info(self, setup: Held):
        """The counter's report entry here, with the counting method each role used in this actor."""
        if setup.key not in self.kept:
            return None
        counter = self.kept[setup.key].counter
        # a counter that counted (from a remembered proof, it never loads the tokenizer) or loaded it
        return counter.info() if counter is not None and (counter.loaded or counter.counting()) else None

    def proofs(self, setup: Held) -> dict:
        """Decide-only mode: the proof of each role's bounds, as this actor established it."""
        from lengthscan.engines.loop import proofs_of

        return proofs_of(self.held(setup))


def traffic(part):
    """The counts of the part's remote reads so far (None: not a counted remote file)."""
    counted = getattr(part.remote, "traffic", None)
    return counted.counts() if counted is not None else None


def spent(part, before) -> tuple | None:
    """What the part's reads cost since ``before`` (bytes, requests, retries)."""
    now = traffic(part)
    return None if now is None else tuple(int(a - b) for a, b in zip(np.array(now), np.array(before)))
