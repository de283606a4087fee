"""``clean`` on Ray Data: the local engine's two passes, with the rows worked on by actors.

1. **Measure**: ``engine_ray``'s measuring actors (the audit's own pass) stream every row's lengths,
   in row order, into ``.measured.parquet`` in the staging directory beside ``--out``; their block
   tallies merge exactly into the split statistics, and the rules resolve on the driver
   (``pipeline.resolve_for``), as in ``cleaner.clean``.
2. **Decide and write**: the source is read again by Ray. The driver hands each block, by
   reference, with its rows' measured lengths (read in order from ``.measured.parquet``) to a pool
   of writing actors (``engine_ray_write``), which run the local engine's own second pass
   (``clean_pass.SecondPass``) on it and write its kept rows and rejects as shards named by the
   block's position. Each returns the block's lengths-with-decisions table, its decision and
   after-cleaning tallies, its longest rows and its shard sizes.
3. **Assemble** (driver): the block results arrive in row order; the driver writes
   ``lengths.parquet``, merges the tallies, checks kept + truncated + dropped = rows for every
   block and split and every shard's size on disk, renames the shards to
   ``data-NNNNN-of-MMMMM.arrow`` in row order and writes ``state.json``/``dataset_info.json``
   listing them (as the local writer writes them), removes what killed attempts left behind,
   writes the report and publishes the staging directory with one rename.

Workers write into the staging directory, so ``--out`` must be on a file system every node shares
(one machine, NFS, a cluster file system); the driver's size check refuses to publish otherwise.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from lengthscan import __version__
from lengthscan.engines.ray.audit import (
    _count,
    _measure_split,
    _merge_tally,
    _tokenizer_info,
    block_pieces,
    start_actors,
)
from lengthscan.engines.ray.session import _import_ray, ray_session
from lengthscan.engines.ray.write import FeatureProbe, Job, SplitOutput, Writer, assemble, second_pass
from lengthscan.engines.results import audit_result, clean_extra, decisions_dict, publish_clean
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.scan import BATCH_ROWS

__all__ = ["clean_ray"]


def clean_ray(source, *, out, ray_address: str | None = None, num_blocks: int | None = None,
              format: str = "arrow", tokenizer=None, input: str | None = None, target: str | None = None,
              audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
              split: str | None = None, limits=(), action: str = "drop", keep_empty_targets: bool = False,
              crop_audio: bool = False, fail_over=None, length_column: str | None = "length",
              length_from: str | None = None, embed_audio: bool = False, tokenize: bool = False,
              overwrite: bool = False, cache: bool = True, max_chars: int = DEFAULT_MAX_CHARS,
              batch_rows: int = BATCH_ROWS, redact: bool = False, num_proc: int = 1, decide_only: bool = True,
              progress=None, command: str | None = None):
    """``lengthscan.clean`` on a Ray cluster: same arguments, same ``CleanResult`` and outputs.

    ``ray_address`` and ``num_blocks`` as in ``audit_ray``; ``format`` "parquet" writes Parquet
    shards. The length cache is not used (``cache`` is accepted and ignored) and ``num_proc`` is
    ignored (the actor pools use the cluster's CPUs).
    """
    from lengthscan.engines.clean import _check_tokenize, _decide_only, _length_source, _remove
    from lengthscan.engines.ray.sources import check_source, open_for_ray
    from lengthscan.engines.results import simulate_batches
    from lengthscan.engines.setup import prepare_with_rules, resolve_for
    from lengthscan.measure.batch import check_columns
    from lengthscan.write.parquet import check_format
    from lengthscan.write.staging import OutputError, staging_dir

    ray = _import_ray()
    check_format(format)
    started = time.perf_counter()
    rules, gate_spec, setup = prepare_with_rules(limits, fail_over, tokenizer=tokenizer, input=input,
                                                 target=target, audio=audio, model=model,
                                                 sampling_rate=sampling_rate, max_chars=max_chars)
    final = Path(out).resolve()  # workers may run in another working directory
    if final.exists() and not overwrite:
        raise OutputError(f"{out}: exists; clean never touches an existing directory without --overwrite")
    check_source(source)
    with ray_session(ray, ray_address):
        src = open_for_ray(ray, source, split)
        check_columns(src, setup.fields)
        explicit_length = length_from is not None or length_column != "length"
        length_from = _length_source(setup, length_column, length_from, src)
        if tokenize:
            _check_tokenize(setup, src)
        decide_limits = _decide_only(rules, setup, action, tokenize, explicit_length, decide_only)
        if decide_limits:
            setup = replace(setup, decide_limits=decide_limits)
            if length_from == "input_tokens":
                length_from = None  # exact lengths of every row are what decide-only skips
        tmp = staging_dir(final)
        try:
            proofs: dict = {}
            audit, tallies, plans = _measure_all(ray, src, setup, rules, tmp, num_blocks=num_blocks,
                                                 batch_rows=batch_rows, progress=progress, command=command,
                                                 proofs=proofs)
            resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
            options = dict(keep_empty_targets=keep_empty_targets, length_column=length_column,
                           length_from=length_from, embed_audio=embed_audio, batch_rows=batch_rows,
                           progress=None, tokenize=tokenize, redact=redact)
            job = Job(setup, resolved, tmp, final, options, format)
            dtallies, after, after_tallies, worst = _write_all(ray, src, plans, job, num_blocks=num_blocks,
                                                               progress=progress)
            extra = {"batches": simulate_batches(src, after_tallies, setup, 0, of="cleaned dataset"),
                     "worst_rows": tuple(worst.rows())}
            decisions = decisions_dict(resolved, basis, action, dtallies, fail_over, gate_spec,
                                       **clean_extra(length_column, length_from, embed_audio, decide_limits, proofs))
            return publish_clean(audit, decisions, after, final, tmp, extra, started=started, redact=redact)
        except BaseException:
            _remove(tmp)
            raise


def _measure_all(ray, src, setup, rules, tmp: Path, *, num_blocks, batch_rows, progress, command, proofs):
    """First pass (``cleaner._measure_all`` on Ray): every row's lengths into ``.measured.parquet``."""

    from lengthscan.engines.results import simulation_positions
    from lengthscan.sources.sampling import plan_sample
    from lengthscan.stats.tally import SplitTally
    from lengthscan.write.lengths import LengthsWriter, lengths_schema

    multi = any(s.multi_file for s in src.splits)
    schema = lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi,
                            bounded=tuple(setup.decide_limits))
    sink = SimpleNamespace(lengths=LengthsWriter(tmp / ".measured.parquet", schema))
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))
    splits, tallies, plans, infos = [], [], [], []
    for i, split_src in enumerate(src.splits):
        plan = plan_sample(split_src.num_rows, full=True)
        tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, 0))
        infos += _measure_split(ray, split_src, plan, setup, tally, ratios, output=sink, num_blocks=num_blocks,
                                batch_rows=batch_rows, with_split=src.has_splits, progress=progress,
                                proofs=proofs if i == 0 else None)
        splits.append(tally.split_audit(split_src.name, plan, 0))
        tallies.append(tally)
        plans.append(plan)
    sink.lengths.close()
    audit = audit_result(src, setup, splits, tallies, seed=0, command=command, cache_hits=0,
                         tokenizer=_tokenizer_info(setup.counter, infos))
    return audit, tallies, plans


