"""Packing in an audit: the options, the lengths it packs (a sink of the measuring loop), and the
figures and ``packs.parquet`` it leaves.

The lengths packed are those the trainer packs: a conversation's ``sequence_tokens`` (the rendered
chat template), else a text's ``input_tokens`` (special tokens included). Packs are simulated per
split, in source order, on every row: a sample's packs would not be the trainer's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from lengthscan.pack.figures import Steps, by_length, pack_figures, pack_fill
from lengthscan.pack.options import STRATEGIES, PackingError, PackingOptions
from lengthscan.pack.trl import Packs, pack_trl

__all__ = ["STRATEGIES", "PackingError", "PackingOptions"]  # their home is pack.options (no numba there)

def packed_metric(fields):
    """(role, spec) of the lengths a trainer packs: a conversation's sequence, else the input text."""
    if any(f.role == "target" for f in fields):
        raise PackingError("--packing packs one sequence per row: measure --input alone (a decoder's text), or "
                           "conversations (--messages, or --prompt with --completion), not an --input/--target pair")
    for f in fields:
        if (spec := f.kind.packed(f)) is not None:
            return f.role, spec
    raise PackingError("--packing packs token sequences: measure a text (--input) or conversations (--messages)")


class PackSink:
    """A sink of the measuring loop: the packed metric of every row of each split, by row id."""

    def __init__(self, fields, identity=None):
        self.role, self.spec = packed_metric(fields)
        # a conversation's trained tokens (--train-on): what a cut costs assistant-only SFT
        self.trained_spec = next((s for f in fields if (s := f.kind.trained(f)) is not None), None)
        self.lengths: dict[str, np.ndarray] = {}
        self.completion: dict[str, np.ndarray] = {}
        self.identity = identity  # --id COL's field: its values name the rows that lose tokens
        self.ids: dict[str, list] = {}

    def open_split(self, split_src, plan) -> None:
        if not plan.full:
            raise PackingError(f"--packing simulates every row of a split, and split {split_src.name!r} is sampled "
                               f"({plan.size:,} of {plan.rows_total:,} rows): add --full")
        self.lengths[split_src.name] = np.full(split_src.num_rows, -1, np.int64)
        if self.trained_spec is not None:
            self.completion[split_src.name] = np.full(split_src.num_rows, -1, np.int64)
        self.ids[split_src.name] = []

    def write(self, split_src, batch, measured: dict) -> None:
        if self.identity is not None and batch.table is not None and self.identity.name in batch.table.column_names:
            self.ids[split_src.name].append((batch.rows, batch.table.column(self.identity.name)))
        m = measured.get(self.role)
        if m is not None:
            values = np.asarray(m.values[self.spec])
            self.lengths[split_src.name][batch.rows] = np.where(values >= 0, values, -1).astype(np.int64)
            if self.trained_spec is not None and self.trained_spec in m.values:
                trained = np.asarray(m.values[self.trained_spec])
                self.completion[split_src.name][batch.rows] = np.where(trained >= 0, trained, -1).astype(np.int64)

    def close_split(self, split_src) -> None:
        """Nothing to do."""

    def id_of(self, split: str):
        """row -> ``--id`` value shown in the report (None without ``--id``)."""
        if self.identity is None or not self.ids.get(split):
            return None
        from lengthscan.write.worst_rows import shown_id

        def lookup(row: int):
            for rows, column in self.ids[split]:
                k = np.searchsorted(rows, row)
                if k < len(rows) and rows[k] == row:
                    return shown_id(column[int(k)].as_py())
            return None

        return lookup


def make_packs(lengths: np.ndarray, max_length: int, options: PackingOptions) -> Packs:
    """The packs of ``options.packing`` at ``max_length``."""
    if options.packing == "multipack":
        from lengthscan.pack.others import pack_multipack
        from lengthscan.training.batches import permutation

        seed = 42 if options.shuffle_seed is None else options.shuffle_seed
        return pack_multipack(lengths, max_length, order=permutation(len(lengths), seed),
                              micro_batch_size=options.batch_size)
    if options.packing == "knapsack":
        from lengthscan.pack.others import pack_knapsack

        return pack_knapsack(lengths, max_length, num_proc=options.packing_num_proc)
    return pack_trl(lengths, max_length, options.packing, num_proc=options.packing_num_proc,
                    shuffle_seed=options.shuffle_seed)


