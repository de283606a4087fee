"""``audit`` on Ray Data: the same measure step, tallies, sample and outputs as the local engine.

Data flow, per split: Ray Data's readers (``read_parquet``, ``read_json``, ``read_csv``; the Arrow
files of a ``save_to_disk`` directory through ``map_batches``; see ``engine_ray_sources``) stream
blocks in source order (``preserve_order``); the driver sees only block references and their row
counts, so it knows each block's first row position without a global shuffle. Each block goes, by reference, to one of a
pool of measuring actors. An actor gets the set-up (fields, token counter, audio settings) once in
its constructor: a ``TokenCounter`` pickles by name, so a local tokenizer directory is loaded once
per actor, never per batch. It runs ``measure.measure_batch`` on the block's rows (or the sampled
ones), tallies them in a ``tally.SplitTally`` and returns that block tally with the per-row lengths.

The driver merges the block tallies (exact histograms: counts, flags, percentiles from the merged
histograms, as the local engine computes them) and streams the small per-row length arrays, block
by block in row order, into the same ``writer.LengthsWriter`` the local engine uses, so
``lengths.parquet`` has the same columns and rows; reports are written by ``outputs._Output``.
Ray is imported only inside these functions: the core package never needs it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

import numpy as np

from lengthscan.engines.ray.session import EngineError, _import_ray, ray_session
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.sampling import DEFAULT_SEED, plan_sample
from lengthscan.sources.scan import BATCH_ROWS, Batch

__all__ = ["EngineError", "audit_ray"]


def audit_ray(source, *, ray_address: str | None = None, num_blocks: int | None = None, tokenizer=None,
              input: str | None = None, target: str | None = None, audio: str | None = None,
              model: str | None = None, sampling_rate: int | None = None, split: str | None = None,
              sample=None, full: bool = False, seed: int = DEFAULT_SEED, limits=(), action: str = "drop",
              keep_empty_targets: bool = False, crop_audio: bool = False, fail_over=None,
              out: str | Path | None = None, overwrite: bool = False, cache: bool = True,
              max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS, redact: bool = False,
              num_proc: int = 1, progress=None, command: str | None = None):
    """``lengthscan.audit`` on a Ray cluster: same arguments, same ``AuditResult`` and outputs.

    ``ray_address`` is passed to ``ray.init`` (None: the running Ray session, else a new local
    one; ``"auto"`` joins a running cluster). ``num_blocks`` overrides the number of read blocks.
    The length cache is not used (``cache`` is accepted and ignored); ``num_proc`` is ignored (the
    actor pool uses the cluster's CPUs). ``--limit`` decisions run on the driver over the merged
    ``lengths`` file, as in the local engine.
    """
    from lengthscan.engines.results import audit_result, decisions_dict, simulation_positions
    from lengthscan.engines.setup import prepare_with_rules
    from lengthscan.measure.batch import check_columns
    from lengthscan.stats.tally import SplitTally
    from lengthscan.write.audit_output import _Output

    ray = _import_ray()
    started = time.perf_counter()
    rules, gate_spec, setup = prepare_with_rules(limits, fail_over, tokenizer=tokenizer, input=input,
                                                 target=target, audio=audio, model=model,
                                                 sampling_rate=sampling_rate, max_chars=max_chars)
    if out is not None:
        from lengthscan.write.staging import check_writable

        check_writable(Path(out), overwrite=overwrite)
    from lengthscan.engines.ray.sources import check_source, open_for_ray

    check_source(source)
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))
    with ray_session(ray, ray_address):
        src = open_for_ray(ray, source, split)
        check_columns(src, setup.fields)
        output = _Output.start(Path(out) if out is not None else None, setup.fields, src,
                               measured_only=bool(rules), redact=redact)
        try:
            splits, tallies, plans, infos = [], [], [], []
            for split_src in src.splits:
                plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
                tally = SplitTally(setup.fields, setup.limits, ratios,
                                   keep_positions=simulation_positions(plan, seed))
                infos += _measure_split(ray, split_src, plan, setup, tally, ratios, output=output,
                                        num_blocks=num_blocks, batch_rows=batch_rows, with_split=src.has_splits,
                                        progress=progress)
                splits.append(tally.split_audit(split_src.name, plan, seed))
                tallies.append(tally)
                plans.append(plan)
            decisions = None
            if rules:
                from lengthscan.engines.setup import resolve_for

                resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
                dtallies = output.decide(src, plans, setup, resolved, keep_empty_targets)
                decisions = decisions_dict(resolved, basis, action, dtallies, fail_over, gate_spec)
            result = audit_result(src, setup, splits, tallies, seed=seed, command=command, cache_hits=0,
                                  tokenizer=_tokenizer_info(setup.counter, infos), out=out, started=started,
                                  decisions=decisions)
            output.finish(result)
            return result
        except BaseException:
            output.abort()
            raise


def _tokenizer_info(counter, infos):
    """The tokenizer's report entry as the measuring actors saw it (methods of every role merged)."""
    if counter is None:
        return None
    if not infos:
        return counter.info()
    from dataclasses import replace

    methods = {}
    for info in infos:
        methods.update(info.methods)
    return replace(infos[0], methods=dict(sorted(methods.items())))


class _Measurer:
    """A measuring actor: the set-up arrives once, in the constructor (the tokenizer loads here)."""

    def __init__(self, setup, layout, ratios, columns, batch_rows):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor, as local worker processes
        self.setup, self.layout, self.ratios = setup, layout, ratios
        self.columns, self.batch_rows = columns, batch_rows

    def measure(self, block, offset: int, take):
        """(block tally, [(rows, measured)]) of the block's rows (``take``: local positions, or all)."""
        import pyarrow as pa

        from lengthscan.measure.batch import measure_batch
        from lengthscan.stats.tally import SplitTally

        if not isinstance(block, pa.Table):  # a pandas block: back to Arrow
            block = pa.Table.from_pandas(block, preserve_index=False)
        table = block.select(self.columns) if self.columns else block
        if take is not None:
            table = table.take(pa.array(take))
        rows = offset + (np.arange(table.num_rows, dtype=np.int64) if take is None else take.astype(np.int64))
        tally = SplitTally(self.setup.fields, self.setup.limits, self.ratios)
        pieces = []
        for k in range(0, table.num_rows, self.batch_rows):
            part = table.slice(k, self.batch_rows).combine_chunks()
            rb = part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], schema=part.schema)
            batch = Batch(rows[k:k + self.batch_rows], rb)
            measured = measure_batch(batch, self.setup.fields, self.layout, counter=self.setup.counter,
                                     audio=self.setup.settings, decide_limits=self.setup.decide_limits)
            tally.add(batch.rows, measured)
            pieces.append((batch.rows, measured))
        tally.kept = []  # the driver keeps the simulation's lengths from the pieces themselves
        return tally, pieces

    def info(self):
        """The counter's report entry here, with the counting method each role used in this actor."""
        counter = self.setup.counter
        return counter.info() if counter is not None and counter.loaded else None

    def proofs(self) -> dict:
        """Decide-only mode: the proof of each role's bounds, as this actor established it."""
        counter = self.setup.counter
        bounds = counter._bounds if counter is not None else {}
        return {role: (bounds[role].to_dict() if bounds.get(role) else None) for role in self.setup.decide_limits}


