"""The Ray Data engine of the measuring loop: blocks read by Ray, measured by a pool of actors.

Per split, Ray Data's readers (``read_parquet``, ``read_json``, ``read_csv``; the Arrow files of a
``save_to_disk`` directory through ``map_batches``; see ``engines.ray.sources``) stream blocks in
source order (``preserve_order``); the driver sees only block references and their row counts,
so it knows each block's first row position without a global shuffle. Each block (or a piece of
one, see ``block_pieces``) goes by reference to one of a pool of measuring actors. An actor gets
the set-up once in its constructor: a ``TokenCounter`` pickles by name, so a local tokenizer
directory is loaded once per actor, never per batch. It runs ``measure.batch.measure_batch`` on the
block's rows (or the sampled ones) and returns the per-row measurements, which the driver hands
to the measuring loop (``engines.loop``) in row order: the same tallies, lengths and outputs as
the local engine. Ray is imported only inside these functions: the core package never needs it.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager

import numpy as np

from lengthscan.engines.ray.pool import block_pieces, block_refs, start_actors, table_batches
from lengthscan.engines.ray.session import EngineError, import_ray, ray_session, user_errors
from lengthscan.sources.scan import Batch


class RayEngine:
    """The loop's engine on a Ray cluster: ``address`` as ``ray.init`` takes it (None: the running
    session, else a new local one; ``"auto"`` joins a running cluster); ``num_blocks`` overrides
    the number of read blocks. The length cache is not used (the cluster's workers do not share
    this machine's cache directory); clean always takes two passes, its writing done by actors."""

    name = "ray"
    uses_cache = False
    single_pass = False

    def __init__(self, address: str | None = None, num_blocks: int | None = None):
        self.address, self.num_blocks = address, num_blocks
        self.ray = import_ray()
        self.infos: list = []
        self.first_proofs: dict | None = None

    def check(self, source) -> None:
        """A source Ray can read distributed (a hub id is refused before Ray starts)."""
        from lengthscan.engines.ray.sources import check_source

        check_source(source)

    @contextmanager
    def session(self):
        with ray_session(self.ray, self.address):
            yield self

    def open(self, source, split: str | None, *, config: str | None = None, revision: str | None = None):
        from lengthscan.engines.ray.sources import open_for_ray

        if config is not None or revision is not None:
            raise EngineError("--config and --revision (a hub dataset id) are read by the local engine only: drop "
                              "--engine ray")
        return open_for_ray(self.ray, source, split)

    def measure(self, split_src, plan, setup, fields: tuple, columns: list[str], *, batch_rows: int,
                with_ids: bool = False):
        """(batch without its columns, role -> Measured) for the plan's rows, in row order; a user
        error raised in an actor or read task as itself (``user_errors``)."""
        with user_errors():
            yield from self._measure(split_src, plan, setup, fields, columns, batch_rows=batch_rows)

    def _measure(self, split_src, plan, setup, fields: tuple, columns: list[str], *, batch_rows: int):
        from lengthscan.engines.ray.sources import check_unchanged, read_split

        ray = self.ray
        columns = columns or list(dict.fromkeys(c for f in fields for c in f.columns))
        ds = read_split(ray, split_src, columns, self.num_blocks)
        # the job is small (a TokenCounter pickles by name), passed inline so a restarted actor has it
        actors = start_actors(ray, Measurer, setup, fields, split_src.layout(), columns, batch_rows)
        pending: deque = deque()
        offset = submitted = 0
        try:
            for ref, n in block_refs(ray, ds):
                take = np.arange(n, dtype=np.int64)
                if plan.indices is not None:
                    lo, hi = np.searchsorted(plan.indices, [offset, offset + n])
                    take = plan.indices[lo:hi] - offset
                for lo, hi in block_pieces(take.size, len(actors), batch_rows):
                    part = None if hi - lo == n else take[lo:hi]  # None: the whole block, no copy
                    pending.append(actors[submitted % len(actors)].measure.remote(ref, offset, part))
                    submitted += 1
                offset += n
                while len(pending) > 2 * len(actors):
                    yield from _pieces(ray.get(pending.popleft()))
            while pending:
                yield from _pieces(ray.get(pending.popleft()))
            self.infos += [i for i in ray.get([a.info.remote() for a in actors]) if i is not None]
            if self.first_proofs is None and setup.decide_caps:
                # the actor of the first block measured the local engine's first batch: same texts checked
                self.first_proofs = ray.get(actors[0].proofs.remote())
        except Exception:
            check_unchanged(split_src)  # a file rewritten while it was read: said so
            raise
        finally:
            for ref in pending:  # calls left after an error: cancelled, not retried on a killed actor (Ray says
                ray.cancel(ref)  # that on stdout: "Task Measurer.measure failed. There are infinite retries ...")
            for a in actors:
                ray.kill(a)
        check_unchanged(split_src)
        if offset != split_src.num_rows:
            raise RuntimeError(f"split {split_src.name}: Ray read {offset} rows (expected {split_src.num_rows})")

    def write_pass(self, src, plans, spec, measured_path, *, progress=None):
        """clean's second pass on writing actors (see ``engines.ray.write``)."""
        from lengthscan.engines.ray.write import write_pass

        with user_errors():
            return write_pass(self, src, plans, spec, measured_path, progress=progress)

    def tokenizer_info(self, counter, cached):
        """The tokenizer's report entry as the measuring actors saw it (methods of every role merged)."""
        if counter is None:
            return None
        if not self.infos:
            return counter.info()
        from dataclasses import replace

        methods, counting = {}, {}
        for info in self.infos:
            methods.update(info.methods)
            for role, c in info.counting.items():  # the count-only engine's tallies add up over actors
                if role not in counting:
                    counting[role] = dict(c)
                    continue
                for key in ("texts", "by_tokenizer", "verified"):
                    if key in c:
                        counting[role][key] = counting[role].get(key, 0) + c[key]
        return replace(self.infos[0], methods=dict(sorted(methods.items())), counting=dict(sorted(counting.items())))

    def proofs(self, setup) -> dict:
        """Decide-only mode: the proofs as the actor that measured the first block established them."""
        if self.first_proofs is not None:
            return self.first_proofs
        return {role: None for role in setup.decide_caps}


def _pieces(pieces):
    for rows, measured, identity in pieces:
        yield Batch(rows, identity), measured


class Measurer:
    """A measuring actor: the set-up arrives once, in the constructor (the tokenizer loads here)."""

    def __init__(self, setup, fields, layout, columns, batch_rows):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor, as local worker processes
        self.setup, self.fields, self.layout = setup, fields, layout
        self.columns, self.batch_rows = columns, batch_rows

    def measure(self, block, offset: int, take) -> list:
        """[(rows, role -> Measured, --id's column or None)] of the block's rows (``take``: local
        positions, or all)."""
        import pyarrow as pa

        from lengthscan.measure.batch import measure_batch

        if not isinstance(block, pa.Table):  # a pandas block: back to Arrow
            block = pa.Table.from_pandas(block, preserve_index=False)
        table = block.select(self.columns) if self.columns else block
        if take is not None:
            table = table.take(pa.array(take))
        rows = offset + (np.arange(table.num_rows, dtype=np.int64) if take is None else take.astype(np.int64))
        pieces = []
        for batch in table_batches(table, rows, self.batch_rows):
            measured = measure_batch(batch, self.fields, self.layout, counter=self.setup.counter,
                                     audio=self.setup.settings, decide_caps=self.setup.decide_caps,
                                     chat=self.setup.chat)
            identity = self.setup.identity  # --id COL travels back for the lengths file
            pieces.append((batch.rows, measured, batch.table.select([identity.name]) if identity else None))
        return pieces

    def info(self):
        """The counter's report entry here, with the counting method each role used in this actor."""
        counter = self.setup.counter
        # a counter that counted (from a remembered proof, it never loads the tokenizer) or loaded it
        return counter.info() if counter is not None and (counter.loaded or counter.counting()) else None

    def proofs(self) -> dict:
        """Decide-only mode: the proof of each role's bounds, as this actor established it."""
        from lengthscan.engines.loop import proofs_of

        return proofs_of(self.setup)