def simulate_packing(lengths_by_split: dict[str, np.ndarray], options: PackingOptions, *,
                     model_limit: int | None = None, ids=None, trained=None) -> tuple[dict, dict[str, Packs]]:
    """``report.json["packing"]`` and each split's packs; ``ids(split)`` gives a row -> ``--id``
    value lookup (or None) for the rows listed. ``trained`` (conversations): ``(completion by
    split, read)`` where ``read(split, rows)`` gives those rows' ``pack.trained.TrainedRuns``: the
    trained tokens lost are then figured (``pack.trained``)."""
    splits, packs = [], {}
    plain = Steps(options.batch_size, options.grad_accum, options.devices)
    steps = plain if options.packing != "multipack" else Steps(1, options.grad_accum, options.devices)
    for name, lengths in lengths_by_split.items():
        p = make_packs(lengths, options.max_length, options)
        packs[name] = p
        figures = pack_figures(p, lengths, steps, plain_steps=plain, max_length=options.max_length,
                               ids=ids(name) if ids is not None else None)
        if options.packing in ("bfd", "bfd_split"):
            from lengthscan.pack.trl import failing_batches

            figures["trl_failing_batches"] = failing_batches(lengths, num_proc=options.packing_num_proc,
                                                             shuffle_seed=options.shuffle_seed)
        if options.packing == "bfd" and figures["tokens_lost"]:  # what keeping the overflow would cost
            kept = make_packs(lengths, options.max_length, replace(options, packing="bfd_split"))
            figures["bfd_split_efficiency"] = round(float(kept.seq_lengths.sum()) / (kept.count * kept.max_length), 6)
        if options.packing == "multipack":
            from lengthscan.pack.others import multipack_steps

            figures["multipack"] = multipack_steps(p, options.max_length, micro_batch_size=options.batch_size,
                                                   grad_accum=options.grad_accum, devices=options.devices)
            figures["steps_per_epoch"] = figures["multipack"]["steps_per_epoch"]
        def table_packs(x, limit, made=p):  # the chosen L is packed already
            return made if limit == options.max_length else make_packs(x, limit, options)

        lost_in = _trained(figures, p, lengths, name, options, trained)
        figures.update(split=name, fill=pack_fill(p),
                       by_max_length=by_length(lengths, table_packs, steps, model_limit=model_limit,
                                               chosen=options.max_length, trained=lost_in))
        splits.append(figures)
    report = {"strategy": options.packing, "max_length": options.max_length,
              "implementation": _implementation(options.packing), "dataset_num_proc": options.packing_num_proc,
              "shuffle_seed": options.shuffle_seed if options.packing != "knapsack" else None,
              "steps": Steps(options.batch_size, options.grad_accum, options.devices).to_dict(), "splits": splits}
    if options.packing == "multipack":
        report["sampler_seed"] = 42 if options.shuffle_seed is None else options.shuffle_seed
        report["bin_tokens"] = options.batch_size * options.max_length
    return report, packs


def _trained(figures: dict, packs: Packs, lengths: np.ndarray, name: str, options: PackingOptions, trained):
    """Add the trained tokens ``packs`` lose to ``figures``; the table's ``packs -> trained tokens
    lost`` (None without conversations, or for knapsack, whose cut is not a row's end)."""
    if trained is None:
        return None
    from lengthscan.pack.trained import (
        KNAPSACK_NOTE,
        TRAINED_STRATEGIES,
        trained_figures,
        trained_lost_in,
        with_trained_losses,
    )

    completion, read = trained
    if options.packing not in TRAINED_STRATEGIES:
        figures.update(trained_tokens_lost=None, trained_tokens_note=KNAPSACK_NOTE)
        return None
    found, runs = trained_figures(packs, lengths, completion.get(name), lambda rows: read(name, rows))
    figures.update(found)
    figures["largest_losses"] = with_trained_losses(figures["largest_losses"], runs, lengths, packs)
    return trained_lost_in(runs, lengths)


def write_packs(path: Path, packs: dict[str, Packs]) -> None:
    """``packs.parquet``: a row per pack in the order the strategy makes them: ``pack``, ``rows``
    (source row ids, in the pack's order), ``seq_lengths`` (their tokens in the pack: TRL's own
    column), ``length`` (the pack's tokens), and ``split`` with several splits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for name, p in packs.items():
        offsets = pa.array(p.offsets.astype(np.int32) if p.offsets[-1] < 2**31 else p.offsets)
        make = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
        columns = {"pack": pa.array(np.arange(p.count, dtype=np.int64)),
                   "rows": make.from_arrays(offsets, pa.array(p.rows, pa.int64())),
                   "seq_lengths": make.from_arrays(offsets, pa.array(p.seq_lengths, pa.int64())),
                   "length": pa.array(p.pack_lengths().astype(np.int64))}
        if len(packs) > 1:
            columns = {"split": pa.array([name] * p.count, pa.string()), **columns}
        tables.append(pa.table(columns))
    pq.write_table(pa.concat_tables(tables) if len(tables) > 1 else tables[0], path)


def _implementation(strategy: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    if strategy == "multipack":
        return {"library": "axolotl", "function": "axolotl.utils.samplers.multipack.MultipackBatchSampler",
                "installed": None, "note": "simulated from axolotl at 067b021 (July 2026): first-fit in the "
                "sampler's order in groups of 100,000 rows, at most 200 rows a bin of micro_batch_size x L tokens, "
                "rows under 2 or over L tokens dropped; axolotl's RandomSampler draws a fresh order from torch's "
                "global RNG, so this order (seeded) is one such draw: the counts are representative, the exact "
                "bins are not"}
    if strategy == "knapsack":
        return {"library": "LLaMA-Factory", "function": "llamafactory.data.processor.supervised."
                "PackedSupervisedDatasetProcessor", "installed": None,
                "note": "simulated from LLaMA-Factory at ff6d4d1 (August 2026): packs of cutoff_len - 1 tokens "
                        "(its DataArguments lower cutoff_len by one), each row cut to that, greedy knapsack per "
                        "1,000-row preprocessing batch, packs padded to cutoff_len"}
    try:
        trl = version("trl")
    except PackageNotFoundError:
        trl = None
    note = ("simulated from trl 1.x's _pack_bfd / _pack_wrapped: 1,000-row map batches per contiguous "
            "dataset_num_proc shard, empty rows dropped (bfd), best-fit decreasing with a segment tree; "
            "the lengths are the audit's own: for plain text TRL's SFTTrainer first appends the EOS text "
            "to every row not ending with it (usually one more token)")
    if strategy == "wrapped":
        note += "; wrapped has no padding-free mode: the rows in a pack attend to each other"
    return {"library": "trl", "function": "trl.data_utils.pack_dataset", "installed": trl, "note": note}
