"""Decide-only counting: is each row within an upper limit, or over it? Proven with as little
tokenizing as the proofs of ``bounds.py`` allow (an upper bound from the normalized text's size, a
lower bound from the pre-tokenizer's pieces, or from a prefix's count); a row neither proven is
counted in full. ``DecideOnly`` is a role's exact strategy with its proof; ``decide_count`` is
``TokenCounter.decide_count``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from lengthscan.measure.records import FLAG_OVER_BOUND, FLAG_OVER_PIECES, FLAG_WITHIN_BOUND
from lengthscan.measure.text.bounds import normalize_fn, safe_cut

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lengthscan.measure.text.bounds import Bounds
    from lengthscan.measure.text.strategies import CountStrategy

#: A prefix of this many characters per allowed token is tried before a full count (English BPE
#: text runs about 4 characters a token: 5 decides nearly every long text at the first prefix).
PREFIX_CHARS_PER_TOKEN = 5

#: exact counts of (texts, rows mask): ``TokenCounter.count_strings`` for one role
RowCount = Callable[[list[str], np.ndarray], np.ndarray]


class DecideOnly:
    """A role's exact strategy with the bounds proven for it: counts as that strategy does (a
    ``CountStrategy``), and decides rows against an upper limit."""

    def __init__(self, proof: Bounds, exact: CountStrategy):
        self.proof = proof
        self.exact = exact
        self.method: str = exact.method
        self.reason: str = exact.reason
        self.backend: Tokenizer | None = exact.backend

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        return self.exact.count(texts, rows)

    def ids(self, texts: list[str]) -> list[list[int]]:
        return self.exact.ids(texts)

    def describe(self) -> dict:
        return self.exact.describe()

    def decide(self, texts: list[str], limit: int, count: RowCount):
        """(lengths, flags, at_least, at_most) of non-empty strings against ``limit``; ``count``
        counts exactly (see ``decide_count``)."""
        n = len(texts)
        lengths, flags = np.full(n, -1, np.int64), np.zeros(n, np.int8)
        at_least, at_most = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        normalize = normalize_fn(self.backend)
        upper = self.proof.upper(texts, normalize)
        rest = []
        for i, ub in enumerate(upper):
            if 0 <= ub <= limit:
                flags[i], at_most[i] = FLAG_WITHIN_BOUND, ub
            else:
                rest.append(i)
        if self.proof.pieces and rest:
            lower = self.proof.pieces_lower([texts[i] for i in rest], limit, normalize)
            over = lower > limit
            chosen = np.asarray(rest)[over]
            flags[chosen], at_least[chosen] = FLAG_OVER_PIECES, lower[over]
            rest = np.asarray(rest)[~over].tolist()
        prefix_decide(texts, rest, count, limit, prefix_ok=self.proof.prefix_ok, lengths=lengths, flags=flags,
                      at_least=at_least, over_flag=FLAG_OVER_BOUND)
        return lengths, flags, at_least, at_most


def decide_count(counter, texts: list, role: str, limit: int):
    """Decide-only counting of ``texts`` in ``role`` against an upper ``limit`` with ``counter`` (a
    ``TokenCounter``): (lengths, flags, at_least, at_most).

    Rows whose proven upper bound is <= ``limit`` get flag ``within_by_bound`` and their bound in
    ``at_most``; rows whose pre-tokenizer pieces already prove more than ``limit`` tokens get
    ``over_by_pieces``, those whose prefix has more than ``limit`` tokens ``over_by_prefix``, each
    with that count in ``at_least``; every other row is counted in full. Without a proof for this
    tokenizer and role (``counter.decider``), every row is counted.
    """
    n = len(texts)
    at_least, at_most = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    strings = [i for i, t in enumerate(texts) if isinstance(t, str) and t and len(t) <= counter.max_chars]
    decider = counter.decider(role, [texts[i] for i in strings[:64]])
    if decider is None:
        lengths, flags = counter.count(texts, role)
        return lengths, flags, at_least, at_most
    # None, "", non-strings and texts over max_chars: exactly as count() treats them
    chosen = set(strings)
    others = [i for i in range(n) if i not in chosen]
    lengths, flags = np.full(n, -1, np.int64), np.zeros(n, np.int8)
    if others:
        lengths[others], flags[others] = counter.count([texts[i] for i in others], role)
    if strings:
        at = np.asarray(strings)
        lengths[at], flags[at], at_least[at], at_most[at] = decider.decide(
            [texts[i] for i in strings], limit, lambda t, rows: counter.count_strings(t, role, rows))
    return lengths, flags, at_least, at_most


def prefix_decide(texts: list, rest: list[int], count, limit: int, *, prefix_ok: bool, lengths, flags, at_least,
                  over_flag: int) -> None:
    """Decide ``texts[i]`` for ``i`` in ``rest`` against ``limit`` with as little counting as the
    proof allows: a long text whose prefix (cut at a safe space) already has more than ``limit``
    tokens is over (``flags[i] = over_flag``, that count in ``at_least``); every other one is
    counted in full into ``lengths``. ``count(list_of_str, rows)`` returns the token counts (``rows``:
    which of them are rows counted in full, not prefixes)."""
    budget = PREFIX_CHARS_PER_TOKEN * (limit + 1)
    cuts = {i: safe_cut(texts[i], budget) for i in rest if prefix_ok and len(texts[i]) > budget}
    cuts = {i: c for i, c in cuts.items() if c}
    # one call for the prefixes and the texts counted in full (short ones), so the tokenizer's
    # threads share one batch; only texts whose prefix stayed within the limit come back
    whole = [i for i in rest if i not in cuts]
    for attempt in range(3):
        if not cuts and not whole:
            break
        rows = np.arange(len(cuts) + len(whole)) >= len(cuts)
        counted = count([texts[i][:c] for i, c in cuts.items()] + [texts[i] for i in whole], rows)
        if whole:
            lengths[np.asarray(whole)] = counted[len(cuts):]
        again, whole = {}, []
        for (i, c), k in zip(cuts.items(), counted[:len(cuts)]):
            if k > limit:
                flags[i], at_least[i] = over_flag, k
                continue
            # this text has more characters per token than most: once, a longer prefix sized
            # by its own ratio when that is still well short of the whole text; else in full
            longer = int(1.25 * (limit + 1) * c / max(int(k), 1)) + 1
            cut = safe_cut(texts[i], longer) if attempt == 0 and 2 * longer < len(texts[i]) else None
            if cut:
                again[i] = cut
            else:
                whole.append(i)
        cuts = again
