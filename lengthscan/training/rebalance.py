"""``train_sampling_strategy="batch_rebalance"``: transformers' ``BatchRebalanceSampler``, ported exactly.

The installed Trainer (5.x, ``_get_train_sampler``) builds, on one process,
``BatchRebalanceSampler(lengths, effective_batch_size=B x K, dp_size=1, grad_accum=K, rank=0,
drop_last=dataloader_drop_last)`` and hands it to the DataLoader as its ``batch_sampler``. It passes
no seed: the sampler's own default (42) is used, so ``args.seed`` and ``data_seed`` do not change
the order, and epoch ``e`` draws ``torch.randperm(n, generator=Generator().manual_seed(42 + e))``.

Each run of ``B x K`` rows of that permutation (a global batch; a last, short one unless
``drop_last``, padded with the epoch's first rows when it has fewer than ``K``) is sorted longest
first and split into ``K`` contiguous groups whose sizes a hill climb adjusts until the groups'
costs ``rows x L + 0.001 x rows x L^2`` (``L`` the group's longest row) even out; the groups are
then yielded costliest first, one per micro-batch. Batch sizes vary: long rows come in smaller
batches, short rows in larger ones (up to ``B x K - K + 1`` rows).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from lengthscan.training.batches import Batches, as_lengths, check_batch_size, permutation

#: ``BatchRebalanceSampler``'s default seed, which the Trainer leaves as is.
TRAINER_REBALANCE_SEED = 42
#: ``BatchRebalanceSampler.QUADRATIC_COST_COEF``.
QUADRATIC_COST_COEF = 0.001


def rebalance_available() -> bool:
    """Whether the installed Trainer offers ``train_sampling_strategy="batch_rebalance"``.

    Read from transformers' sources, as importing it (and torch) would take seconds.
    """
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        trainer = (root / "trainer.py").read_text(encoding="utf-8")
        utils = (root / "trainer_pt_utils.py").read_text(encoding="utf-8")
    except OSError:
        return False
    return "class BatchRebalanceSampler" in utils and '"batch_rebalance"' in trainer


def rebalance_batches(lengths, batch_size: int, *, grad_accum: int = 1, seed: int = TRAINER_REBALANCE_SEED,
                      drop_last: bool = False) -> Batches:
    """The micro-batches ``BatchRebalanceSampler`` yields on one process (``dp_size=1``, ``rank=0``).

    ``batch_size`` is the per-device batch and ``grad_accum`` the accumulation steps, as the
    Trainer passes them (``effective_batch_size = batch_size x grad_accum``); ``seed`` is the
    sampler's (the Trainer's epoch 0 uses 42 whatever ``args.seed``). ``lengths`` are what the
    Trainer reads: the ``length`` column, else ``len(input_ids)``. A padded last global batch
    repeats rows, so ``order`` may hold a row twice.
    """
    check_batch_size(batch_size)
    if not isinstance(grad_accum, (int, np.integer)) or grad_accum < 1:
        raise ValueError(f"grad_accum must be a positive integer, not {grad_accum!r}")
    lengths = as_lengths(lengths)
    n, k, size = lengths.size, int(grad_accum), int(batch_size) * int(grad_accum)
    order = permutation(n, seed)
    full, rest = divmod(n, size)
    batches: list[np.ndarray] = []
    if full:
        block = order[:full * size].reshape(full, size)
        # sorted(..., key=length, reverse=True) is stable: equal lengths keep their shuffled order
        block = np.take_along_axis(block, np.argsort(-lengths[block], axis=1, kind="stable"), axis=1)
        for rows in block:
            batches.extend(_assign(rows, lengths[rows].tolist(), k, size))
    if rest and not drop_last:
        tail = order[full * size:]
        if tail.size < k:
            tail = np.concatenate([tail, np.tile(order, math.ceil((k - tail.size) / n))[:k - tail.size]])
        tail = tail[np.argsort(-lengths[tail], kind="stable")]
        batches.extend(_assign(tail, lengths[tail].tolist(), k, size))
    offsets = np.cumsum([0] + [b.size for b in batches], dtype=np.int64)
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    return Batches("batch_rebalance", int(batch_size), size, flat.astype(np.int64), offsets)


def most_rows(n: int, batch_size: int, grad_accum: int = 1) -> int:
    """The most rows one micro-batch can hold, whatever the order: ``B x K - K + 1`` (every other
    group keeps one row), or fewer on a small dataset."""
    size, k = batch_size * grad_accum, grad_accum
    return max(min(size, n) - k + 1, 1)


# -- BatchRebalanceSampler._assign and _balance_groups, for dp_size 1 -------------------------------------------

def _cost(rows: int, longest):
    # Python scalars, evaluated as the sampler does: bs * max_len + COEF * bs * max_len * max_len.
    return rows * longest + QUADRATIC_COST_COEF * rows * longest * longest


def _costs(counts: list[int], lengths: list) -> list:
    out, start = [], 0
    for c in counts:
        out.append(_cost(c, lengths[start]) if c else 0.0)
        start += c
    return out


def _assign(rows: np.ndarray, lengths: list, k: int, size: int) -> list[np.ndarray]:
    """One global batch (sorted longest first) as ``k`` micro-batches, costliest first."""
    counts = _balance(lengths, k, size)
    costs = _costs(counts, lengths)
    starts = np.cumsum([0] + counts)
    ranked = sorted(range(k), key=lambda i: costs[i], reverse=True)  # stable: ties keep group order
    return [rows[starts[i]:starts[i + 1]] for i in ranked]


def _balance(lengths: list, k: int, size: int) -> list[int]:
    """Group sizes by the sampler's hill climb, from equal sizes: move one row from the costliest
    group (the first of equals) to the cheapest; stop when costs are all equal, on a repeated
    state, or after ``max(30 k, size)`` rounds; keep the sizes of the lowest spread seen.

    With one rank, a costliest group down to one row has its slot (itself) frozen and no row moves,
    so the next round repeats a state and the climb stops: here it stops at once. The cheapest
    group is the sampler's first candidate of another cost, since the costs are not all equal.
    """
    n = len(lengths)
    if n < k:
        raise ValueError(f"Not enough samples ({n}) to fill {k} groups with at least 1 sample(s) each.")
    base, extra = divmod(n, k)
    counts = [base + (1 if i < extra else 0) for i in range(k)]
    seen: set[tuple] = set()
    best_spread, best_counts = float("inf"), list(counts)
    for _ in range(max(k * 30, size)):
        key = tuple(counts)
        if key in seen or k <= 1:
            break
        seen.add(key)
        costs = _costs(counts, lengths)
        hi = max(range(k), key=costs.__getitem__)
        lo = min(range(k), key=costs.__getitem__)
        spread = costs[hi] - costs[lo]
        if spread < best_spread:
            best_spread, best_counts = spread, list(counts)
        if costs[hi] == costs[lo] or counts[hi] <= 1:
            break
        counts[hi] -= 1
        counts[lo] += 1
    return best_counts
