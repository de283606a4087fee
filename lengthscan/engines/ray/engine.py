"""The Ray engine of the measuring loop: read tasks read and measured by a session-wide actor pool.

Per split, the driver cuts the split into read tasks (``sources.formats.read_tasks``: a file's
row groups, or a row span of a file) in row order; each task's rows are given by its position,
known from the layout, so row ids need no global shuffle. The tasks go to the session's pool of
worker actors (``engines.ray.worker.Worker``, started once per Ray session and kept across splits
and both passes of a clean): an actor reads its task with the local engine's own reader and runs
``measure.batch.measure_batch`` on its ``batch_rows``-row batches. A ``Setup`` reaches an actor
once (its token counter pickles by name: the tokenizer loads once per actor and session). The
driver takes the measurements in task order and hands them to the measuring loop
(``engines.loop``): the same tallies, lengths, length cache and outputs as the local engine. Ray is
imported only inside these functions: the core package never needs it.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import numpy as np

from lengthscan.engines.ray.session import import_ray, ray_session, user_errors
from lengthscan.engines.ray.worker import Held, MeasureJob
from lengthscan.sources.scan import Batch


class RayEngine:
    """The loop's engine on a Ray cluster: ``address`` as ``ray.init`` takes it (None: the running
    session, else a new local one; ``"auto"`` joins a running cluster); ``num_blocks`` overrides
    the number of read tasks a split is cut into. The length cache is the local engine's (read and
    written on the driver); clean takes one pass where every threshold is known before measuring,
    its rows then written on the driver, else two, its writing done by the actors."""

    name = "ray"
    uses_cache = True
    single_pass = True
    #: The actors' class (None: ``engines.ray.worker.Worker``; a subclass of it, to time its calls).
    worker_class = None

    def __init__(self, address: str | None = None, num_blocks: int | None = None):
        self.address, self.num_blocks = address, num_blocks
        self.ray = import_ray()
        self.first_proofs: dict | None = None
        self._pool = None
        self._held: dict = {}   # id(object) -> (object, Held): what the actors fetch once
        self._setups: list = []  # the Held set-ups measured with (their counters' report entries)

    def check(self, source) -> None:
        """A source Ray can read distributed (an in-memory Dataset is refused before Ray starts)."""
        from lengthscan.engines.ray.sources import check_source

        check_source(source)

    def early(self, source, spec):
        """Nothing starts before the run's set-up: Ray's actors start in ``session``."""
        from contextlib import nullcontext

        return nullcontext()

    @contextmanager
    def session(self):
        """Ray for one run; its pool of actors kept for the next run inside ``keep_actors()`` where
        Ray was joined and the run ended well (``engines.ray.pool``), else killed."""
        from lengthscan.engines.ray.pool import keep_pool, keeping

        with ray_session(self.ray, self.address) as joined:
            ended_well = False
            try:
                yield self
                ended_well = True
            finally:
                if self._pool is not None:
                    if joined and ended_well and keeping():
                        keep_pool(self.ray, self._worker(), self._pool)
                    else:
                        self._pool.close()
                self._pool, self._held = None, {}

    def open(self, source, split: str | None, *, config: str | None = None, revision: str | None = None):
        from lengthscan.engines.ray.pool import kept_pool
        from lengthscan.engines.ray.sources import open_for_ray

        if self._pool is None:
            self._pool = kept_pool(self.ray, self._worker())
        # a kept pool's warm actors count the files (they hold every CPU a Ray task would wait for)
        layouts = None if self._pool is None else (
            lambda calls: list(self._pool.ordered(("layout", args) for args in calls)))
        src = open_for_ray(self.ray, source, split, config=config, revision=revision, layouts=layouts)
        # else the actors start now (after the layout, whose Ray tasks need the CPUs they will hold),
        # while the driver plans the sample and opens its outputs
        self.pool()
        return src

    def pool(self):
        """The run's worker actors (a kept pool's, taken by ``open``), started on first use."""
        if self._pool is None:
            from lengthscan.engines.ray.pool import ActorPool

            self._pool = ActorPool(self.ray, self._worker())
        return self._pool

    def _worker(self):
        from lengthscan.engines.ray.worker import Worker

        return self.worker_class or Worker

    def hold(self, obj) -> Held:
        """``obj`` in the object store once for the session (the actors fetch it once each)."""
        if id(obj) not in self._held:
            self._held[id(obj)] = (obj, Held(uuid.uuid4().hex, [self.ray.put(obj)]))
        return self._held[id(obj)][1]

    def tasks(self, split_src, batch_rows: int) -> list:
        """The split's read tasks: ``num_blocks`` of them if asked, else about eight per actor and
        more for a large split (tasks of about four batches), each at least a batch: small enough
        that the last tasks leave no actor idle for long."""
        from lengthscan.sources.formats import read_tasks

        pieces = self.num_blocks or max(8 * len(self.pool()), split_src.num_rows // (4 * batch_rows))
        return read_tasks(split_src, pieces, batch_rows)

    def add_traffic(self, split_src, spent) -> None:
        """An actor's reads of the split's remote files, counted with the driver's (the report's bytes)."""
        counted = getattr(split_src.parts[0].remote, "traffic", None) if split_src.parts else None
        if spent is not None and counted is not None:
            counted.add_counts(spent)

    def measure(self, split_src, plan, setup, fields: tuple, columns: list[str], *, batch_rows: int,
                with_ids: bool = False, keep_columns: bool = False):
        """(batch, role -> Measured) for the plan's rows, in row order; a user error raised in an
        actor as itself (``user_errors``). ``keep_columns``: the batches carry the rows' columns."""
        if not columns:  # every length came from the cache: nothing to read
            from lengthscan.engines.loop import row_batches

            for batch in row_batches(plan, batch_rows):
                yield batch, {}
            return
        with user_errors():
            yield from self._measure(split_src, plan, setup, fields, columns, batch_rows, with_ids, keep_columns)

    def _measure(self, split_src, plan, setup, fields, columns, batch_rows, with_ids, keep_columns):
        from lengthscan.engines.ray.sources import check_unchanged

        held = self.hold(setup)
        if held not in self._setups:
            self._setups.append(held)
        raw = tuple(c for f in fields for c in f.kind.raw_columns(f))  # e.g. conversations as the file has them
        job = MeasureJob(held, fields, split_src.layout(), columns, batch_rows, raw, with_ids, keep_columns)
        split = self.hold(split_src)
        calls = []
        for task in self.tasks(split_src, batch_rows):
            take = None
            if plan.indices is not None:
                start = split_src.parts[task.part].start
                lo, hi = np.searchsorted(plan.indices, [start + task.lo, start + task.hi])
                if hi == lo:
                    continue
                take = plan.indices[lo:hi]
            calls.append(("measure", (job, split, task, take)))
        done = 0
        try:
            for pieces, spent in self.pool().ordered(calls):
                self.add_traffic(split_src, spent)
                for rows, measured, table in pieces:
                    done += rows.size
                    yield Batch(rows, table), measured
            if self.first_proofs is None and setup.decide_caps and calls:
                # the actor of the first task measured the local engine's first batch: same texts checked
                self.first_proofs = self.pool().first("proofs", held)
        except Exception:
            check_unchanged(split_src)  # a file rewritten while it was read: said so
            raise
        if done != plan.size:
            raise RuntimeError(f"split {split_src.name}: Ray measured {done} rows (expected {plan.size})")

    def write_pass(self, src, plans, spec, measured_path, *, progress=None):
        """clean's second pass on the worker actors (see ``engines.ray.write``)."""
        from lengthscan.engines.ray.write import write_pass

        with user_errors():
            return write_pass(self, src, plans, spec, measured_path, progress=progress)

    def tokenizer_info(self, counter, cached):
        """The tokenizer's report entry as the actors saw it (methods of every role merged, the
        count-only engine's tallies added up), with the roles whose lengths came from the cache."""
        if counter is None:
            return None
        from dataclasses import replace

        from lengthscan.engines.workers import add_counting

        infos = [i for held in self._setups for i in (self._pool.each("info", held) if self._pool else [])
                 if i is not None]
        base = counter.info(cached=set(cached))
        if not infos:
            return base
        methods, counting = dict(base.methods), {}
        for info in infos:
            methods.update(info.methods)
            add_counting(counting, info.counting)
        return replace(infos[0], methods=dict(sorted(methods.items())), counting=dict(sorted(counting.items())))

    def proofs(self, setup) -> dict:
        """Decide-only mode: the proofs as the actor that measured the first task established them."""
        if self.first_proofs is not None:
            return self.first_proofs
        return {role: None for role in setup.decide_caps}