def _measure_split(ray, split_src, plan, setup, tally, ratios, *, output, num_blocks, batch_rows,
                   with_split, progress, proofs: dict | None = None) -> list:
    """Stream the split's blocks through the actor pool; merge tallies and write lengths in row order.
    Returns the actors' ``TokenizerInfo``s (the driver never loads the tokenizer itself). ``proofs``
    (a dict) receives the decide-only proofs of the actor that measured the first block, whose
    first batch is the local engine's first batch, so the proof is checked on the same texts."""
    columns = list(dict.fromkeys(f.column for f in setup.fields))
    from lengthscan.engines.ray.sources import read_split

    ds = read_split(ray, split_src, columns, num_blocks)
    layout = split_src.layout()
    # the set-up is small (a TokenCounter pickles by name), passed inline so a restarted actor has it
    actors = start_actors(ray, _Measurer, setup, layout, ratios, columns, batch_rows)
    pending: deque = deque()
    offset = done = submitted = 0

    def collect(ref):
        nonlocal done
        block_tally, pieces = ray.get(ref)
        _merge_tally(tally, block_tally)
        for rows, measured in pieces:
            tally._keep_lengths(rows, {s.name: measured[f.role].values[s] for f in setup.fields for s in f.specs})
            if output.lengths is not None:
                located = layout.locate(rows) if layout.multi_file else None
                output.lengths.write(rows, split=split_src.name if with_split else None,
                                     located=located, measured=measured)
            done += rows.size
        if progress is not None:
            progress(split_src.name, done, plan.size)

    try:
        for bundle in ds.iter_internal_ref_bundles():
            for ref, meta in zip(bundle.block_refs, bundle.metadata):
                n = meta.num_rows if meta.num_rows is not None else ray.get(ray.remote(_count).remote(ref))
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
                    collect(pending.popleft())
        while pending:
            collect(pending.popleft())
        infos = [i for i in ray.get([a.info.remote() for a in actors]) if i is not None]
        if proofs is not None and setup.decide_limits:
            proofs.update(ray.get(actors[0].proofs.remote()))
    finally:
        for a in actors:
            ray.kill(a)
    if offset != split_src.num_rows or done != plan.size:
        raise RuntimeError(f"split {split_src.name}: Ray read {offset} rows (expected {split_src.num_rows}) "
                           f"and measured {done} (expected {plan.size})")
    return infos


