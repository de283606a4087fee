"""TRL's ``pack_dataset`` (trl 1.x ``data_utils``), simulated on lengths: the same packs, in order.

What decides TRL's packs besides the lengths:
- ``SFTConfig.shuffle_dataset``: the dataset is shuffled first, ``Dataset.shuffle(seed=args.seed)``,
  whose order is ``np.random.default_rng(seed).permutation(n)``;
- ``dataset_num_proc``: ``Dataset.map`` splits the rows into that many contiguous shards
  (``Dataset.shard(contiguous=True)``: the first ``n % k`` shards one row longer; never more shards
  than rows), packed independently and concatenated in shard order;
- the batches of ``map(batched=True)``: 1,000 rows from each shard's start; every batch is packed on
  its own, so no pack mixes two batches.
Within a batch: ``bfd`` drops empty sequences, cuts each to L (the overflow is lost) and fills bins
best-fit decreasing (``bins``); ``bfd_split`` cuts a long sequence into fragments of L (the last one
shorter) that are packed as sequences of their own; ``wrapped`` concatenates the batch's tokens and
cuts them every L tokens, across sequence boundaries (the batch's last pack is shorter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthscan.pack.bins import best_fit_decreasing, tree_size
from lengthscan.pack.options import TRL_STRATEGIES

#: ``Dataset.map``'s default ``batch_size``
MAP_BATCH = 1000


@dataclass(frozen=True)
class Packs:
    """Packs as flat arrays: pack ``p`` holds ``rows[offsets[p]:offsets[p+1]]`` (source row ids, in
    the pack's order) with ``seq_lengths`` the tokens each contributes (after truncation or split);
    ``lost`` is the tokens of each source row that no pack holds (bfd's overflow)."""

    strategy: str
    max_length: int
    offsets: np.ndarray
    rows: np.ndarray
    seq_lengths: np.ndarray
    lost: np.ndarray

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    def pack_lengths(self) -> np.ndarray:
        """Tokens in each pack."""
        ends = np.concatenate([[0], np.cumsum(self.seq_lengths, dtype=np.int64)])
        return ends[self.offsets[1:]] - ends[self.offsets[:-1]]


def row_order(n: int, *, shuffle_seed: int | None = None) -> np.ndarray:
    """The order TRL packs the rows in: source order, or ``Dataset.shuffle(seed=...)``'s."""
    if shuffle_seed is None:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(shuffle_seed).permutation(n).astype(np.int64)


def batch_starts(n: int, *, num_proc: int | None = None, batch_size: int = MAP_BATCH) -> np.ndarray:
    """Positions (in packing order) where ``Dataset.map(batched=True, num_proc=...)``'s batches start,
    and ``n`` at the end."""
    shards = max(1, min(num_proc or 1, n)) if n else 1
    div, mod = divmod(n, shards)
    starts = []
    for index in range(shards):
        start = div * index + min(index, mod)
        end = start + div + (1 if index < mod else 0)
        starts.extend(range(start, end, batch_size))
    return np.array(starts + [n], dtype=np.int64)


def pack_trl(lengths, max_length: int, strategy: str = "bfd", *, num_proc: int | None = None,
             shuffle_seed: int | None = None, batch_size: int = MAP_BATCH) -> Packs:
    """The packs ``trl.pack_dataset`` makes of rows of ``lengths`` tokens (source order), as
    ``SFTTrainer`` calls it with ``dataset_num_proc=num_proc`` and ``shuffle_dataset`` (``shuffle_seed``:
    ``args.seed``; None: not shuffled). A row without a length (negative) is an empty row."""
    if strategy not in TRL_STRATEGIES:
        raise ValueError(f"unknown TRL packing strategy {strategy!r} (one of {', '.join(TRL_STRATEGIES)})")
    if max_length < 1:
        raise ValueError(f"max_length {max_length}: give at least 1")
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 0)
    order = row_order(len(lengths), shuffle_seed=shuffle_seed)
    starts = batch_starts(len(lengths), num_proc=num_proc, batch_size=batch_size)
    ordered = lengths[order]
    if strategy == "wrapped":
        return _wrapped(ordered, order, starts, max_length)
    return _bfd(ordered, order, starts, max_length, split=strategy == "bfd_split")


def _bfd(ordered: np.ndarray, order: np.ndarray, starts: np.ndarray, limit: int, *, split: bool) -> Packs:
    batch_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    keep = ordered > 0
    rows, lens, batch = order[keep], ordered[keep], batch_of[keep]
    lost = np.zeros(len(order), np.int64)
    if split:
        pieces = -(-lens // limit)
        rows, batch = np.repeat(rows, pieces), np.repeat(batch, pieces)
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        index = np.arange(len(rows)) - first
        total = np.repeat(lens, pieces)
        lens = np.minimum(limit, total - index * limit)
    else:
        lost[rows] = np.maximum(lens - limit, 0)
        lens = np.minimum(lens, limit)
    # TRL's processing order: by batch, then length descending, ties in their order in the batch
    processing = np.argsort(batch * (limit + 1) + (limit - lens), kind="stable")
    lens_p, rows_p, batch_p = lens[processing], rows[processing], batch[processing]
    item_starts = np.searchsorted(batch_p, np.arange(len(starts)), side="left").astype(np.int64)
    bin_of, _ = best_fit_decreasing(lens_p, item_starts, limit, tree_size(limit))
    packed = np.argsort(bin_of, kind="stable")  # bins in opening order, items in the order they went in
    counts = np.bincount(bin_of, minlength=int(bin_of.max()) + 1 if len(bin_of) else 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Packs("bfd_split" if split else "bfd", limit, offsets, rows_p[packed], lens_p[packed], lost)


def _wrapped(ordered: np.ndarray, order: np.ndarray, starts: np.ndarray, limit: int) -> Packs:
    offsets, rows, seq = [0], [], []
    for b in range(len(starts) - 1):
        lens = ordered[starts[b]:starts[b + 1]]
        ids = order[starts[b]:starts[b + 1]]
        total = int(lens.sum())
        if not total:
            continue
        ends = np.cumsum(lens)
        cuts = np.arange(limit, total, limit)
        # every boundary, of a row or of a pack: segments between them belong to one row and one pack
        bounds = np.unique(np.concatenate([[0], ends, cuts]))
        seg_start, seg_end = bounds[:-1], bounds[1:]
        seg_row = np.searchsorted(ends, seg_start, side="right")
        seg_pack = seg_start // limit
        rows.append(ids[seg_row])
        seq.append(seg_end - seg_start)
        counts = np.bincount(seg_pack, minlength=-(-total // limit))
        offsets.extend((offsets[-1] + np.cumsum(counts)).tolist())
    rows_a = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    seq_a = np.concatenate(seq).astype(np.int64) if seq else np.zeros(0, np.int64)
    return Packs("wrapped", limit, np.array(offsets, np.int64), rows_a, seq_a, np.zeros(len(order), np.int64))


def failing_batches(lengths, *, num_proc: int | None = None, shuffle_seed: int | None = None,
                    batch_size: int = MAP_BATCH) -> int:
    """``map`` batches whose every row is empty: trl's ``_pack_bfd`` fails on them (pyarrow has no
    ``take`` of an empty selection of list columns: ``ArrowNotImplementedError``), so ``bfd`` and
    ``bfd_split`` cannot pack such a dataset until its empty rows are removed."""
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 0)
    ordered = lengths[row_order(len(lengths), shuffle_seed=shuffle_seed)]
    starts = batch_starts(len(lengths), num_proc=num_proc, batch_size=batch_size)
    if len(starts) < 2 or not len(ordered):
        return 0
    filled = np.add.reduceat((ordered > 0).astype(np.int64), starts[:-1])
    return int(((np.diff(starts) > 0) & (filled == 0)).sum())
