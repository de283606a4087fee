"""A rendering's tokens, read per row once it is tokenized: the trained tokens (the assistant
mask, TRL's common-prefix rule, prompt-completion, ``all``) and each message's tokens."""

from __future__ import annotations

import numpy as np

from lengthscan.measure.chat.encoding import rendered_lengths
from lengthscan.measure.chat.metrics import CONTENT_ROLES
from lengthscan.measure.chat.plan import RowPlan
from lengthscan.measure.chat.ranges import message_ranges
from lengthscan.measure.chat.spans import common_prefix, is_prefix


def trained_tokens(w: RowPlan, view, encoded, plain_ids, train_on: str, with_mask: bool):
    """(trained tokens, first, last trained position of the final assistant turn, the 0/1 mask
    when ``with_mask``), or None when the template rewrites earlier turns (no count)."""
    n = len(view)
    every = train_on == "all"
    if w.conv.text is not None or w.conv.split_at is not None:  # prompt-completion: TRL's rule
        prompt = plain_ids[w.pairs[0][0]] if w.conv.text is not None else encoded[w.pairs[0][0]]
        start = 0 if every else common_prefix(prompt.ids, view.ids)
        return n - start, (start if start < n else -1), n - 1, _ones(n, start, n) if with_mask else None
    if every:
        last = len(encoded[w.ref]) - 1 if w.ref >= 0 else -1
        return n, 0, last, _ones(n, 0, n) if with_mask else None
    if w.spans_wanted:
        spans = w.spans[-1:] if train_on == "last" else w.spans
        total, first, last = view.count(spans)
        return total, first, last, view.mask(spans) if with_mask else None
    if w.prefix_error is not None or w.uncounted is not None:
        return None
    mask = np.zeros(n, np.int8)
    last, total = -1, 0
    for p, q in w.pairs:
        q_ids = encoded[q].ids
        if q != w.full and not is_prefix(q_ids, view.ids):
            return None
        start = common_prefix(encoded[p].ids, q_ids) if p >= 0 else 0
        mask[start:len(q_ids)] = 1  # the labels: the union of the turns' trained tokens
        total += len(q_ids) - start  # the count: the rule's sum over the trained turns
        last = len(q_ids) - 1
    hits = np.flatnonzero(mask)
    return total, (int(hits[0]) if hits.size else -1), last, mask


def message_tokens(counter, work: dict, notes: dict, encoded: list) -> dict:
    """row -> the tokens of its longest message; the tokens of each role's messages go to
    ``notes`` (``{role}_tokens``). A message's tokens are the rendering's tokens overlapping its
    text; a text the rendering does not hold as written (or a tokenizer without offsets) is
    tokenized alone, without special tokens."""
    longest: dict = {i: 0 for i in work}
    apart, owners = [], []
    for i, w in work.items():
        for r in CONTENT_ROLES:
            notes[f"{r}_tokens"][i] = 0
        if w.conv.text is not None:
            pieces = [("user", w.conv.text[0]), ("assistant", w.conv.text[1])]
        else:
            view = encoded[w.full]
            pieces = message_ranges(view.text, w.conv.messages) if view.has_offsets else [
                (m.get("role"), m["content"]) for m in w.conv.messages if isinstance(m.get("content"), str)]
        for role, where in pieces:
            if isinstance(where, tuple):
                _add_tokens(i, role, encoded[w.full].overlap(*where), longest, notes)
            elif where:
                apart.append(where)
                owners.append((i, role))
    for (i, role), tokens in zip(owners, rendered_lengths(counter, apart)):
        _add_tokens(i, role, tokens, longest, notes)
    return longest


def _add_tokens(i: int, role, tokens: int, longest: dict, notes: dict) -> None:
    longest[i] = max(longest[i], tokens)
    if role in CONTENT_ROLES:
        notes[f"{role}_tokens"][i] += tokens


def _ones(n: int, start: int, stop: int) -> np.ndarray:
    mask = np.zeros(n, np.int8)
    mask[start:stop] = 1
    return mask
