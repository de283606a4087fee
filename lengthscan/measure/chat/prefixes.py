"""drop-turns' search: per conversation, the longest prefix ending with an assistant message whose
rendering (rendered again: templates such as Qwen3's render the last turn differently) is within
the row's limit and has a trained token.

No cheaper rule gives that prefix: a template may render any prefix differently (so its length is
not known before it is rendered and tokenized, and need not grow with the prefix), so every prefix
longer than the one kept has to be measured. The search goes from the longest prefix down, in
rounds batched over the rows: a round measures the whole rendering of each open row's next
prefixes (a chunk that doubles each round: ``ChatCounter.sequence_lengths``, no trained tokens),
then measures in full (``ChatCounter.measure``) its longest ones that fit, until one has a trained
token (or ``keep_empty``). Prefixes shorter than the one kept are never rendered, and the result is
the one measuring every prefix gives.

A conversation of thousands of turns far over its limit would still take minutes (the prefixes
add up to quadratic work), so once a row's search has rendered ``SEARCH_TOKENS`` tokens it goes on
by bisection over the prefixes left (about log2 of their number, each measured once), which finds
the longest fitting prefix when longer prefixes render longer (every template but one that drops
earlier content); such a row says so in its reasons (``BISECTED``).
"""

from __future__ import annotations

import numpy as np

#: the tokens a row's exact search may render before it goes on by bisection (about 5 s)
SEARCH_TOKENS = 1_000_000
#: the note of a row whose kept prefix was found by bisection
BISECTED = "drop-turns: found by bisection"


