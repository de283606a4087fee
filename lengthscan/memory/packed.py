"""Training memory of packed batches: the packs a strategy makes (``lengthscan.pack``), batched
as the trainer batches them, priced by the memory model.

How a packed batch reaches the model:
- TRL ``bfd``/``bfd_split`` turn ``padding_free`` on: ``DataCollatorForLanguageModeling`` flattens the
  batch's B packs into ONE row of all their tokens with ``position_ids`` restarting at each part.
  With ``flash_attention_2`` each part attends only within itself (varlen kernels: no score matrix,
  memory linear in the tokens); with ``sdpa`` or ``eager`` transformers builds a mask over the whole
  flattened row, so attention memory follows the row's full length, not the parts'. A batch is
  priced as (1 row x its tokens), with the mask where the implementation builds one.
- axolotl's multipack: a bin of ``micro_batch_size x sequence_len`` tokens is one batch, flattened
  the same way (its flash-attention path).
- TRL ``wrapped``: packs of L tokens (the batch's last shorter), padded per batch of B as usual.
- LLaMA-Factory's knapsack: packs of ``cutoff_len - 1`` tokens padded to ``cutoff_len``, B packs a batch.
The Trainer's batches of packs are its random order with ``args.seed`` (``training.batches``).
Peaks grow with rows and lengths, so the worst batch is the one with the most tokens (flattened)
or the longest padded length (padded batches, full ones first): only distinct candidate shapes
are priced.
"""

from __future__ import annotations

import numpy as np

from lengthscan.memory.api import estimate
from lengthscan.memory.options import MemoryOptions, Shape

#: strategies whose batches reach the model flattened into one row (padding-free)
FLATTENED = ("bfd", "bfd_split", "multipack")


def packed_batches(packs, strategy: str, batch_size: int, *, seed: int = 42,
                   shuffle_seed: int | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(pack indices of each batch, (rows, length, padding) of each batch) in the Trainer's order.
    ``shuffle_seed``: TRL's ``shuffle_dataset``, which shuffles the packed dataset again before the
    Trainer's sampler draws from it."""
    from lengthscan.training.batches import random_batches

    lengths = packs.pack_lengths()
    if strategy == "multipack":  # a bin is a batch
        members = [np.array([i]) for i in range(packs.count)]
        return members, np.stack([np.ones(packs.count, np.int64), lengths, np.zeros(packs.count, np.int64)], axis=1)
    batches = random_batches(packs.count, batch_size, seed=seed)
    members = batches.indices
    if shuffle_seed is not None and strategy in ("bfd", "bfd_split", "wrapped"):
        shuffled = np.random.default_rng(shuffle_seed).permutation(packs.count)
        members = [shuffled[m] for m in members]
    if strategy in FLATTENED:
        tokens = np.array([int(lengths[m].sum()) for m in members], np.int64)
        return members, np.stack([np.ones(len(members), np.int64), tokens, np.zeros(len(members), np.int64)], axis=1)
    if strategy == "knapsack":  # packs of C - 1 padded to C (its own cutoff_len + 1), pads unmasked: no mask
        return members, np.array([[len(m), packs.max_length + 1, 0] for m in members], np.int64)
    return members, np.array([[len(m), int(lengths[m].max()), int(lengths[m].min() < lengths[m].max())]
                              for m in members], np.int64)


def price_packed(config, packs, strategy: str, batch_size: int, *, options: MemoryOptions = MemoryOptions(),
                 seed: int = 42, shuffle_seed: int | None = None) -> dict:
    """``memory["packing"]``: the worst packed batch (its packs, source rows and peak) and the spread."""
    members, shapes = packed_batches(packs, strategy, batch_size, seed=seed, shuffle_seed=shuffle_seed)
    if not members:
        raise ValueError("no packs to batch: every row lacks a length, the source is empty, or the strategy "
                         "dropped every row (multipack drops rows longer than L)")
    flattened = strategy in FLATTENED
    mask = flattened and options.attention != "flash"  # sdpa/eager: a mask over the flattened row

    def shape_of(row) -> Shape:
        return Shape(int(row[0]), int(row[1]), None, bool(mask) if flattened else bool(row[2]))

    order = np.lexsort((shapes[:, 2], shapes[:, 1], shapes[:, 0]))  # the most rows, then the longest, last
    worst = int(order[-1])
    candidates = {tuple(shapes[worst])} | {tuple(shapes[i]) for i in order[-3:]}
    priced = {c: estimate(config, shape_of(c), options) for c in candidates}
    worst = max(range(len(shapes)), key=lambda i: (priced[tuple(shapes[i])].peak_bytes
                                                   if tuple(shapes[i]) in priced else -1, -i))
    best = priced[tuple(shapes[worst])]
    o = packs.offsets
    in_worst = members[worst].tolist()
    tokens = np.sort(shapes[:, 0] * shapes[:, 1])
    return {
        "strategy": strategy, "max_length": packs.max_length, "flattened": flattened,
        "attention_follows": ("the parts (varlen flash attention)" if flattened and not mask else
                              "the whole flattened row (a mask over it)" if flattened else "the padded batch"),
        "batches": len(members), "batch_size": 1 if strategy == "multipack" else batch_size, "seed": seed,
        "worst_batch": {"index": worst, "packs": in_worst,
                        "rows": [packs.rows[o[p]:o[p + 1]].tolist() for p in in_worst],
                        "shape": shape_of(shapes[worst]).to_dict(), "peak_bytes": best.peak_bytes,
                        "phase": best.phase, "terms": dict(best.terms)},
        "positions_per_batch": {"p50": int(tokens[len(tokens) // 2]), "max": int(tokens[-1])},
    }