# -- the second pass: blocks to writing actors, shards assembled on the driver --------------------

def _write_all(ray, src, plans, job: Job, *, num_blocks, progress):
    """Second pass over every split; returns (decision tallies, after audits, after tallies, worst rows)."""
    import pyarrow.parquet as pq

    from lengthscan.policy.decisions import MeasuredCursor
    from lengthscan.sources.sampling import plan_sample
    from lengthscan.write.arrow_dataset import write_dataset_dict_index

    probe = second_pass(job, src)
    probe.writer_factory = FeatureProbe
    cursor = MeasuredCursor(job.tmp / ".measured.parquet")
    lengths = SimpleNamespace(writer=None)

    def write_lengths(table):
        lengths.writer = lengths.writer or pq.ParquetWriter(job.tmp / "lengths.parquet", table.schema)
        lengths.writer.write_table(table)

    dtallies, afters, after_tallies = [], [], []
    try:
        for split_src, plan in zip(src.splits, plans):
            ds_probe, rej_probe = probe._writers(split_src)
            spec = SplitOutput(split_src.layout(), list(split_src.column_names), ds_probe.path, rej_probe.path,
                               ds_probe.features, rej_probe.features)
            tally, after, rows = _write_split(ray, split_src, plan, job, spec, cursor, probe.worst, write_lengths,
                                              num_blocks=num_blocks, progress=progress)
            fingerprint = hashlib.sha256(json.dumps([split_src.fingerprint, [r.to_dict() for r in job.resolved],
                                                     __version__]).encode()).hexdigest()[:16]
            assemble(spec.dataset, spec.dataset_features, rows["dataset"][1], job, fingerprint)
            assemble(spec.rejects, spec.rejects_features, rows["rejects"][1], job, fingerprint[::-1])
            dtallies.append(tally)
            after_tallies.append(after)
            afters.append(after.split_audit(split_src.name, plan_sample(rows["dataset"][0], full=True), 0))
    finally:
        if lengths.writer is not None:
            lengths.writer.close()
    (job.tmp / ".measured.parquet").unlink()
    if src.has_splits:
        names = [s.name for s in src.splits]
        write_dataset_dict_index(job.tmp / "dataset", names)
        write_dataset_dict_index(job.tmp / "rejects", names)
    return dtallies, afters, after_tallies, probe.worst