class PrefixSearch:
    """The search over one batch's rows: ``run(ends)``, then ``failure(row, ...)`` for the rows
    without a prefix to keep and ``note(row)`` for those found by bisection."""

    def __init__(self, chat, field, values: dict, caps, keep_empty: bool, *, with_ids: bool):
        self.chat, self.field, self.values, self.caps = chat, field, values, caps
        self.keep_empty, self.with_ids = keep_empty, with_ids
        self.shortest: dict = {}   # row -> its shortest measured prefix (tokens)
        self.empty: set = set()    # rows with a fitting prefix without a trained token
        self.spent: dict = {}      # row -> tokens its exact search rendered
        self.last: dict = {}       # row -> the length of its last prefix measured (tokens)
        self.bisect: dict = {}     # row -> [ends left when bisection began (longest first), lo, hi]

    def run(self, ends: dict) -> dict:
        """``ends``: row -> the message counts of its prefixes ending with an assistant message
        (ascending). Returns row -> (end, Measured, index) of the prefix kept; rows without one
        are left out."""
        pending = {i: list(reversed(e)) for i, e in ends.items() if e}  # not measured yet, longest first
        fits = {i: [] for i in pending}  # measured, within the limit, not yet measured in full; longest first
        chunk, batch = dict.fromkeys(pending, 4), dict.fromkeys(pending, 1)
        open_rows = set(pending)
        found: dict = {}
        while open_rows:
            probes = []
            for i in sorted(open_rows):
                if i in self.bisect:
                    left, lo, hi = self.bisect[i]
                    probes += [(i, left[(lo + hi) // 2])] if lo < hi else []
                elif not fits[i]:
                    take = self._chunk(i, chunk[i])
                    probes += [(i, e) for e in pending[i][:take]]
                    del pending[i][:take]
                    chunk[i] *= 2
            for (i, e), n in zip(probes, self._lengths(probes)):
                n = int(n)
                if n >= 0:
                    self.shortest[i] = min(self.shortest.get(i, n), n)
                fit = 0 <= n <= self.caps[i]
                if i in self.bisect:
                    state = self.bisect[i]
                    mid = (state[1] + state[2]) // 2
                    state[1:] = [state[1], mid] if fit else [mid + 1, state[2]]
                    if state[1] == state[2] and state[2] < len(state[0]):
                        fits[i] = [state[0][state[2]]]
                    continue
                if n >= 0:
                    self.spent[i] = self.spent.get(i, 0) + n
                    self.last[i] = n
                if fit:
                    fits[i].append(e)
            checks = []
            for i in sorted(open_rows):
                if fits[i]:
                    checks += [(i, e) for e in fits[i][:batch[i]]]
                    del fits[i][:batch[i]]
                    batch[i] *= 2
            self._check(checks, found)
            for i in sorted(open_rows):
                if not self._goes_on(i, found, pending[i], fits[i]):
                    open_rows.discard(i)
        return found

    def _goes_on(self, i: int, found: dict, pending: list, fits: list) -> bool:
        """Row ``i``'s search goes on after a round (it may turn to bisection)."""
        if i in found:
            return False
        if i in self.bisect:
            _, lo, hi = self.bisect[i]
            return lo < hi or bool(fits)
        over = self.spent.get(i, 0) > SEARCH_TOKENS
        if over and i in self.empty:  # fitting prefixes without a trained token, and no budget left
            return False
        if fits or not (pending or over):
            return bool(fits)
        if not pending:
            return False
        if over:  # too many prefixes over the limit to measure each: bisect the rest
            self.bisect[i] = [pending, 0, len(pending)]
        return True

    def _chunk(self, i: int, size: int) -> int:
        """The prefixes row ``i``'s next round measures: ``size``, or as many as the budget left
        holds at the length of the last one measured (each is shorter), at least one."""
        last = self.last.get(i, 0)
        if not last:
            return size
        return max(1, min(size, (SEARCH_TOKENS - self.spent.get(i, 0)) // last + 1))

    def _check(self, checks: list, found: dict) -> None:
        """Measure ``checks`` (row, end) in full; the first (longest) of a row with a trained token
        (or any, with ``keep_empty``) is its prefix."""
        if not checks:
            return
        measured = self.chat.measure(self._columns(checks), {s.name: s for s in self.field.specs},
                                     with_ids=self.with_ids)
        spec = {s.name: s for s in self.field.specs}
        completion, sequence = measured.values[spec["completion_tokens"]], measured.values[spec["sequence_tokens"]]
        for k, (i, e) in enumerate(checks):
            if i not in self.bisect:
                self.spent[i] = self.spent.get(i, 0) + max(int(sequence[k]), 0)
            if i in found:
                continue
            # -1 (no count: a template that rewrites earlier turns) is kept, as the decision table keeps it
            if self.keep_empty or int(completion[k]) != 0:
                found[i] = (e, measured, k)
            else:
                self.empty.add(i)

    def failure(self, i: int, cap: int, whole: int, first_exchange: str) -> tuple[str, str]:
        """(reason, detail) of row ``i`` without a prefix to keep (``whole``: its own length)."""
        how = " (found by bisection)" if i in self.bisect else ""
        if i in self.empty:
            why = f"no_trained_tokens (after dropping turns to fit {cap:,} tokens)"
            return why, f"{why}: the longest prefix that fits has no trained token{how}"
        first = self.shortest.get(i, whole)
        return first_exchange, (f"{first_exchange}: the first prefix ending with an assistant message is "
                                f"{int(first):,} tokens, over {cap:,}")

    def note(self, i: int) -> str | None:
        """The reasons' note of a row whose prefix was found by bisection (None: by the exact search)."""
        if i not in self.bisect:
            return None
        return (f"{BISECTED}: its prefixes over the limit add up to over {SEARCH_TOKENS:,} tokens, so the one "
                f"kept is the longest that fits when longer prefixes render longer")

    def _columns(self, owners: list) -> dict:
        column = self.field.column
        columns = {column: [self.values[column][i][:end] for i, end in owners]}
        for extra in self.field.extra:  # the tools of each prefix's row
            columns[extra] = [self.values[extra][i] for i, _ in owners]
        return columns

    def _lengths(self, owners: list) -> np.ndarray:
        return self.chat.sequence_lengths(self._columns(owners)) if owners else np.zeros(0, np.int64)
