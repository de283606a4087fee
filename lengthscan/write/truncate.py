"""Cut texts over a token limit to the longest prefix we can find that re-tokenizes within it.

The kept text is always a prefix of the original whose length, measured by the same call as
every length (``tokenizer(x)`` for inputs, ``tokenizer(text_target=x)`` for targets, special
tokens included, so a target keeps its EOS), is verified to be within the limit. Token offsets only
*propose* cut points: a byte-level token can end inside a multi-byte character, normalizers (NFKC,
lowercasing, whitespace folding) change counts, and BPE merges differently at a prefix's end, so
every candidate is re-tokenized, and counts are not monotone in prefix length, so no blind
binary search.

Algorithm, per text over its limit (all texts in one batch, one verification call per round):

1. **Cut points.** Fast tokenizers: the text (a window of it, widened x4 until it holds enough
   tokens) is tokenized once with ``return_offsets_mapping=True, add_special_tokens=False`` in the
   role's own mode (``text_target=`` for targets, so tokenizers with a target mode use it). Every
   token start and end offset is a cut point; offsets are character indices, so any cut is a valid
   ``str`` prefix. A cut's estimate is the number of tokens starting before it.
2. **Bracket search on verified counts.** ``lo`` is the longest tested prefix that fits (at first
   the empty one), ``hi`` the shortest tested one above ``lo`` that does not (at first the whole
   text). Each round tests a few untested cut points between them around the estimate that
   interpolates ``lo``'s and ``hi``'s real counts to the limit (the first round: the guess and the
   cuts just before and after it, since a longer prefix may fit too). The search ends when no cut point
   lies between ``lo`` and ``hi``: the kept prefix fits and the next cut point after it does not.
3. **Bounded.** At most ``MAX_CANDIDATES`` prefixes are tokenized per text; if none fitted by then,
   halvings of the shortest failing prefix are tried, and the empty prefix (checked to fit first;
   if it does not, ``TruncationError``) is the last resort, so it always terminates.

**Slow tokenizers without offsets** (``MarianTokenizer`` ...): the cut points are word ends
(before each whitespace run), estimated with the text's own characters-per-token ratio; once
the bracket closes between two word ends, every character boundary inside that word becomes a
cut point (text without spaces goes straight to characters). Same search, same verification.

Guarantee: the result is a prefix, fits (verified), and is locally longest: the next cut point
after it (a token boundary of the full text; a character for slow tokenizers) was verified not
to fit, unless the candidate budget ran out. Texts longer than the counter's ``max_chars`` are
searched within their first ``max_chars`` characters (longer prefixes cannot be counted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: Candidate prefixes tokenized per text before the search gives up (then halvings, then "").
MAX_CANDIDATES = 64
#: Candidates per text in the first round (the guess, one before, one after) and in later rounds.
FIRST_ROUND = 3
ROUND = 6
#: Offsets are taken on a window of this many characters per token of budget (x4 while too short),
#: so a 1 MB document cut to 512 tokens is not tokenized whole with offsets.
WINDOW_CHARS_PER_TOKEN = 16
WINDOW_MIN_CHARS = 1024
WINDOW_MARGIN = 8

_WORD = re.compile(r"\S+")


class TruncationError(ValueError):
    """The limit leaves no room for text: even the empty string is over it."""


@dataclass(frozen=True)
class Truncated:
    """A kept prefix of a text, its verified token length, and how many prefixes were tokenized."""

    text: str
    tokens: int
    retokenized: int


def truncate_texts(counter, texts: list[str], limits, role: str) -> list[Truncated]:
    """The longest prefix found of each text whose ``role`` length is within its limit.

    ``counter`` is a ``lengthscan.measure.text.counter.TokenCounter``; ``limits`` holds one limit per text (or
    one for all). Texts within their limit come back unchanged with ``retokenized == 0``.
    """
    n = len(texts)
    limits = np.broadcast_to(np.asarray(limits, dtype=np.int64), (n,))
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"position {i}: {type(text).__name__} is not text; only texts can be truncated")
    counts, _ = counter.count(texts, role)
    out: list[Truncated | None] = [
        Truncated(t, int(c), 0) if 0 <= c <= lim else None for t, c, lim in zip(texts, counts, limits)]
    over = [i for i in range(n) if out[i] is None]
    if not over:
        return out
    empty = int(counter.count([""], role)[0][0])
    low = min(over, key=lambda i: limits[i])
    if limits[low] < empty:
        raise TruncationError(f"{role} limit {limits[low]} is below the {empty} tokens of the empty text "
                              f"(special tokens): nothing fits")

    # Texts the counter will not count whole (over max_chars) are searched within their head.
    heads = {i: texts[i][:counter.max_chars] for i in over}
    cut_short = [i for i in over if counts[i] < 0]
    head_counts = {i: int(counts[i]) for i in over}
    if cut_short:
        for i, c in zip(cut_short, counter.count([heads[i] for i in cut_short], role)[0]):
            head_counts[i] = int(c)
            if c <= limits[i]:
                out[i] = Truncated(heads[i], int(c), 1)
    todo = [i for i in over if out[i] is None]
    searches = _searches(counter, {i: heads[i] for i in todo}, {i: int(limits[i]) for i in todo},
                         head_counts, empty, role)
    _run(counter, searches, role)
    for i, s in searches.items():
        out[i] = Truncated(s.text[:s.lo], s.tested[s.lo], s.spent + (i in cut_short))  # + the head's count
    return out


class _Search:
    """Bracket search over one text's cut points; ``tested`` maps a cut to its verified count."""

    def __init__(self, text: str, limit: int, cuts: np.ndarray, est: np.ndarray, empty: int,
                 full: int, full_est: float | None, ratio: float | None = None):
        self.text, self.limit, self.ratio = text, limit, ratio
        self.cuts, self.est = cuts, est
        self.tested = {0: empty, len(text): full}
        self.est_at = {0: 0.0, len(text): full_est}
        self.lo, self.hi = 0, len(text)
        self.spent, self.rounds, self.halved = 0, 0, False

    def record(self, cut: int, count: int, est: float | None) -> None:
        self.tested[cut] = count
        self.est_at[cut] = est
        self.spent += 1
        self.lo = max(c for c, k in self.tested.items() if k <= self.limit)
        self.hi = min(c for c, k in self.tested.items() if c > self.lo and k > self.limit)

    def candidates(self) -> list[tuple[int, float | None]]:
        """The next cuts to test with their estimates; empty when the search is over."""
        if self.spent >= MAX_CANDIDATES:
            return self._halvings()
        lo, hi = self.lo, self.hi
        a, b = np.searchsorted(self.cuts, lo, "right"), np.searchsorted(self.cuts, hi, "left")
        if a == b and self.ratio is not None and hi - lo > 1:
            # slow tokenizers: the bracket closed between two word ends, now try the characters
            self.cuts = np.arange(lo + 1, hi, dtype=np.int64)
            self.est, self.ratio = self.cuts * self.ratio, None
            a, b = 0, len(self.cuts)
        if a == b:
            return []
        k = FIRST_ROUND if self.rounds == 0 else ROUND
        self.rounds += 1
        est = self.est[a:b]
        j = int(np.searchsorted(est, self._target(), "right")) - 1
        start = min(max(j - max(1, (k - 2) // 2), 0), max(len(est) - k, 0))
        return [(int(c), float(e)) for c, e in zip(self.cuts[a:b][start:start + k], est[start:start + k])]

    def _target(self) -> float:
        """The estimate at which the count should reach the limit, from lo's and hi's real counts."""
        e_lo, n_lo = self.est_at[self.lo], self.tested[self.lo]
        e_hi, n_hi = self.est_at.get(self.hi), self.tested[self.hi]
        if e_lo is None:  # lo came from a halving: no estimate, aim just above it
            return -np.inf
        if e_hi is not None and n_lo < n_hi:
            return e_lo + (self.limit - n_lo) * (e_hi - e_lo) / (n_hi - n_lo)
        return e_lo + (self.limit - n_lo)

    def _halvings(self) -> list[tuple[int, float | None]]:
        if self.halved or self.lo > 0:
            return []
        self.halved = True
        cuts = {self.hi >> s for s in range(1, self.hi.bit_length())} - set(self.tested)
        return [(c, None) for c in sorted(cuts, reverse=True) if c > 0]


def _run(counter, searches: dict[int, _Search], role: str) -> None:
    """Rounds of candidates, each verified in one batched count, until every search is over."""
    active = list(searches)
    while active:
        batch = [(i, c, e) for i in active for c, e in searches[i].candidates()]
        if not batch:
            return
        counts, _ = counter.count([searches[i].text[:c] for i, c, _ in batch], role)
        for (i, c, e), n in zip(batch, counts):
            searches[i].record(c, int(n), e)
        active = sorted({i for i, _, _ in batch})


def _searches(counter, heads: dict[int, str], limits: dict[int, int], counts: dict[int, int],
              empty: int, role: str) -> dict[int, _Search]:
    """A search per text, with cut points from offsets when the tokenizer gives them."""
    offsets = _offset_cuts(counter.tokenizer, heads, limits, empty, role) if heads else None
    out = {}
    for i, text in heads.items():
        if offsets is not None:
            cuts, est, full_est = offsets[i]
            out[i] = _Search(text, limits[i], cuts, est, empty, counts[i], full_est)
        else:
            # chars-per-token ratio of this text; content tokens only (special ones are in `empty`)
            ratio = max(counts[i] - empty, 1) / max(len(text), 1)
            cuts = np.array([m.end() for m in _WORD.finditer(text) if m.end() < len(text)], dtype=np.int64)
            out[i] = _Search(text, limits[i], cuts, cuts * ratio, empty, counts[i],
                             float(counts[i] - empty), ratio=ratio)
    return out


def _offset_cuts(tok, heads: dict[int, str], limits: dict[int, int], empty: int, role: str):
    """Per text: (cut points, their estimates, the whole text's estimate if it was all tokenized),
    or None when the tokenizer gives no offsets."""
    if not getattr(tok, "is_fast", False):
        return None
    window = {i: min(len(t), max(WINDOW_MIN_CHARS, WINDOW_CHARS_PER_TOKEN * (limits[i] - empty + WINDOW_MARGIN)))
              for i, t in heads.items()}
    out, todo = {}, list(heads)
    while todo:
        mappings = _offsets(tok, [heads[i][:window[i]] for i in todo], role)
        if mappings is None:
            return None
        widen = []
        for i, mapping in zip(todo, mappings):
            size, covered = window[i], window[i] >= len(heads[i])
            if not covered and len(mapping) <= limits[i] - empty + WINDOW_MARGIN:
                window[i] = min(4 * size, len(heads[i]))
                widen.append(i)
                continue
            spans = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
            cuts = np.unique(spans)
            cuts = cuts[(cuts > 0) & (cuts < len(heads[i]))]
            est = np.searchsorted(np.sort(spans[:, 0]), cuts, "left").astype(float)
            out[i] = (cuts, est, float(len(spans)) if covered else None)
        todo = widen
    return out


def _offsets(tok, windows: list[str], role: str):
    """Offsets of the content tokens of each window, in the role's mode; None if not given."""
    kwargs = {"return_offsets_mapping": True, "add_special_tokens": False}
    try:
        enc = tok(text_target=windows, **kwargs) if role == "target" else tok(windows, **kwargs)
    except NotImplementedError:
        return None
    return enc.get("offset_mapping")


def truncate_rows(table, fields, counter, truncate_to: dict, final: dict):
    """``table`` with each text to truncate replaced by its verified prefix. ``truncate_to`` is the
    decisions' role -> cap per row (-1: none); ``final`` (measurement -> values) gets the new lengths."""
    import pyarrow as pa

    for f in fields:
        caps = truncate_to.get(f.role)
        if not f.kind.truncates or caps is None:
            continue
        idx = np.flatnonzero((caps >= 0) & (final[f.primary.name] > caps))
        if idx.size == 0:
            continue
        texts = table.column(f.column).to_pylist()
        with counter.aside():  # these rows were measured already: prefixes and recounts are no rows
            done = truncate_texts(counter, [texts[i] for i in idx], caps[idx], f.role)
        for i, t in zip(idx, done):
            texts[i] = t.text
            final[f.primary.name][i] = t.tokens
        position = table.schema.get_field_index(f.column)
        table = table.set_column(position, f.column, pa.array(texts, table.schema.field(f.column).type))
    return table
