"""clean's writer: decide, truncate, crop and write each batch of rows.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from lengthscan import __version__
from lengthscan.measure.batch import ColumnError
from lengthscan.policy.decisions import (
    DecisionTally,
    MeasuredCursor,
    base_and_flags,
    decision_columns,
    special_lengths,
)
from lengthscan.policy.rules import DROP, TRUNCATE, decide
from lengthscan.sources.sampling import plan_sample
from lengthscan.sources.scan import iter_batches
from lengthscan.stats.tally import SplitTally
from lengthscan.write.worst_rows import WorstRows


def _id_lists(ids: list) -> tuple:
    """``list<int32>`` ids and ``list<int8>`` all-ones mask columns, built from flat numpy arrays
    (no Python list per token: a corpus holds tens of millions)."""
    sizes = np.fromiter(map(len, ids), np.int64, len(ids))
    total = int(sizes.sum())
    if total >= 2**31:  # past 32-bit offsets: let pyarrow chunk it
        return (pa.chunked_array([pa.array(ids, pa.list_(pa.int32()))]),
                pa.chunked_array([pa.array([[1] * len(a) for a in ids], pa.list_(pa.int8()))]))
    offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, total)
    return (pa.ListArray.from_arrays(offsets, pa.array(flat)),
            pa.ListArray.from_arrays(offsets, pa.array(np.ones(total, np.int8))))


class SecondPass:
    """Reads the source again beside the measured lengths; decides, truncates and writes."""

    def __init__(self, src, setup, resolved, tmp: Path, final: Path, *, keep_empty_targets, length_column,
                 length_from, embed_audio, batch_rows, progress, tokenize=False, redact=False):
        self.src, self.setup, self.resolved, self.tmp, self.final = src, setup, resolved, tmp, final.resolve()
        self.keep_empty_targets = keep_empty_targets
        self.length_column, self.length_from = length_column, length_from
        self.embed_audio, self.batch_rows, self.progress = embed_audio, batch_rows, progress
        self.tokenize = tokenize
        self.special = special_lengths(setup.counter, setup.fields)
        self.worst = WorstRows(setup.fields, redact=redact)
        self.truncated_specs = [f.primary for f in setup.fields if f.kind == "text"]
        self._lengths, self._tallies, self._afters, self._after_tallies = None, [], [], []

    def run(self, plans):
        """The second pass: the source again, beside ``.measured.parquet`` in row order."""
        cursor = MeasuredCursor(self.tmp / ".measured.parquet")
        for split_src, plan in zip(self.src.splits, plans):
            state = self.open_split(split_src, plan)
            for batch in iter_batches(split_src, split_src.column_names, batch_rows=self.batch_rows):
                measured = cursor.take(batch.rows.size)
                if not np.array_equal(measured.column("row").to_numpy(), batch.rows):
                    raise RuntimeError(f"split {split_src.name}: second pass out of step with the measured rows")
                self.write_batch(state, batch, measured)
            self.close_split(state)
        (self.tmp / ".measured.parquet").unlink()
        return self.finish()

    # the steps, shared by the second pass and ``clean``'s single pass (rules known up front)
    def open_split(self, split_src, plan) -> SimpleNamespace:
        ds_w, rej_w = self._writers(split_src)
        after = SplitTally(self.setup.fields, [])
        self._after_tallies.append(after)
        return SimpleNamespace(split_src=split_src, plan=plan, ds_w=ds_w, rej_w=rej_w, after=after, done=0,
                               tally=DecisionTally(split_src.name, plan.rows_total))

    def write_batch(self, state, batch, measured: pa.Table, ids: dict | None = None) -> None:
        """Decide, truncate and write one batch; ``measured`` holds its rows of ``lengths.parquet``,
        ``ids`` (role -> token ids per row) what measuring them gave, for ``--tokenize``."""
        import pyarrow.parquet as pq

        table, kept_table, rejects = self._batch(state.split_src, batch, measured, state.tally, state.after, ids)
        state.ds_w.write(kept_table)
        state.rej_w.write(rejects)
        self._lengths = self._lengths or pq.ParquetWriter(self.tmp / "lengths.parquet", table.schema)
        self._lengths.write_table(table)
        state.done += batch.rows.size
        if self.progress is not None:
            self.progress(f"{state.split_src.name} (writing)", state.done, state.plan.size)

    def close_split(self, state) -> None:
        """Check that every row of the split is kept, truncated or dropped, and close its writers."""
        split_src, plan, tally, ds_w, rej_w, done = (state.split_src, state.plan, state.tally, state.ds_w,
                                                     state.rej_w, state.done)
        counts = tally.counts
        if not (tally.measured == plan.size == done and ds_w.rows == counts["keep"] + counts["truncate"]
                and rej_w.rows == counts["drop"]):
            raise RuntimeError(f"split {split_src.name}: {done} rows read, {ds_w.rows} kept, {rej_w.rows} "
                               f"rejected, {plan.size} in the source: refusing to publish")
        fingerprint = hashlib.sha256(json.dumps([split_src.fingerprint, [r.to_dict() for r in self.resolved],
                                                 __version__]).encode()).hexdigest()[:16]
        ds_w.close(fingerprint)
        rej_w.close(fingerprint[::-1])
        self._tallies.append(tally)
        self._afters.append(state.after.split_audit(split_src.name, plan_sample(ds_w.rows, full=True), 0))

    def finish(self):
        """(decision tallies, after-cleaning audits, after tallies) once every split is closed."""
        from lengthscan.write.arrow_dataset import write_dataset_dict_index

        if self._lengths is not None:
            self._lengths.close()
        if self.src.has_splits:
            names = [s.name for s in self.src.splits]
            write_dataset_dict_index(self.tmp / "dataset", names)
            write_dataset_dict_index(self.tmp / "rejects", names)
        return self._tallies, self._afters, self._after_tallies

    def _writers(self, split_src):
        from lengthscan.sources.features import list_of, value
        from lengthscan.write.parquet import writer_class

        DatasetWriter = writer_class(self)  # writer.DatasetWriter; Parquet for --format parquet; the Ray probe

        features = split_src.parts[0].features()
        source_features = dict(features)
        if self.length_from:
            features[self.length_column] = value("float64" if self.length_from == "input_seconds" else "int64")
        if self.tokenize:
            roles = {f.role for f in self.setup.fields if f.kind == "text"}
            if "input" in roles:
                features["input_ids"] = list_of(value("int32"))
                features["attention_mask"] = list_of(value("int8"))
            if "target" in roles:
                features["labels"] = list_of(value("int32"))
        sub = split_src.name if self.src.has_splits else ""
        ds_w = DatasetWriter(self.tmp / "dataset" / sub, features, embed_local_files=self.embed_audio)
        extra = {"row": value("int64")}
        if split_src.multi_file:
            extra.update({"source_file": value("string"), "file_row": value("int64")})
        extra.update({"reason": value("string"), "reasons": list_of(value("string"))})
        for name in extra:
            if name in source_features:
                raise ColumnError(f"{self.src.spec}: has a column {name!r}, which rejects/ needs for its own")
        rej_w = DatasetWriter(self.tmp / "rejects" / sub, {**source_features, **extra},
                              embed_local_files=self.embed_audio)
        return ds_w, rej_w

    def _batch(self, split_src, batch, measured: pa.Table, tally: DecisionTally, after: SplitTally,
               ids: dict | None = None):
        from lengthscan.measure.records import Measured

        base, flags = base_and_flags(measured, self.setup.fields)
        d = decide(base, flags, self.resolved, special=self.special, keep_empty_targets=self.keep_empty_targets)
        tally.add(d)
        source = pa.Table.from_batches([batch.table])
        self.worst.add(split_src.name, batch.rows, base, d, source)
        final = {name: values.copy() for name, values in base.items()}
        source = self._truncate(source, d, final)
        if d.crop_seconds is not None:
            source = self._crop(source, d, final, split_src.base_dir(batch.rows))
        keep = d.decision != DROP
        kept = source.filter(pa.array(keep))
        if self.length_from:
            values = final[self.length_from][keep]
            kept = kept.append_column(self.length_column, pa.array(values))
        if self.tokenize:
            index = np.flatnonzero(keep)
            given = {role: [row_ids[i] for i in index] for role, row_ids in (ids or {}).items()}
            kept = self._token_columns(kept, {name: v[keep] for name, v in final.items()}, given,
                                       changed=(d.decision == TRUNCATE)[keep])
        rejects = source.filter(pa.array(~keep))
        drop_rows = batch.rows[~keep]
        rejects = rejects.append_column("row", pa.array(drop_rows, pa.int64()))
        if split_src.multi_file:
            files, file_rows = split_src.locate(drop_rows)
            rejects = rejects.append_column("source_file", pa.array(files, pa.string()))
            rejects = rejects.append_column("file_row", pa.array(file_rows, pa.int64()))
        cols = decision_columns(d)
        rejects = rejects.append_column("reason", cols["reason"].filter(pa.array(~keep)))
        rejects = rejects.append_column("reasons", cols["reasons"].filter(pa.array(~keep)))
        table = measured
        for name, col in cols.items():
            table = table.append_column(name, col)
        for spec in self.truncated_specs:
            after_col = np.where(d.decision == TRUNCATE, final[spec.name], -1)
            table = table.append_column(f"{spec.name}_after", pa.array(after_col, pa.int64(), mask=after_col < 0))
        measured_after = {f.role: Measured({s: final[s.name][keep] for s in f.specs}, flags[f.role][keep])
                          for f in self.setup.fields}
        after.add(batch.rows[keep], measured_after)
        return table, kept, rejects

    def _token_columns(self, kept: pa.Table, lengths: dict, given: dict, changed: np.ndarray) -> pa.Table:
        """``input_ids``/``attention_mask``/``labels`` as ``__call__`` gives them, each checked
        against its length: the ids measuring gave (``given``, role -> ids per kept row) where the
        text is unchanged, a tokenization of the truncated text (or of every text, without them)."""
        for f in self.setup.fields:
            if f.kind != "text":
                continue
            ids = given.get(f.role)
            todo = range(kept.num_rows) if ids is None else np.flatnonzero(changed)
            ids = list(ids) if ids is not None else [None] * kept.num_rows
            if len(todo):
                texts = kept.column(f.column).to_pylist()
                for i, row in zip(todo, self.setup.counter.ids([texts[i] for i in todo], f.role)):
                    ids[i] = row
            expected = lengths[f.primary.name]
            bad = next((i for i, (a, n) in enumerate(zip(ids, expected)) if len(a) != n), None)
            if bad is not None:
                raise RuntimeError(f"--tokenize: {f.column} of a kept row gives {len(ids[bad])} ids, "
                                   f"measured {expected[bad]}: refusing to write inconsistent data")
            column, mask = _id_lists(ids)
            if f.role == "target":
                kept = kept.append_column("labels", column)
            else:
                kept = kept.append_column("input_ids", column)
                kept = kept.append_column("attention_mask", mask)
        return kept

    def _truncate(self, source: pa.Table, d, final: dict) -> pa.Table:
        """Replace texts to truncate by their verified prefixes; record their new lengths."""
        from lengthscan.write.truncate import truncate_texts

        for f in self.setup.fields:
            caps = d.truncate_to.get(f.role)
            if f.kind != "text" or caps is None:
                continue
            idx = np.flatnonzero((caps >= 0) & (final[f.primary.name] > caps))
            if idx.size == 0:
                continue
            texts = source.column(f.column).to_pylist()
            done = truncate_texts(self.setup.counter, [texts[i] for i in idx], caps[idx], f.role)
            for i, t in zip(idx, done):
                texts[i] = t.text
                final[f.primary.name][i] = t.tokens
            position = source.schema.get_field_index(f.column)
            source = source.set_column(position, f.column, pa.array(texts, source.schema.field(f.column).type))
        return source

    def _crop(self, source: pa.Table, d, final: dict, base_dir: str | None) -> pa.Table:
        """Crop audio over an ``input_seconds`` limit; recompute its seconds, samples and frames."""
        from lengthscan.measure.audio.durations import resampled_length
        from lengthscan.write.crop import crop_column

        f = next(f for f in self.setup.fields if f.kind == "audio")
        column, frames, rates = crop_column(source.column(f.column), d.crop_seconds, self.tmp, self.final,
                                            base_dir=base_dir)
        source = source.set_column(source.schema.get_field_index(f.column), f.column, column)
        done = frames >= 0
        settings = self.setup.settings
        for spec in f.specs:
            if spec.unit == "seconds":
                final[spec.name][done] = frames[done] / rates[done]
            elif spec.unit == "samples":
                final[spec.name][done] = resampled_length(frames[done], rates[done], settings.sampling_rate)
            elif spec.unit == "frames":
                samples = resampled_length(frames[done], rates[done], settings.sampling_rate)
                final[spec.name][done] = settings.frame_rule.frames(samples)
        return source
