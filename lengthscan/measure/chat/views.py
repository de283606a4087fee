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
        if self._sorted is None:
            self._sorted = SortedOffsets(self.offsets)
        return self._sorted.overlap(start, end)

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        if not 0 <= position < len(self.enc):
            return False
        if self.exact or self._ids is not None:
            return self.ids[position] == token_id
        return self.ranges.text_of(position, self.text) == token_text

    def mask(self, spans) -> np.ndarray:
        from lengthscan.measure.chat.spans import assistant_mask

        return assistant_mask(self.offsets, spans)


class TiledView:
    """A rendering's tokens as the count-only engine tiles it (``countbpe/tiling.py``): codes
    and the tokenizer's offsets, proven equal to the tokenizer's on the run's first renderings."""

    has_offsets = True

    def __init__(self, codes: np.ndarray, offsets: np.ndarray, text: str, tiler):
        self.codes, self.offsets, self.text = codes, offsets, text
        self._tiler = tiler
        self._sorted = None

    def __len__(self) -> int:
        return len(self.codes)

    @property
    def ids(self) -> np.ndarray:
        """The tokens' identities for comparing renderings (TRL's common-prefix rule): the engine's
        codes, equal exactly where the tokenizer's ids are (one code a token's bytes, one an added
        token); never written out (a run that writes ids tokenizes with the tokenizer)."""
        return self.codes

    def count(self, spans) -> tuple[int, int, int]:
        return offsets_count(self.offsets, spans)

    def overlap(self, start: int, end: int) -> int:
        if self._sorted is None:
            self._sorted = SortedOffsets(self.offsets)
        return self._sorted.overlap(start, end)

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        code = self._tiler.code_of(token_text)
        return code is not None and 0 <= position < len(self.codes) and int(self.codes[position]) == code

    def occurrences(self, token_text: str) -> int:
        """How many of the tokens are the added token ``token_text``."""
        code = self._tiler.code_of(token_text)
        return 0 if code is None else int(np.count_nonzero(self.codes == code))

    def mask(self, spans) -> np.ndarray:
        from lengthscan.measure.chat.spans import assistant_mask

        return assistant_mask(self.offsets, spans)


class SortedOffsets:
    """Tokens overlapping character ranges, read off sorted copies of the full offsets."""

    def __init__(self, offsets: np.ndarray):
        self.off = offsets
        ordered = bool((offsets[:, 0] <= offsets[:, 1]).all()) if offsets.size else False
        starts, ends = offsets[:, 0], offsets[:, 1]
        if ordered and bool((starts[1:] >= starts[:-1]).all() and (ends[1:] >= ends[:-1]).all()):
            self._sorted = (starts, ends)  # in order already (the tokens of a left-to-right split)
        else:
            self._sorted = (np.sort(starts), np.sort(ends)) if ordered else ()

    def overlap(self, start: int, end: int) -> int:
        """#tokens with ``token_end > start`` and ``token_start < end``, in O(log n) per range:
        n - #(token_end <= start) - #(token_start >= end), both read off sorted copies. No token
        is in both sets when start < end and every token has start <= end (then token_start >= end
        > start >= token_end is impossible); otherwise count token by token."""
        off = self.off
        if not off.size:
            return 0
        if start >= end or not self._sorted:
            return int(((off[:, 1] > start) & (off[:, 0] < end)).sum())
        starts, ends = self._sorted
        ended = int(np.searchsorted(ends, start, side="right"))    # token_end <= start
        later = len(starts) - int(np.searchsorted(starts, end, side="left"))  # token_start >= end
        return len(off) - ended - later


def tiled(tiler, texts: list[str]) -> list:
    """A ``TiledView`` per text, or None where the engine leaves the text to the tokenizer."""
    return [None if got is None else TiledView(got[0], got[1], text, tiler)
            for text, got in zip(texts, tiler.offsets(texts))]


def parts_from(tiled_views: list, encodings: list, eot_id: int | None, eot_text: str | None) -> int | None:
    """The first rendering where tiled views part from the tokenizer's (its length, offsets, or
    where its end-of-turn tokens are), None where they agree."""
    for k, (mine, enc) in enumerate(zip(tiled_views, encodings)):
        if mine is None:
            continue
        if len(mine) != len(enc) or not np.array_equal(mine.offsets, np.asarray(enc.offsets, np.int64).reshape(-1, 2)):
            return k
        if eot_id is not None:
            theirs = np.flatnonzero(np.asarray(enc.ids) == eot_id)
            if theirs.size != mine.occurrences(eot_text) or not all(mine.token_is(int(p), eot_id, eot_text)
                                                                    for p in theirs):
                return k
    return None


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
