"""Which tokens of a rendered conversation are trained: pure functions on token ids and offsets.

* ``assistant_mask``: transformers' ``return_assistant_tokens_mask`` rule, vectorized: a token is
  marked when it overlaps a generation span (spans and token starts walked forward together, as
  ``apply_chat_template`` does);
* ``common_prefix``: TRL's ``common_prefix_length``: where a completion starts in the tokens of
  prompt + completion, given the tokens of the prompt rendered with the generation prompt;
* ``is_prefix``: whether one token list starts another;
* ``eot_position``: where the end-of-turn token closes the last trained token.
"""

from __future__ import annotations

import numpy as np


def assistant_mask(offsets, spans) -> np.ndarray:
    """0/1 per token: 1 where the token's characters overlap a generation span.

    Exactly the loop of ``apply_chat_template``: the span index only moves forward, past every
    span that ends at or before a token's start; a token is marked when it ends after that span's
    start; once past the last span, no later token is marked.
    """
    n = len(offsets)
    mask = np.zeros(n, np.int8)
    if n == 0 or not spans:
        return mask
    off = np.asarray(offsets, np.int64).reshape(n, 2)
    starts = np.maximum.accumulate(off[:, 0])  # the walk never goes back to an earlier span
    span_starts = np.asarray([s for s, _ in spans], np.int64)
    span_ends = np.asarray([e for _, e in spans], np.int64)
    idx = _walk(starts, span_ends)
    live = idx < len(spans)
    mask[live] = off[live, 1] > span_starts[idx[live]]
    return mask


def _walk(starts: np.ndarray, span_ends: np.ndarray) -> np.ndarray:
    """For each token (starts non-decreasing), the index at which the forward walk ``while idx < len
    and start >= ends[idx]: idx += 1`` stops: the first span ending after the start (the first
    span whose running maximum end is after it)."""
    return np.searchsorted(np.maximum.accumulate(span_ends), starts, side="right")


def common_prefix(a, b) -> int:
    """The number of leading tokens ``a`` and ``b`` share (TRL's ``common_prefix_length``)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def is_prefix(head, whole) -> bool:
    """``head`` is a token prefix of ``whole``."""
    return len(head) <= len(whole) and common_prefix(head, whole) == len(head)


def eot_position(view, last_trained: int, eot_id: int | None, eot_text: str | None) -> int:
    """The position of the end-of-turn token that closes the last trained token (-1: none).

    It is the last trained token itself (templates whose generation block holds it), the token
    after it (the prompt side holds it), or one of the two before it (a template that writes a
    newline after it, which the common-prefix rule trains as part of the turn). ``view`` answers
    ``token_is(position, id, text)``.
    """
    if eot_id is None or last_trained < 0:
        return -1
    for pos in (last_trained, last_trained + 1, last_trained - 1, last_trained - 2):
        if view.token_is(pos, eot_id, eot_text):
            return pos
    return -1
