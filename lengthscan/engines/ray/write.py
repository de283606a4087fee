"""clean's second pass on Ray: the source's read tasks read again, cleaned and written by the
session's worker actors, assembled on the driver.

The driver hands each read task with its rows' measured lengths (read in order from
``.measured.parquet``) to a worker actor, which reads the task's rows with the local engine's
reader, runs the local engine's own per-batch unit (``write.clean_rows.clean_batch``) over them
and writes their kept rows and rejects through
the local writer (``write.arrow_dataset.DatasetWriter``, or ``write.parquet.ParquetDatasetWriter``)
into a scratch folder of its own, renamed to ``block-NNNNNN-MMM.<format>``: a name fixed by the
block's position, so a task Ray retries after its worker died writes the same name again,
atomically, never a second copy. It returns the block's lengths-with-decisions table, its
``CleanTally`` and its shard sizes. The driver writes ``lengths.parquet``, merges the tallies,
checks kept + truncated + dropped = rows for every block and split and every shard's size on
disk, renames the shards to ``data-NNNNN-of-MMMMM`` in row order and writes ``state.json``/
``dataset_info.json`` listing them, as the local writer does.

Workers write into the staging directory, so ``--out`` must be on a file system every node shares
(one machine, NFS, a cluster file system); the driver's size check refuses to publish otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lengthscan.policy.decisions import decide_rows
from lengthscan.sources.source import SplitLayout
from lengthscan.write.clean_rows import CleanSpec, CleanTally, clean_batch, output_features, output_fingerprint

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class SplitOutput:
    """One split's output folders and features, its layout and columns."""

    layout: SplitLayout
    columns: list
    dataset: Path
    rejects: Path
    dataset_features: dict
    rejects_features: dict


@dataclass
class BlockResult:
    """What a writing actor returns for one block."""

    index: int
    rows: int
    lengths: pa.Table    # the block's rows of lengths.parquet, with their decisions
    tally: CleanTally
    dataset: tuple       # (rows, [(shard file, bytes)])
    rejects: tuple


def write_task(spec: CleanSpec, split: SplitOutput, batches, offset: int, measured, index: int) -> BlockResult:
    """One read task's rows (``batches``, from the split's row ``offset`` on, as many as ``measured``
    holds) through ``clean_batch``, written as the shards of block ``index`` (run by a worker actor)."""
    import pyarrow as pa

    n, layout = measured.num_rows, split.layout
    tally = CleanTally.start(layout.name, n, spec)
    ds_w = BlockShard(split.dataset, index, split.dataset_features, spec)
    rej_w = BlockShard(split.rejects, index, split.rejects_features, spec)
    pieces, k = [], 0
    try:
        for batch in batches:
            rows = batch.rows
            lengths = measured.slice(k, rows.size)
            if rows.size == 0 or rows[0] != offset + k or \
                    not np.array_equal(lengths.column("row").to_numpy(), rows):
                raise RuntimeError(f"block {index}: its measured lengths are not its rows")
            cleaned = clean_batch(spec, layout, rows, pa.Table.from_batches([batch.table]), lengths,
                                  decide_rows(spec, lengths))
            tally.add(cleaned)
            pieces.append(cleaned.lengths)
            ds_w.write(cleaned.kept)
            rej_w.write(cleaned.rejects)
            k += rows.size
        if k != n:
            raise RuntimeError(f"block {index}: {k} rows read, {n} measured")
        return BlockResult(index, n, pa.concat_tables(pieces), tally, ds_w.finish(), rej_w.finish())
    finally:
        ds_w.discard()
        rej_w.discard()


