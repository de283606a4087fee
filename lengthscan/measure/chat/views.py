"""One tokenized rendering, as the chat counter reads it: its length, its ids (only when asked),
the tokens overlapping character ranges, the text of a token.

``EncodingView`` wraps a ``tokenizers.Encoding`` (every fast tokenizer): ranges come from a few
``char_to_token`` calls (``ranges.TokenRanges``) once that is checked to agree with the full offsets
(``exact=True`` reads the offsets themselves; so does a rendering asked for many ranges, a
conversation of many messages, where ``char_to_token``'s scans would add up to quadratic time);
``IdsView`` wraps the ids a Python tokenizer gives
(no offsets: no spans, message tokens counted apart).
"""

from __future__ import annotations

import numpy as np

from lengthscan.measure.chat.ranges import FAST_QUERIES, SlowRanges, TokenRanges, message_ranges, offsets_count


class EncodingView:
    """A rendering's ``Encoding`` and text."""

    has_offsets = True

    def __init__(self, encoding, text: str, *, exact: bool):
        self.enc, self.text, self.exact = encoding, text, exact
        self._ids = None
        self._ranges = None
        self._offsets = None   # the full offsets as an (n, 2) array, converted once
        self._sorted = None    # (token starts sorted, token ends sorted): overlaps by binary search
        self._fast_left = FAST_QUERIES  # ranges still asked of ``char_to_token`` (when not exact)

    def __len__(self) -> int:
        return len(self.enc)

    @property
    def ids(self) -> list:
        if self._ids is None:
            self._ids = self.enc.ids
        return self._ids

    @property
    def ranges(self) -> TokenRanges:
        if self._ranges is None:
            self._ranges = TokenRanges(self.enc, len(self.text))
        return self._ranges

    @property
    def offsets(self) -> np.ndarray:
        """The tokens' (start, end) characters, an (n, 2) array (converted from the encoding once:
        a view is asked for many ranges, one per message)."""
        if self._offsets is None:
            self._offsets = np.asarray(self.enc.offsets, np.int64).reshape(-1, 2)
        return self._offsets

    def count(self, spans) -> tuple[int, int, int]:
        """(tokens overlapping the spans, first, last): the assistant mask's sum and ends."""
        if self._fast(len(spans)):
            try:
                return self.ranges.count(spans)
            except SlowRanges:
                self._fast_left = 0
        return offsets_count(self.offsets, spans)

    def overlap(self, start: int, end: int) -> int:
        """Tokens overlapping characters [start, end)."""
        if self._fast(1):
            try:
                lo, hi = self.ranges.tokens(start, end)
                return hi - lo
            except SlowRanges:
                self._fast_left = 0
        return self._exact_overlap(start, end)

    def _fast(self, ranges: int) -> bool:
        """Ask ``char_to_token`` for ``ranges`` more ranges (not exact, and few asked so far)."""
        if self.exact:
            return False
        if ranges > self._fast_left:
            self._fast_left = 0
            return False
        self._fast_left -= ranges
        return True

    def _exact_overlap(self, start: int, end: int) -> int:
        """#tokens with ``token_end > start`` and ``token_start < end`` from the full offsets, in
        O(log n) per range: n - #(token_end <= start) - #(token_start >= end), both read off sorted
        copies. No token is in both sets when start < end and every token has start <= end (then
        token_start >= end > start >= token_end is impossible); otherwise count token by token."""
        off = self.offsets
        if not off.size:
            return 0
        if self._sorted is None:
            ordered = bool((off[:, 0] <= off[:, 1]).all())
            self._sorted = (np.sort(off[:, 0]), np.sort(off[:, 1])) if ordered else ()
        if start >= end or not self._sorted:
            return int(((off[:, 1] > start) & (off[:, 0] < end)).sum())
        starts, ends = self._sorted
        ended = int(np.searchsorted(ends, start, side="right"))    # token_end <= start
        later = len(starts) - int(np.searchsorted(starts, end, side="left"))  # token_start >= end
        return len(off) - ended - later

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        if not 0 <= position < len(self.enc):
            return False
        if self.exact or self._ids is not None:
            return self.ids[position] == token_id
        return self.ranges.text_of(position, self.text) == token_text

    def mask(self, spans) -> np.ndarray:
        from lengthscan.measure.chat.spans import assistant_mask

        return assistant_mask(self.offsets, spans)


class IdsView:
    """The ids of a tokenizer without encodings (no offsets)."""

    has_offsets = False

    def __init__(self, ids: list):
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        return 0 <= position < len(self.ids) and self.ids[position] == token_id


def ranges_agree(view: EncodingView, spans: list, messages: list) -> bool:
    """``char_to_token``'s token ranges equal the full offsets' on the row's first spans and
    messages (``FAST_QUERIES`` of each: ``char_to_token`` scans the encoding, so a conversation of
    thousands of messages is checked on its first ones, in linear time)."""
    fast = TokenRanges(view.enc, len(view.text))
    spans = [(s, e) for s, e in spans[:FAST_QUERIES]]
    probes = spans + [r for _, r in message_ranges(view.text, messages)[:FAST_QUERIES] if isinstance(r, tuple)]
    try:
        if fast.count(spans) != view.count(spans):
            return False
        for start, end in probes:
            lo, hi = fast.tokens(start, end)
            if hi - lo != view.overlap(start, end):
                return False
    except SlowRanges:  # a range in a long run of characters no token holds: read off the offsets anyway
        pass
    return True


def views(counter, texts: list[str], *, exact: bool) -> list:
    """A view per rendered text."""
    from lengthscan.measure.chat.encoding import rendered_encodings, rendered_ids

    encodings = rendered_encodings(counter, texts)
    if encodings is not None:
        return [EncodingView(e, t, exact=exact) for e, t in zip(encodings, texts)]
    return [IdsView(ids) for ids, _ in rendered_ids(counter, texts)]