def _write_split(ray, split_src, plan, job: Job, spec: SplitOutput, cursor, worst, write_lengths, *, num_blocks,
                 progress):
    """Blocks of one split through the writing actors; results merged in row order."""
    from lengthscan.engines.ray.sources import read_split
    from lengthscan.policy.decisions import DecisionTally
    from lengthscan.stats.tally import SplitTally

    ds = read_split(ray, split_src, spec.columns, num_blocks)
    actors = start_actors(ray, Writer, job, spec)
    tally = DecisionTally(split_src.name, plan.rows_total)
    after = SplitTally(job.setup.fields, [])
    rows = {"dataset": [0, []], "rejects": [0, []]}
    pending: deque = deque()
    offset = done = 0

    def collect(item):
        nonlocal done
        index, n, ref = item
        res = ray.get(ref)
        if res.index != index or res.dtally.measured != n or res.dataset[0] + res.rejects[0] != n:
            raise RuntimeError(f"split {split_src.name}, block {index}: {n} rows read, {res.dtally.measured} "
                               f"decided, {res.dataset[0]} kept, {res.rejects[0]} rejected: refusing to publish")
        write_lengths(res.lengths)
        _merge_decisions(tally, res.dtally)
        _merge_tally(after, res.after)
        after.kept.extend(res.after.kept)
        after.seen += res.after.seen
        _merge_worst(worst, res.worst)
        for key in rows:
            count, files = getattr(res, key)
            rows[key][0] += count
            rows[key][1] += files
        done += n
        if progress is not None:
            progress(f"{split_src.name} (writing)", done, plan.size)

    try:
        index = 0
        for bundle in ds.iter_internal_ref_bundles():
            for ref, meta in zip(bundle.block_refs, bundle.metadata):
                n = meta.num_rows if meta.num_rows is not None else ray.get(ray.remote(_count).remote(ref))
                for lo, hi in block_pieces(n, len(actors), job.options["batch_rows"]):
                    call = actors[index % len(actors)].write.remote(ref, lo, offset + lo, cursor.take(hi - lo), index)
                    pending.append((index, hi - lo, call))
                    index += 1
                offset += n
                while len(pending) > 2 * len(actors):
                    collect(pending.popleft())
        while pending:
            collect(pending.popleft())
    finally:
        for a in actors:
            ray.kill(a)
    counts = tally.counts
    if not (offset == done == plan.size == tally.measured and rows["dataset"][0] == counts["keep"] + counts["truncate"]
            and rows["rejects"][0] == counts["drop"]):
        raise RuntimeError(f"split {split_src.name}: {offset} rows read, {rows['dataset'][0]} kept, "
                           f"{rows['rejects'][0]} rejected, {plan.size} in the source: refusing to publish")
    return tally, after, rows


def _merge_decisions(into, part) -> None:
    into.measured += part.measured
    for name, n in part.counts.items():
        into.counts[name] += n
    for key, n in part.by_reason.items():
        into.by_reason[key] = into.by_reason.get(key, 0) + n


def _merge_worst(into, best: dict) -> None:
    """A block's longest rows into the split's, ordered as ``WorstRows.add`` orders them."""
    from lengthscan.write.worst_rows import WORST_ROWS

    for name, items in best.items():
        into.best[name] = sorted(into.best[name] + items, key=lambda t: (-t[0], -t[1]))[:WORST_ROWS]
