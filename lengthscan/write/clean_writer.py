"""clean's local writer: each split's ``dataset/`` and ``rejects/`` folders and ``lengths.parquet``,
fed cleaned batches (``clean_rows.clean_batch``) in row order, checked before anything is published.
Each batch comes with the policy's decisions of its rows (``policy.decisions.decide_batch``, taken
by the engine), which the writer applies.

It is a sink of the measuring loop for the single pass (``open_split``/``write``/``close_split``
take each measured batch), and ``second_pass`` drives it over a measured-lengths file for the two
passes a percentile or z-score rule needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lengthscan.sources.sampling import SamplePlan, plan_sample
from lengthscan.stats.records import SplitAudit
from lengthscan.write.clean_rows import CleanSpec, CleanTally, clean_batch, output_features, output_fingerprint

if TYPE_CHECKING:
    from lengthscan.policy.decisions import BatchDecision
    from lengthscan.write.arrow_dataset import DatasetWriter
    from lengthscan.write.parquet import ParquetDatasetWriter


@dataclass
class SplitWriter:
    """One split's output folders, written batch by batch; ``close`` checks that every row of the
    split was kept, truncated or dropped, exactly once."""

    name: str
    plan: SamplePlan
    dataset: DatasetWriter | ParquetDatasetWriter
    rejects: DatasetWriter | ParquetDatasetWriter
    tally: CleanTally
    done: int = 0

    def write(self, cleaned) -> None:
        self.tally.add(cleaned)
        self.dataset.write(cleaned.kept)
        self.rejects.write(cleaned.rejects)
        self.done += cleaned.rows.size

    def close(self, fingerprint: str) -> None:
        counts, decided = self.tally.decisions.counts, self.tally.decisions.measured
        if not (decided == self.plan.size == self.done and self.dataset.rows == counts["keep"] + counts["truncate"]
                and self.rejects.rows == counts["drop"]):
            raise RuntimeError(f"split {self.name}: {self.done} rows read, {self.dataset.rows} kept, "
                               f"{self.rejects.rows} rejected, {self.plan.size} in the source: refusing to publish")
        self.dataset.close(fingerprint)
        self.rejects.close(fingerprint[::-1])


@dataclass(frozen=True)
class CleanOutcome:
    """What writing gave, per split in source order."""

    tallies: tuple[CleanTally, ...]
    after: tuple[SplitAudit, ...]  # the written rows (lengths after cleaning)

    @property
    def decisions(self) -> list:
        return [t.decisions for t in self.tallies]

    @property
    def after_tallies(self) -> list:
        return [t.after for t in self.tallies]

    def worst_rows(self) -> tuple:
        """The longest source rows with their decisions, over every split."""
        if not self.tallies:
            return ()
        worst = self.tallies[0].worst
        for t in self.tallies[1:]:
            worst = worst.merge(t.worst)
        return tuple(worst.rows())


def after_audit(name: str, tally: CleanTally, written: int) -> SplitAudit:
    """The written split's audit: every written row, measured after cleaning."""
    return tally.after.split_audit(name, plan_sample(written, full=True), 0)


class CleanWriter:
    """Writes a clean locally: a split at a time, batch by batch, then the ``dataset_dict.json``
    indexes. ``progress`` is called as ``progress("<split> (writing)", done, total)``."""

    def __init__(self, spec: CleanSpec, src, *, progress=None):
        self.spec, self.src, self.progress = spec, src, progress
        self.lengths = None
        self.tallies: list[CleanTally] = []
        self.afters: list[SplitAudit] = []
        self.split: SplitWriter | None = None
        self.split_src = None

    # the measuring loop's sink protocol (the single pass)
    def open_split(self, split_src, plan: SamplePlan) -> None:
        from lengthscan.write.parquet import dataset_writer

        spec = self.spec
        dataset_f, rejects_f = output_features(spec, split_src.parts[0].features(), multi_file=split_src.multi_file,
                                               source_name=self.src.spec)
        writer = dataset_writer(spec.format)
        sub = split_src.name if self.src.has_splits else ""
        self.split_src = split_src
        self.split = SplitWriter(split_src.name, plan,
                                 writer(spec.staging / "dataset" / sub, dataset_f,
                                        embed_local_files="strict" if spec.embed_audio else False),
                                 writer(spec.staging / "rejects" / sub, rejects_f, embed_local_files=spec.embed_audio),
                                 CleanTally.start(split_src.name, plan.rows_total, spec))

    def write(self, split_src, batch, measured: pa.Table, decided: BatchDecision, ids: dict | None = None) -> None:
        """Clean and write one batch; ``measured`` holds its rows of the measured lengths, ``decided``
        the policy's decisions of them."""
        import pyarrow.parquet as pq

        cleaned = clean_batch(self.spec, split_src, batch.rows, pa.Table.from_batches([batch.table]), measured,
                              decided, ids, raw=batch.raw)
        self.split.write(cleaned)
        self.lengths = self.lengths or pq.ParquetWriter(self.spec.staging / "lengths.parquet", cleaned.lengths.schema)
        self.lengths.write_table(cleaned.lengths)
        if self.progress is not None:
            self.progress(f"{split_src.name} (writing)", self.split.done, self.split.plan.size)

    def close_split(self, split_src) -> None:
        self.split.close(output_fingerprint(split_src.fingerprint, self.spec.resolved))
        self.tallies.append(self.split.tally)
        self.afters.append(after_audit(split_src.name, self.split.tally, self.split.dataset.rows))
        self.split = None

    def finish(self) -> CleanOutcome:
        """Close ``lengths.parquet`` and index the split folders once every split is closed."""
        from lengthscan.write.arrow_dataset import write_dataset_dict_index

        if self.lengths is not None:
            self.lengths.close()
        if self.src.has_splits:
            names = [s.name for s in self.src.splits]
            write_dataset_dict_index(self.spec.staging / "dataset", names)
            write_dataset_dict_index(self.spec.staging / "rejects", names)
        return CleanOutcome(tuple(self.tallies), tuple(self.afters))

    def abort(self) -> None:
        if self.lengths is not None:
            self.lengths.close()


def second_pass(writer: CleanWriter, plans, measured_path,
                decide: Callable[[pa.Table], BatchDecision]) -> CleanOutcome:
    """The source read again beside the measured-lengths file ``measured_path`` (in row order), each
    batch decided by ``decide`` (the policy's, given by the engine) before it is written."""
    from lengthscan.policy.decisions import MeasuredCursor
    from lengthscan.sources.scan import iter_batches

    cursor = MeasuredCursor(measured_path)
    for split_src, plan in zip(writer.src.splits, plans):
        writer.open_split(split_src, plan)
        raw = tuple(c for f in writer.spec.fields for c in f.kind.raw_columns(f))
        for batch in iter_batches(split_src, split_src.column_names, batch_rows=writer.spec.batch_rows, raw=raw):
            measured = cursor.take(batch.rows.size)
            if not np.array_equal(measured.column("row").to_numpy(), batch.rows):
                raise RuntimeError(f"split {split_src.name}: second pass out of step with the measured rows")
            writer.write(split_src, batch, measured, decide(measured))
        writer.close_split(split_src)
    measured_path.unlink()
    return writer.finish()
