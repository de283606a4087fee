"""The trained tokens a packing loses: of the tokens a packing cuts off, those in the loss mask.

For assistant-only SFT (conversations with ``--train-on``), what a cut costs is the trained tokens
it removes: a row cut at L loses nothing that matters when its tail is a prompt, and everything
when its only answer is past L. The packs say how many tokens of each row they keep (``Packs.lost``:
TRL's ``bfd`` keeps a row's first L tokens, slicing ``input_ids`` and the assistant or completion
mask alike with ``pc.list_slice``; axolotl's multipack drops a row whole); the trained positions of
the rows that lose tokens are measured again with their labels (``ChatCounter.measure(...,
with_ids=True)``: the same mask ``clean --tokenize`` writes), so only those rows are read twice.

LLaMA-Factory's knapsack is left out: its ``infer_seqlen`` cuts a long example's prompt and
response separately, turn by turn, not its end, so which trained tokens it loses is not a prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: strategies whose lost tokens are a row's end (bfd, multipack's whole rows) or nothing (bfd_split, wrapped)
TRAINED_STRATEGIES = ("bfd", "bfd_split", "wrapped", "multipack")
#: why a strategy has no trained-token figure
KNAPSACK_NOTE = ("LLaMA-Factory cuts a long example's prompt and response separately (infer_seqlen, turn by turn), "
                 "not its end: its trained tokens lost are not simulated")
#: rows measured again per batch for their labels
BATCH_ROWS = 256


@dataclass(frozen=True, eq=False)
class TrainedRuns:
    """The trained positions of some rows of a split, as runs ``[start, end)`` of the loss mask:
    row ``rows[k]`` has runs ``offsets[k]:offsets[k+1]``; ``known[k]`` is False where the row has
    no mask (a template that rewrites earlier turns, or labels that do not match the length)."""

    rows: np.ndarray
    known: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def empty(cls) -> "TrainedRuns":
        z = np.zeros(0, np.int64)
        return cls(z, np.zeros(0, bool), np.zeros(1, np.int64), z, z)

    @classmethod
    def of(cls, masks: dict) -> "TrainedRuns":
        """From ``row -> 0/1 mask`` (None: not known)."""
        rows = np.array(sorted(masks), np.int64)
        known, offsets, starts, ends = [], [0], [], []
        for r in rows.tolist():
            mask = masks[r]
            known.append(mask is not None)
            if mask is not None:
                s, e = runs(mask)
                starts.append(s)
                ends.append(e)
                offsets.append(offsets[-1] + len(s))
            else:
                offsets.append(offsets[-1])
        cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if starts else (lambda _: np.zeros(0, np.int64))
        return cls(rows, np.array(known, bool), np.array(offsets, np.int64), cat(starts), cat(ends))

    def lost(self, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``self.rows``: (trained tokens past ``kept[row]``, trained tokens in all)."""
        counts = np.diff(self.offsets)
        at = np.repeat(kept[self.rows], counts)
        past = np.maximum(self.ends - np.maximum(self.starts, at), 0)
        row_of = np.repeat(np.arange(len(self.rows)), counts)
        lost = np.bincount(row_of, weights=past, minlength=len(self.rows)).astype(np.int64)
        total = np.bincount(row_of, weights=self.ends - self.starts, minlength=len(self.rows)).astype(np.int64)
        return lost, total


def runs(mask) -> tuple[np.ndarray, np.ndarray]:
    """``[start, end)`` of each run of ones in a 0/1 mask."""
    m = np.concatenate([[0], np.asarray(mask, np.int8) != 0, [0]]).astype(np.int8)
    edges = np.diff(m)
    return np.flatnonzero(edges == 1).astype(np.int64), np.flatnonzero(edges == -1).astype(np.int64)


def trained_masks(split_src, setup, rows: np.ndarray, lengths: np.ndarray) -> TrainedRuns:
    """The loss masks of ``rows`` of ``split_src``, measured again with their labels by
    ``setup.chat``; a mask whose length is not the row's measured length (``lengths``) is not known."""
    from lengthscan.measure.batch import measure_batch
    from lengthscan.sources.scan import iter_batches

    rows = np.unique(np.asarray(rows, np.int64))
    if not rows.size:
        return TrainedRuns.empty()
    field = next(f for f in setup.fields if f.kind.trained(f) is not None)
    layout = split_src.layout()
    masks: dict = {}
    for batch in iter_batches(split_src, list(field.columns), indices=rows, batch_rows=BATCH_ROWS,
                              raw=tuple(field.columns)):
        measured = measure_batch(batch, (field,), layout, counter=setup.counter, chat=setup.chat,
                                 with_ids=True)[field.role]
        labels = measured.labels or [None] * len(batch.rows)
        for k, row in enumerate(batch.rows.tolist()):
            lab = labels[k]
            masks[row] = (np.asarray(lab, np.int64) != -100) if lab is not None and len(lab) == lengths[row] else None
    return TrainedRuns.of(masks)


def trained_figures(packs, lengths: np.ndarray, completion: np.ndarray | None, read) -> tuple[dict, TrainedRuns]:
    """The trained tokens ``packs`` lose, and the runs read: ``read(rows)`` gives the ``TrainedRuns``
    of the rows that lose tokens; ``completion`` is each row's trained-token count (-1: none)."""
    lengths = np.maximum(np.asarray(lengths, np.int64), 0)
    losing = np.flatnonzero(packs.lost > 0)
    found = read(losing)
    kept = lengths - packs.lost
    lost, total = found.lost(kept)
    known = found.known
    trained = int(completion[completion > 0].sum()) if completion is not None else None
    n = int(lost[known].sum())
    return {"trained_tokens": trained, "trained_tokens_lost": n,
            "trained_tokens_lost_share": round(n / trained, 6) if trained else 0.0,
            "rows_losing_trained_tokens": int((lost[known] > 0).sum()),
            "rows_losing_every_trained_token": int(((total > 0) & (lost == total) & known).sum()),
            "rows_losing_tokens_without_trained_count": int((~known).sum())}, found


def trained_lost_in(runs: TrainedRuns, lengths: np.ndarray):
    """``packs -> trained tokens they lose`` for a table over L, from the runs read for the chosen L;
    None where a row losing tokens at that L was not read (a smaller L than the chosen one)."""
    lengths = np.maximum(np.asarray(lengths, np.int64), 0)

    def lost_in(packs) -> int | None:
        if not np.isin(np.flatnonzero(packs.lost > 0), runs.rows).all():
            return None
        lost, _ = runs.lost(lengths - packs.lost)
        return int(lost[runs.known].sum())

    return lost_in


def with_trained_losses(largest: list[dict], runs: TrainedRuns, lengths: np.ndarray, packs) -> list[dict]:
    """The rows listed as losing the most tokens, each with the trained tokens it loses (None: no mask)."""
    lengths = np.maximum(np.asarray(lengths, np.int64), 0)
    lost, _ = runs.lost(lengths - packs.lost)
    at = {r: (int(v) if k else None) for r, v, k in zip(runs.rows.tolist(), lost.tolist(), runs.known.tolist())}
    return [dict(e, trained_tokens_lost=at.get(e["row"])) for e in largest]