class BlockShard:
    """A block's rows for one folder: the local writer into a scratch folder of its own, then its data
    file renamed to ``block-NNNNNN-MMM.<format>`` (atomic, the same name on every attempt)."""

    def __init__(self, folder: Path, index: int, features, spec: CleanSpec):
        from lengthscan.write.parquet import dataset_writer

        self.folder, self.index, self.format = Path(folder), index, spec.format
        self.scratch = self.folder / f".block-{index:06d}-{uuid.uuid4().hex[:8]}"
        self.writer = dataset_writer(spec.format)(self.scratch, features, embed_local_files=spec.embed_audio)

    def write(self, table) -> None:
        self.writer.write(table)

    def finish(self) -> tuple[int, list]:
        self.writer.close("")
        files = []
        if self.writer.rows:
            for j, path in enumerate(sorted(p for p in self.scratch.iterdir() if p.name.startswith("data-"))):
                name = f"block-{self.index:06d}-{j:03d}.{self.format}"
                os.replace(path, self.folder / name)
                files.append((name, os.path.getsize(self.folder / name)))
        return self.writer.rows, files

    def discard(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def write_pass(engine, src, plans, spec: CleanSpec, measured_path: Path, *, progress=None):
    """Every split through the writing actors; returns the ``CleanOutcome`` the local writer returns."""
    import pyarrow.parquet as pq

    from lengthscan.policy.decisions import MeasuredCursor
    from lengthscan.write.arrow_dataset import write_dataset_dict_index
    from lengthscan.write.clean_writer import CleanOutcome, after_audit

    cursor = MeasuredCursor(measured_path)
    lengths = []  # the one ParquetWriter of lengths.parquet, once the first table gives its schema

    def write_lengths(table):
        if not lengths:
            lengths.append(pq.ParquetWriter(spec.staging / "lengths.parquet", table.schema))
        lengths[0].write_table(table)

    tallies, afters = [], []
    try:
        for split_src, plan in zip(src.splits, plans):
            split = split_output(spec, src, split_src)
            tally, counts = _write_split(engine, split_src, plan, spec, split, cursor, write_lengths,
                                         progress=progress)
            fingerprint = output_fingerprint(split_src.fingerprint, spec.resolved)
            assemble(split.dataset, split.dataset_features, counts["dataset"][1], spec, fingerprint)
            assemble(split.rejects, split.rejects_features, counts["rejects"][1], spec, fingerprint[::-1])
            tallies.append(tally)
            afters.append(after_audit(split_src.name, tally, counts["dataset"][0]))
    finally:
        if lengths:
            lengths[0].close()
    measured_path.unlink()
    if src.has_splits:
        names = [s.name for s in src.splits]
        write_dataset_dict_index(spec.staging / "dataset", names)
        write_dataset_dict_index(spec.staging / "rejects", names)
    return CleanOutcome(tuple(tallies), tuple(afters))


def split_output(spec: CleanSpec, src, split_src) -> SplitOutput:
    """The split's folders in the staging directory and their features (as the local writer's)."""
    dataset_f, rejects_f = output_features(spec, split_src.parts[0].features(), multi_file=split_src.multi_file,
                                           source_name=src.spec)
    sub = split_src.name if src.has_splits else ""
    return SplitOutput(split_src.layout(), list(split_src.column_names), spec.staging / "dataset" / sub,
                       spec.staging / "rejects" / sub, plain(dataset_f), plain(rejects_f))


def plain(features) -> dict:
    """Features as plain JSON dicts (a ``datasets.Features`` gives its own ``to_dict()``)."""
    return features.to_dict() if hasattr(features, "to_dict") else features


def _write_split(engine, split_src, plan, spec: CleanSpec, split: SplitOutput, cursor, write_lengths, *, progress):
    """The split's read tasks through the worker actors; results merged in row order."""
    from lengthscan.engines.ray.sources import check_unchanged

    tally = CleanTally.start(split_src.name, plan.rows_total, spec)
    counts = {"dataset": [0, []], "rejects": [0, []]}
    tasks = engine.tasks(split_src, spec.batch_rows)
    held_spec, held_split = engine.hold(spec), engine.hold(split_src)

    def calls():
        for index, task in enumerate(tasks):
            offset = split_src.parts[task.part].start + task.lo
            yield "write", (held_spec, held_split, split, task, offset, cursor.take(task.rows), index)

    done = 0
    try:
        for index, (task, (res, spent)) in enumerate(zip(tasks, engine.pool().ordered(calls()))):
            engine.add_traffic(split_src, spent)
            n, decided = task.rows, res.tally.decisions.measured
            if res.index != index or decided != n or res.dataset[0] + res.rejects[0] != n:
                raise RuntimeError(f"split {split_src.name}, block {index}: {n} rows read, {decided} decided, "
                                   f"{res.dataset[0]} kept, {res.rejects[0]} rejected: refusing to publish")
            write_lengths(res.lengths)
            tally.merge(res.tally)
            for key in counts:
                rows, files = getattr(res, key)
                counts[key][0] += rows
                counts[key][1] += files
            done += n
            if progress is not None:
                progress(f"{split_src.name} (writing)", done, plan.size)
    except Exception:
        check_unchanged(split_src)  # a file rewritten while it was read: said so
        raise
    check_unchanged(split_src)
    decisions = tally.decisions.counts
    offset = sum(t.rows for t in tasks)
    if not (offset == done == plan.size == tally.decisions.measured
            and counts["dataset"][0] == decisions["keep"] + decisions["truncate"]
            and counts["rejects"][0] == decisions["drop"]):
        raise RuntimeError(f"split {split_src.name}: {offset} rows read, {counts['dataset'][0]} kept, "
                           f"{counts['rejects'][0]} rejected, {plan.size} in the source: refusing to publish")
    return tally, counts


def assemble(folder: Path, features, files: list, spec: CleanSpec, fingerprint: str) -> None:
    """The block shards ``files`` ((name, bytes), in row order) of one split folder, renamed
    ``data-NNNNN-of-MMMMM``, with the metadata the local writer writes (``state.json`` listing them,
    ``dataset_info.json``)."""
    from lengthscan.write.parquet import dataset_writer, shard_name

    for name, size in files:
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            raise RuntimeError(f"{path}: a worker wrote {size} bytes there, the driver sees "
                               f"{path.stat().st_size if path.exists() else 'no file'}; --out must be on a "
                               "file system every node of the cluster shares: refusing to publish")
    meta = folder / f".meta-{uuid.uuid4().hex[:8]}"
    writer = dataset_writer(spec.format)(meta, features, embed_local_files=spec.embed_audio)
    writer.close(fingerprint)  # no rows: the metadata and one schema-only file
    sources = [folder / name for name, _ in files] or sorted(p for p in meta.iterdir() if p.name.startswith("data-"))
    names = [shard_name(k, len(sources), spec.format) for k in range(len(sources))]
    for path, name in zip(sources, names):
        os.replace(path, folder / name)
    for path in meta.iterdir():
        if path.name == "state.json":
            state = json.loads(path.read_text())
            state["_data_files"] = [{"filename": name} for name in names]
            (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        elif not path.name.startswith("data-"):
            os.replace(path, folder / path.name)
    shutil.rmtree(meta)
    for stale in folder.iterdir():  # what killed attempts left: scratch folders, nothing else
        if stale.name.startswith((".block-", "block-")):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
