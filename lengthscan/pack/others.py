"""axolotl's multipack and LLaMA-Factory's greedy knapsack, simulated on lengths.

**axolotl** (``utils/samplers/multipack.py`` at 067b021, July 2026; cited, not imported): rows longer
than ``sequence_len`` are dropped before packing (``excess_length_strategy: drop``, the default), as
are rows without tokens. ``MultipackBatchSampler`` takes the rows in its base sampler's order (a
``RandomSampler``; ``curriculum_sampling``: source order) and cuts that order into groups of
``sample_packing_group_size`` (100,000); within a group, ``pack_group`` puts each row, in that
order (no sort, whatever its docstring says), into the FIRST bin with room and fewer than
``sample_packing_bin_size`` (200) rows, else opens a bin. Bins of all groups are concatenated; a
bin holds ``micro_batch_size x sequence_len`` tokens and is one batch when the attention supports
packing (the default), else bins of ``sequence_len`` are grouped ``micro_batch_size`` to a batch
(``multipack_real_batches``). ``drop_last=True`` drops an incomplete last batch. Its efficiency is
tokens over bins x capacity; ``sample_packing_eff_est`` is that, rounded up to 0.01, and its step
estimate is ``floor(0.99 x tokens / eff_est / sequence_len // batch_size) - 1`` per epoch
(``utils/trainer.py``, ``calculate_total_num_steps``).

First-fit is O(rows x bins) as axolotl writes it; here a max-tree over the bins' free space finds
the first bin with room in O(log bins), the same bin.

**LLaMA-Factory** (``data/processor/supervised.py``, ``PackedSupervisedDatasetProcessor``,
``processor_utils.greedy_knapsack`` and ``hparams/data_args.py`` at ff6d4d1, August 2026): with
packing, ``DataArguments`` lowers ``cutoff_len`` by one, so a pack holds C - 1 tokens for the C the
user gives; each example is cut to that by ``infer_seqlen`` when it is encoded (the "dropped lengthy
example" branch is then unreachable), so a long row keeps its first C - 1 tokens and loses the
rest. Within each preprocessing batch (``preprocessing_batch_size``, 1,000 rows, from each of the
``preprocessing_num_workers`` contiguous shards of ``Dataset.map``), the lengths are sorted
ascending and knapsacks filled one at a time, each taking the largest remaining length that still
fits (``bisect``) until none does; a length's row is the last row of that length not yet packed.
Each pack is padded to C tokens.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np

from lengthscan.pack.bins import njit
from lengthscan.pack.trl import Packs

#: axolotl's defaults: sample_packing_group_size, sample_packing_bin_size, min_sample_len
AXOLOTL_GROUP, AXOLOTL_BIN_ROWS, AXOLOTL_MIN_LEN = 100_000, 200, 2
#: LLaMA-Factory's default preprocessing_batch_size
LLAMAFACTORY_BATCH = 1000


@njit(cache=True)
def _first_fit(sizes, capacity, bin_rows):
    """The bin of each item, first-fit in the given order, bins capped at ``bin_rows`` items."""
    n = sizes.shape[0]
    tree_size = 1
    while tree_size < max(n, 1):
        tree_size *= 2
    tree = np.full(2 * tree_size, -1, np.int64)  # the largest free space under a node (-1: no open bin)
    count = np.zeros(max(n, 1), np.int64)
    bin_of = np.empty(n, np.int64)
    bins = 0
    for k in range(n):
        size = sizes[k]
        if tree[1] >= size:  # the leftmost bin with room
            i = 1
            while i < tree_size:
                i = 2 * i if tree[2 * i] >= size else 2 * i + 1
            b = i - tree_size
            free = tree[i] - size
        else:
            b = bins
            bins += 1
            free = capacity - size
        bin_of[k] = b
        count[b] += 1
        i = tree_size + b
        tree[i] = free if count[b] < bin_rows else -1
        while i > 1:
            i >>= 1
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = left if left >= right else right
    return bin_of


def pack_multipack(lengths, sequence_len: int, *, order=None, micro_batch_size: int = 1,
                   real_batches: bool = False, group_size: int = AXOLOTL_GROUP,
                   bin_rows: int = AXOLOTL_BIN_ROWS) -> Packs:
    """axolotl's bins (see the module) of rows of ``lengths`` taken in ``order`` (its sampler's; default
    source order). A pack is a bin: ``micro_batch_size x sequence_len`` tokens unless ``real_batches``."""
    lengths = np.asarray(lengths, np.int64)
    capacity = sequence_len if real_batches else micro_batch_size * sequence_len
    order = np.arange(len(lengths), dtype=np.int64) if order is None else np.asarray(order, np.int64)
    lost = np.where((lengths > sequence_len) | (lengths == 1), np.maximum(lengths, 0), 0)
    kept = order[(lengths[order] >= AXOLOTL_MIN_LEN) & (lengths[order] <= sequence_len)]
    rows, seq, offsets = [], [], [0]
    for start in range(0, len(kept), group_size):
        group = kept[start:start + group_size]
        bin_of = _first_fit(lengths[group], capacity, bin_rows)
        packed = np.argsort(bin_of, kind="stable")
        rows.append(group[packed])
        seq.append(lengths[group][packed])
        counts = np.bincount(bin_of)
        offsets.extend((offsets[-1] + np.cumsum(counts)).tolist())
    return Packs("multipack", capacity, np.array(offsets, np.int64), _cat(rows), _cat(seq), lost)


def multipack_steps(packs: Packs, sequence_len: int, *, micro_batch_size: int = 1, real_batches: bool = False,
                    grad_accum: int = 1, devices: int = 1) -> dict:
    """axolotl's batches and its own step estimate from ``sample_packing_eff_est``."""
    import math

    tokens = int(packs.seq_lengths.sum())
    per_batch = micro_batch_size if real_batches else 1
    batches = packs.count // per_batch  # drop_last=True
    efficiency = tokens / (packs.count * packs.max_length) if packs.count else 0.0
    eff_est = math.ceil(efficiency * 100.0) / 100.0
    batch_size = micro_batch_size * grad_accum * devices  # axolotl's cfg.batch_size
    # calculate_total_num_steps without sample_packing_eff_est (the default): len(sampler) * mbs // batch_size
    steps = max(1, batches * micro_batch_size // batch_size) if batches else 0
    estimate = int(math.floor(0.99 * tokens / eff_est / sequence_len // batch_size) - 1) if eff_est else None
    return {"batches": batches, "efficiency": round(efficiency, 6), "sample_packing_eff_est": eff_est,
            "steps_per_epoch": steps,
            "steps_with_eff_est": estimate if estimate is not None and estimate >= 1 else None,
            "note": "steps as axolotl counts them (accelerate's even_batches off); steps_with_eff_est is its estimate "
                    "once sample_packing_eff_est is set (None: the formula gives less than one step)"}


def pack_knapsack(lengths, cutoff_len: int, *, batch_size: int = LLAMAFACTORY_BATCH,
                  num_proc: int | None = None) -> Packs:
    """LLaMA-Factory's packs (see the module) of rows of ``lengths``, in source order, for the
    ``cutoff_len`` the user gives (C): packs of C - 1 tokens; ``num_proc``: its
    ``preprocessing_num_workers``."""
    from lengthscan.pack.trl import batch_starts

    limit = cutoff_len - 1
    if limit < 1:
        raise ValueError(f"cutoff_len {cutoff_len}: LLaMA-Factory packs cutoff_len - 1 tokens; give at least 2")
    lengths = np.asarray(lengths, np.int64)
    lost = np.maximum(lengths - limit, 0)
    cut = np.minimum(lengths, limit)
    rows, seq, offsets = [], [], [0]
    starts = batch_starts(len(lengths), num_proc=num_proc, batch_size=batch_size)
    for b in range(len(starts) - 1):
        ids = np.arange(starts[b], starts[b + 1])
        valid = ids[cut[ids] >= 0]
        by_length = defaultdict(list)
        numbers = []
        for row in valid.tolist():
            by_length[int(cut[row])].append(row)
            numbers.append(int(cut[row]))
        numbers.sort()
        while numbers:
            capacity = limit
            while True:
                index = bisect.bisect(numbers, capacity)
                if index == 0:
                    break
                length = numbers.pop(index - 1)
                capacity -= length
                rows.append(by_length[length].pop())
                seq.append(length)
            offsets.append(len(rows))
    return Packs("knapsack", limit, np.array(offsets, np.int64), np.array(rows, np.int64),
                 np.array(seq, np.int64), lost)


def _cat(parts) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
