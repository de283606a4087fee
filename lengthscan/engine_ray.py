"""``audit`` on Ray Data: the same measure step, tallies, sample and outputs as the local engine.

Data flow, per split: Ray Data's readers (``read_parquet``, ``read_json``; the Arrow files of a
``save_to_disk`` directory through ``map_batches``) stream blocks in source order
(``preserve_order``); the driver sees only block references and their row counts, so it knows each
block's first row position without a global shuffle. Each block goes, by reference, to one of a
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

import datetime as _dt
import os
import time
from collections import deque
from pathlib import Path

import numpy as np

from . import __version__
from .sampling import DEFAULT_SEED, plan_sample
from .scan import BATCH_ROWS, Batch
from .sources import SourceError
from .tokens import DEFAULT_MAX_CHARS

INSTALL = 'pip install "lengthscan[ray]"'

__all__ = ["EngineError", "audit_ray"]


class EngineError(SourceError):
    """The Ray engine cannot run this (ray missing, a source it cannot read distributed): exit 2."""


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
    from .measure import check_columns
    from .outputs import _Output
    from .pipeline import simulate_batches, simulation_positions
    from .prepare import prepare_with_rules
    from .records import AuditResult
    from .tally import SplitTally

    ray = _import_ray()
    started = time.perf_counter()
    rules, gate_spec, setup = prepare_with_rules(limits, fail_over, tokenizer=tokenizer, input=input,
                                                 target=target, audio=audio, model=model,
                                                 sampling_rate=sampling_rate, max_chars=max_chars)
    if out is not None:
        from .writer import check_writable

        check_writable(Path(out), overwrite=overwrite)
    src = _open_local(source, split)
    check_columns(src, setup.fields)
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=ray_address, log_to_driver=False, include_dashboard=False)
    ctx = ray.data.DataContext.get_current()
    saved_order, saved_progress = ctx.execution_options.preserve_order, ctx.enable_progress_bars
    ctx.execution_options.preserve_order = True  # blocks arrive in source order: row ids stay exact
    ctx.enable_progress_bars = False
    output = _Output.start(Path(out) if out is not None else None, setup.fields, src,
                           measured_only=bool(rules), redact=redact)
    try:
        splits, tallies, plans, infos = [], [], [], []
        for split_src in src.splits:
            plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
            tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, seed))
            infos += _measure_split(ray, split_src, plan, setup, tally, ratios, output=output, num_blocks=num_blocks,
                           batch_rows=batch_rows, with_split=src.has_splits, progress=progress)
            splits.append(tally.split_audit(split_src.name, plan, seed))
            tallies.append(tally)
            plans.append(plan)
        decisions = None
        if rules:
            from .decisions import gate
            from .pipeline import resolve_for

            resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
            dtallies = output.decide(src, plans, setup, resolved, keep_empty_targets)
            decisions = {"rules": [r.to_dict() for r in resolved], "basis": basis, "action": action,
                         "splits": [t.to_dict() for t in dtallies], "fail_over": fail_over,
                         "gate": gate(gate_spec, dtallies)}
        result = AuditResult(
            source=src.spec, source_fingerprint=src.fingerprint, splits=tuple(splits),
            tokenizer=_tokenizer_info(setup.counter, infos),
            fields=setup.specs, seed=seed, command=command, version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=0,
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
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved_order, saved_progress
        if started_ray:
            ray.shutdown()


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


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise EngineError(f"the Ray engine needs Ray Data, which is not installed: {INSTALL}") from None
    return ray


# -- the source: opened locally for its layout, read by Ray ---------------------------------------

def _open_local(source, split):
    """The source's layout (files, row counts, fingerprint) as the local engine sees it.

    Parquet: footers only; ``save_to_disk``: memory-mapped, not read; JSON Lines: one streaming
    count on the driver (the sample needs the row count before any row is read).
    """
    from .sources import open_source

    if type(source).__module__.startswith("datasets"):
        raise EngineError("the Ray engine reads files, not an in-memory Dataset: save it with "
                          "save_to_disk or to Parquet and give the path")
    spec = os.fspath(source)
    if "://" in spec:
        raise EngineError(f"{spec}: object-storage paths are not supported by the Ray engine yet")
    if not any(ch in spec for ch in "*?[") and not Path(spec).expanduser().exists():
        raise EngineError(f"{spec}: not a local file, glob or directory; a hub dataset id cannot be read "
                          "in a distributed way: download it (save_to_disk or Parquet) and give the path")
    src = open_source(source, split=split)
    if src.kind == "audiofolder":
        raise EngineError(f"{spec}: audio folders are not supported by the Ray engine yet; "
                          "write a manifest (JSONL or Parquet) with the paths")
    return src


def _read_split(ray, split_src, columns: list[str], num_blocks: int | None):
    """A Ray Dataset of the split's ``columns``, its rows in source order."""
    parts = split_src.parts
    kw = {"override_num_blocks": num_blocks} if num_blocks else {}
    if all(p.parquet for p in parts):
        return ray.data.read_parquet([p.path for p in parts], columns=columns, **kw)
    if all(p.jsonl_schema is not None for p in parts):
        from .filesources import json_read_options

        # pyarrow's JSON reader, as the local engine (``lines=True`` would read through pandas)
        return ray.data.read_json([p.path for p in parts], file_extensions=None, read_options=json_read_options(),
                                  **kw).select_columns(columns)
    if len(parts) == 1 and parts[0].path is None:
        from .scan import _plain_arrow_files

        files = _plain_arrow_files(parts[0].dataset)
        if files is not None:
            items = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
            return items.map_batches(_arrow_file_batches, batch_size=1, batch_format="pyarrow",
                                     fn_kwargs={"columns": columns, "batch_rows": BATCH_ROWS * 16})
    raise EngineError(f"split {split_src.name}: the Ray engine reads Parquet, JSON Lines and save_to_disk "
                      "directories without transforms; convert this source to Parquet")


