"""``clean --tokenize``: ``input_ids``/``attention_mask``/``labels`` columns, each checked against
the row's measured length."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa

#: The columns ``--tokenize`` adds (a source that has one of them is refused).
TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels")


def id_lists(ids: list) -> tuple:
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


def add_token_columns(kept: pa.Table, fields, counter, lengths: dict, given: dict, changed: np.ndarray) -> pa.Table:
    """``kept`` with the token columns as the tokenizer's ``__call__`` gives them: the ids measuring
    gave (``given``, role -> ids per kept row) where the text is unchanged, a tokenization of the
    truncated text (or of every text, without them). ``lengths`` (measurement -> values per kept
    row) are what each must match: a mismatch refuses to write inconsistent data."""
    for f in fields:
        if not f.kind.truncates:
            continue
        ids = given.get(f.role)
        todo = range(kept.num_rows) if ids is None else np.flatnonzero(changed)
        ids = list(ids) if ids is not None else [None] * kept.num_rows
        if len(todo):
            texts = kept.column(f.column).to_pylist()
            for i, row in zip(todo, counter.ids([texts[i] for i in todo], f.role)):
                ids[i] = row
        expected = lengths[f.primary.name]
        bad = next((i for i, (a, n) in enumerate(zip(ids, expected)) if len(a) != n), None)
        if bad is not None:
            raise RuntimeError(f"--tokenize: {f.column} of a kept row gives {len(ids[bad])} ids, "
                               f"measured {expected[bad]}: refusing to write inconsistent data")
        column, mask = id_lists(ids)
        if f.role == "target":
            kept = kept.append_column("labels", column)
        else:
            kept = kept.append_column("input_ids", column)
            kept = kept.append_column("attention_mask", mask)
    return kept


def token_features(fields) -> dict:
    """The features of the token columns for the text roles of ``fields``."""
    from lengthscan.sources.features import list_of, value

    roles = {f.role for f in fields if f.kind.truncates}
    out = {}
    if "input" in roles:
        out["input_ids"] = list_of(value("int32"))
        out["attention_mask"] = list_of(value("int8"))
    if "target" in roles:
        out["labels"] = list_of(value("int32"))
    return out


#: which measurement each preference id column's length must equal
PAIR_LENGTHS = {"prompt_ids": "prompt_tokens", "chosen_ids": "chosen_tokens", "rejected_ids": "rejected_tokens"}


def cut_pairs(caps: np.ndarray, final: dict) -> None:
    """A DPO pair cut to ``caps`` (-1: not cut) keeps each sequence's first tokens: its answers
    shortened, its prompt whole (a prompt that fills the cap was dropped instead)."""
    cut = caps >= 0
    if not cut.any():
        return
    prompt = final["prompt_tokens"][cut]
    for side in ("chosen_tokens", "rejected_tokens"):
        final[side][cut] = np.minimum(final[side][cut], caps[cut] - prompt)
    longer = prompt + np.maximum(final["chosen_tokens"][cut], final["rejected_tokens"][cut])
    final["sequence_tokens"][cut], final["pair_tokens"][cut] = longer, 2 * longer


def pair_columns(kept: pa.Table, names: tuple, rows: list, lengths: dict, cut: np.ndarray | None = None) -> pa.Table:
    """``kept`` with a preference trainer's prepared id columns (``names``: each row's tuple of ids in
    ``rows``; the ``cut`` rows' answers shortened to their lengths after truncation), each checked
    against the row's length (RewardTrainer's sides are whole sequences: checked against the chosen
    and rejected tokens the same way)."""
    for k, name in enumerate(names):
        ids = [row[k] for row in rows]
        if cut is not None and name != "prompt_ids":
            expected = lengths[PAIR_LENGTHS[name]]
            ids = [a[:expected[i]] if cut[i] else a for i, a in enumerate(ids)]
        expected = lengths[PAIR_LENGTHS[name]]
        bad = next((i for i, (a, n) in enumerate(zip(ids, expected)) if len(a) != n), None)
        if bad is not None:
            raise RuntimeError(f"--tokenize: {name} of a kept pair has {len(ids[bad])} ids, measured {expected[bad]}: "
                               "refusing to write inconsistent data")
        kept = kept.append_column(name, id_lists(ids)[0])
    return kept