#: At most this many actors share one block (each fetches the whole block from the object store).
MAX_PIECES = 8


def block_pieces(n: int, actors: int, batch_rows: int) -> list[tuple[int, int]]:
    """Ranges of a block's ``n`` rows (or sampled rows) for different actors: one block is split
    over up to ``MAX_PIECES`` actors, in pieces of at least ``batch_rows`` rows, since Ray Data reads
    a Parquet file as one block per ~128 MiB whatever ``override_num_blocks`` asks, which would
    leave all but one actor idle on a single-file corpus. Pieces are contiguous and in row order."""
    k = max(1, min(actors, MAX_PIECES, n // max(1, batch_rows)))
    return [(n * i // k, n * (i + 1) // k) for i in range(k)] if n else []


def _count(block) -> int:
    return block.num_rows


def _pool_size(ray) -> int:
    """Measuring actors: the cluster's CPUs less a quarter (at least one) left for the read tasks."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, cpus - max(1, cpus // 4))


def start_actors(ray, cls, *args) -> list:
    """A pool of ``cls`` actors (``_pool_size``), each restarted by Ray when its process dies and its
    unfinished calls retried (every call is a pure function of its block). Each holds a CPU; on a
    cluster of fewer than two CPUs the one actor holds none, else Ray Data's read tasks would wait
    forever for the CPU it holds."""
    cpus = 1 if ray.cluster_resources().get("CPU", 1) >= 2 else 0
    actor_cls = ray.remote(num_cpus=cpus, max_restarts=-1, max_task_retries=-1)(cls)
    return [actor_cls.remote(*args) for _ in range(_pool_size(ray))]


def _merge_tally(into, part) -> None:
    """Merge a block's ``SplitTally`` into the split's: every part merges exactly."""
    from lengthscan.stats.histograms import merge_histograms
    from lengthscan.stats.tally import WORST_ROWS, _merge_all

    for spec, stats in part.parts.items():
        bucket = into.parts.setdefault(spec, [])
        bucket.extend(stats)
        if len(bucket) >= 32:
            bucket[:] = [_merge_all(bucket)]
    into.pairs.extend(part.pairs)
    if len(into.pairs) >= 32:
        into.pairs[:] = [_merge_all(into.pairs)]
    for lt, other in zip(into.limit_tallies, part.limit_tallies):
        lt.over += other.over
        lt.unknown += other.unknown
        lt.rows = np.concatenate([lt.rows, other.rows])
        lt.values = np.concatenate([lt.values, other.values])
        if lt.rows.size > 4 * WORST_ROWS:
            lt._prune()
    for metric, hists in part.ratio_parts.items():
        bucket = into.ratio_parts.setdefault(metric, [])
        bucket.extend(hists)
        if len(bucket) >= 32:
            bucket[:] = [merge_histograms(bucket)]