def _arrow_file_batches(items, *, columns: list[str], batch_rows: int):
    """Arrow stream files of a ``save_to_disk`` dataset, read through a file handle (no memory map)."""
    import pyarrow as pa

    for path in items.column("path").to_pylist():
        with pa.OSFile(path, "rb") as fh:
            for rb in pa.ipc.open_stream(fh):
                rb = rb.select(columns)
                for k in range(0, rb.num_rows, batch_rows):
                    yield pa.Table.from_batches([rb.slice(k, batch_rows)])


# -- measuring: actors over blocks, merged on the driver ------------------------------------------

class _Measurer:
    """A measuring actor: the set-up arrives once, in the constructor (the tokenizer loads here)."""

    def __init__(self, setup, layout, ratios, columns, batch_rows):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor, as local worker processes
        self.setup, self.layout, self.ratios = setup, layout, ratios
        self.columns, self.batch_rows = columns, batch_rows

    def measure(self, block, offset: int, take):
        """(block tally, [(rows, measured)]) of the block's rows (``take``: local positions, or all)."""
        import pyarrow as pa

        from .measure import measure_batch
        from .tally import SplitTally

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


def _measure_split(ray, split_src, plan, setup, tally, ratios, *, output, num_blocks, batch_rows,
                   with_split, progress) -> list:
    """Stream the split's blocks through the actor pool; merge tallies and write lengths in row order.
    Returns the actors' ``TokenizerInfo``s (the driver never loads the tokenizer itself)."""
    columns = list(dict.fromkeys(f.column for f in setup.fields))
    ds = _read_split(ray, split_src, columns, num_blocks)
    actor_cls = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=-1)(_Measurer)
    layout = split_src.layout()
    # the set-up is small (a TokenCounter pickles by name), passed inline so a restarted actor has it
    actors = [actor_cls.remote(setup, layout, ratios, columns, batch_rows) for _ in range(_pool_size(ray))]
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
                take = None
                if plan.indices is not None:
                    lo, hi = np.searchsorted(plan.indices, [offset, offset + n])
                    take = plan.indices[lo:hi] - offset
                if n and (take is None or take.size):
                    pending.append(actors[submitted % len(actors)].measure.remote(ref, offset, take))
                    submitted += 1
                offset += n
                while len(pending) > 2 * len(actors):
                    collect(pending.popleft())
        while pending:
            collect(pending.popleft())
        infos = [i for i in ray.get([a.info.remote() for a in actors]) if i is not None]
    finally:
        for a in actors:
            ray.kill(a)
    if offset != split_src.num_rows or done != plan.size:
        raise RuntimeError(f"split {split_src.name}: Ray read {offset} rows (expected {split_src.num_rows}) "
                           f"and measured {done} (expected {plan.size})")
    return infos


def _count(block) -> int:
    return block.num_rows


def _pool_size(ray) -> int:
    """Measuring actors: the cluster's CPUs less a quarter (at least one) left for the read tasks."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, cpus - max(1, cpus // 4))


def _merge_tally(into, part) -> None:
    """Merge a block's ``SplitTally`` into the split's: every part merges exactly."""
    from .stats import merge_histograms
    from .tally import WORST_ROWS, _merge_all

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
        lt.rows = np.concatenate([lt.rows, other.rows])
        lt.values = np.concatenate([lt.values, other.values])
        if lt.rows.size > 4 * WORST_ROWS:
            lt._prune()
    for metric, hists in part.ratio_parts.items():
        bucket = into.ratio_parts.setdefault(metric, [])
        bucket.extend(hists)
        if len(bucket) >= 32:
            bucket[:] = [merge_histograms(bucket)]
