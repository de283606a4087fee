"""The writing side of ``clean`` on Ray: what each writing actor gets, does and returns, and the
assembly of its block shards into a split folder on the driver (see ``engine_ray_clean``).

An actor holds a ``clean_pass.SecondPass``, the local engine's own second pass, and runs its
``_batch`` over a whole block: ``policy.decide``, verified truncation, cropping, the length and
token columns, the rejects' reasons. The block's kept rows and rejects go through the local
engine's writer (``writer.DatasetWriter``, or ``parquet_out.ParquetDatasetWriter``) into a scratch
folder of its own, then are renamed to ``block-NNNNNN-MMM.<format>``: a name fixed by the block's
position, so a task Ray retries after its worker died writes the same name again, atomically,
never a second copy.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lengthscan.sources.scan import Batch


@dataclass(frozen=True)
class Job:
    """What every writing actor gets once, in its constructor (small: the counter pickles by name)."""

    setup: object
    resolved: tuple
    tmp: Path
    final: Path
    options: dict        # SecondPass's keyword arguments
    format: str


@dataclass(frozen=True)
class SplitOutput:
    """One split's output folders and features (from the local second pass's own ``_writers``, given
    a writer class that records them and writes nothing), its layout and columns."""

    layout: object
    columns: list
    dataset: Path
    rejects: Path
    dataset_features: dict
    rejects_features: dict


class FeatureProbe:
    """Stands in for the writer class in ``SecondPass._writers``: records folder and features."""

    def __init__(self, path, features, *, embed_local_files: bool = False):
        self.path = Path(path)
        self.features = features.to_dict() if hasattr(features, "to_dict") else features


def second_pass(job: Job, src=None):
    """The local engine's second pass with the job's options (``src`` only where ``_writers`` runs)."""
    from lengthscan.write.clean_rows import SecondPass

    return SecondPass(src, job.setup, job.resolved, job.tmp, job.final, **job.options)


@dataclass
class BlockResult:
    """What a writing actor returns for one block."""

    index: int
    lengths: object      # pa.Table: the block's rows of lengths.parquet, with their decisions
    dtally: object       # decisions.DecisionTally
    after: object        # tally.SplitTally of the kept rows after cleaning (with their lengths)
    worst: dict          # clean_pass.WorstRows.best of the block
    dataset: tuple       # (rows, [(shard file, bytes)])
    rejects: tuple


class Writer:
    """A writing actor: the local engine's ``SecondPass``, built once, run on whole blocks."""

    def __init__(self, job: Job, spec: SplitOutput):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor
        self.job, self.spec = job, spec
        self.second = second_pass(job)

    def write(self, block, start: int, offset: int, measured, index: int) -> BlockResult:
        """The block's rows from ``start`` on (as many as ``measured`` holds), whose first row is the
        split's row ``offset``; its shards are named by ``index``."""
        import pyarrow as pa

        from lengthscan.policy.decisions import DecisionTally
        from lengthscan.stats.tally import SplitTally
        from lengthscan.write.worst_rows import WorstRows

        if not isinstance(block, pa.Table):  # a pandas block: back to Arrow
            block = pa.Table.from_pandas(block, preserve_index=False)
        table = block.select(self.spec.columns).slice(start, measured.num_rows)
        n, step = table.num_rows, self.job.options["batch_rows"]
        rows = offset + np.arange(n, dtype=np.int64)
        if not np.array_equal(measured.column("row").to_numpy(), rows):
            raise RuntimeError(f"block {index}: its measured lengths are not its rows")
        fields = self.job.setup.fields
        self.second.worst = WorstRows(fields, redact=self.job.options["redact"])
        dtally, after = DecisionTally(self.spec.layout.name, n), SplitTally(fields, [])
        ds_w = BlockShard(self.spec.dataset, index, self.spec.dataset_features, self.job)
        rej_w = BlockShard(self.spec.rejects, index, self.spec.rejects_features, self.job)
        pieces = []
        try:
            for k in range(0, n, step):
                part = table.slice(k, step).combine_chunks()
                rb = part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], schema=part.schema)
                lengths, kept, rejects = self.second._batch(self.spec.layout, Batch(rows[k:k + step], rb),
                                                            measured.slice(k, step), dtally, after)
                pieces.append(lengths)
                ds_w.write(kept)
                rej_w.write(rejects)
            return BlockResult(index, pa.concat_tables(pieces), dtally, after, self.second.worst.best,
                                ds_w.finish(), rej_w.finish())
        finally:
            ds_w.discard()
            rej_w.discard()


class BlockShard:
    """A block's rows for one folder: the local writer into a scratch folder of its own, then its data
    file renamed to ``block-NNNNNN-MMM.<format>`` (atomic, the same name on every attempt)."""

    def __init__(self, folder: Path, index: int, features, job: Job):
        from lengthscan.write.parquet import dataset_writer

        self.folder, self.index, self.format = Path(folder), index, job.format
        self.scratch = self.folder / f".block-{index:06d}-{uuid.uuid4().hex[:8]}"
        self.writer = dataset_writer(job.format)(self.scratch, features,
                                                 embed_local_files=job.options["embed_audio"])

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


def assemble(folder: Path, features, files: list, job: Job, fingerprint: str) -> None:
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
    writer = dataset_writer(job.format)(meta, features, embed_local_files=job.options["embed_audio"])
    writer.close(fingerprint)  # no rows: the metadata and one schema-only file
    sources = [folder / name for name, _ in files] or sorted(p for p in meta.iterdir() if p.name.startswith("data-"))
    names = [shard_name(k, len(sources), job.format) for k in range(len(sources))]
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
