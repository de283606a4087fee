"""What a packing does to an epoch: packs, efficiency, tokens lost and the rows losing them, rows
split, optimizer steps; beside it the same epoch without packing (rows cut to L, padded per batch);
and a table over L, so the length can be chosen before training.

Steps follow the installed transformers ``Trainer``: each of D processes gets
``ceil(ceil(N / B) / D)`` batches (accelerate's ``even_batches``), and an epoch makes
``max(ceil(batches / K), 1)`` optimizer steps with K-step gradient accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthscan.pack.trl import Packs

#: the lengths of the table over L, with the model's limit added when known
TABLE_LENGTHS = (1024, 2048, 4096, 8192, 16384)
#: the largest L of the table (the largest --max-length): a model limit past it is left out
MAX_TABLE_LENGTH = 1 << 24
#: rows listed by name among those losing tokens or split
LISTED_ROWS = 20


@dataclass(frozen=True)
class Steps:
    """Batch size per device, gradient accumulation steps and devices, as the Trainer takes them."""

    batch_size: int = 8
    grad_accum: int = 1
    devices: int = 1

    def per_epoch(self, items: int) -> int:
        """Optimizer steps of an epoch over ``items`` rows (or packs)."""
        if items <= 0:
            return 0
        batches = -(-items // self.batch_size)
        per_device = -(-batches // self.devices)
        return max(-(-per_device // self.grad_accum), 1)

    def to_dict(self) -> dict:
        return {"per_device_batch_size": self.batch_size, "gradient_accumulation_steps": self.grad_accum,
                "devices": self.devices}


def pack_figures(packs: Packs, lengths: np.ndarray, steps: Steps, *, ids=None, plain_steps: Steps | None = None,
                 max_length: int | None = None) -> dict:
    """The figures of ``packs`` made from rows of ``lengths`` tokens (negative: no length); ``ids``
    (row -> ``--id`` value) names the rows listed;
    ``plain_steps`` and ``max_length`` (default: ``steps`` and the packs') for the epoch without packing."""
    lengths = np.asarray(lengths, np.int64)
    known = lengths >= 0
    tokens = int(lengths[known].sum())
    in_packs = int(packs.seq_lengths.sum())
    capacity = packs.count * packs.max_length
    lost = packs.lost
    losing = np.flatnonzero(lost > 0)
    pieces = np.bincount(packs.rows, minlength=len(lengths)) if len(packs.rows) else np.zeros(len(lengths), np.int64)
    split = np.flatnonzero(pieces > 1)
    out = {
        "strategy": packs.strategy, "max_length": packs.max_length, "rows": int(len(lengths)),
        "rows_without_length": int((~known).sum()), "empty_rows": int((lengths == 0).sum()),
        "packs": packs.count, "tokens": tokens, "tokens_in_packs": in_packs,
        "efficiency": round(in_packs / capacity, 6) if capacity else None,
        "tokens_lost": int(lost.sum()), "tokens_lost_share": round(int(lost.sum()) / tokens, 6) if tokens else 0.0,
        "rows_losing_tokens": int(losing.size), "rows_split": int(split.size),
        "steps_per_epoch": steps.per_epoch(packs.count), "steps": steps.to_dict(),
        "largest_losses": _listed(losing, lost, ids), "split_rows": _listed(split, pieces, ids, key="pieces"),
    }
    out["without_packing"] = unpacked(lengths, max_length or packs.max_length, plain_steps or steps)
    return out


def unpacked(lengths: np.ndarray, max_length: int, steps: Steps, *, seed: int = 42) -> dict:
    """The same epoch without packing: every row with a length, cut to ``max_length`` (SFT's
    truncation), in the Trainer's random order (``args.seed``), padded to each batch's longest."""
    from lengthscan.training.batches import random_batches

    rows = np.minimum(lengths[lengths > 0], max_length)
    batches = random_batches(rows.size, steps.batch_size, seed=seed)
    padded = int((batches.sizes * batches.padded_lengths(rows, None)).sum()) if rows.size else 0
    real = int(rows.sum())
    return {"rows": int(rows.size), "tokens": real, "padded_positions": padded,
            "padding_share": round(1 - real / padded, 6) if padded else None,
            "tokens_lost": int(np.maximum(lengths[lengths > 0] - max_length, 0).sum()),
            "steps_per_epoch": steps.per_epoch(int(rows.size)), "seed": seed}


def by_length(lengths: np.ndarray, make, steps: Steps, *, model_limit: int | None = None,
              chosen: int | None = None, trained=None) -> list[dict]:
    """Efficiency, tokens lost, packs and steps for each L of ``TABLE_LENGTHS``, the model's limit
    and the ``chosen`` one; ``make(lengths, L)`` packs; ``trained(packs)`` (conversations) the
    trained tokens they lose (None: not known at that L)."""
    table = []
    lengths_asked = set(TABLE_LENGTHS) | {x for x in (model_limit, chosen) if x}
    for limit in sorted(x for x in lengths_asked if x <= MAX_TABLE_LENGTH):  # a limit of 10^9 is no pack
        packs = make(lengths, limit)
        in_packs = int(packs.seq_lengths.sum())
        table.append({"max_length": limit, "packs": packs.count,
                      "efficiency": round(in_packs / (packs.count * packs.max_length), 6) if packs.count else None,
                      "tokens_lost": int(packs.lost.sum()), "rows_losing_tokens": int((packs.lost > 0).sum()),
                      "steps_per_epoch": steps.per_epoch(packs.count), "model_limit": limit == model_limit,
                      "chosen": limit == chosen})
        if trained is not None:
            table[-1]["trained_tokens_lost"] = trained(packs)
    return table


def pack_fill(packs: Packs, bins: int = 20) -> dict:
    """A histogram of the packs' fill (tokens over L), for the report."""
    fill = packs.pack_lengths() / packs.max_length if packs.count else np.zeros(0)
    counts, edges = np.histogram(fill, bins=bins, range=(0.0, 1.0))
    return {"edges": [round(float(e), 4) for e in edges], "counts": counts.tolist()}


def _listed(rows: np.ndarray, values: np.ndarray, ids, *, key: str = "tokens_lost") -> list[dict]:
    top = rows[np.argsort(-values[rows], kind="stable")[:LISTED_ROWS]]
    out = []
    for r in top.tolist():
        entry = {"row": int(r), key: int(values[r])}
        if ids is not None:
            entry["id"] = ids(r)
        out.append(entry)
    return out
