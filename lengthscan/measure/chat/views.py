"""One tokenized rendering, as the chat counter reads it: its length, its ids (only when asked),
the tokens overlapping character ranges, the text of a token.

``EncodingView`` wraps a ``tokenizers.Encoding`` (every fast tokenizer): ranges come from a few
``char_to_token`` calls (``ranges.TokenRanges``) once that is checked to agree with the full offsets
(``exact=True`` reads the offsets themselves); ``IdsView`` wraps the ids a Python tokenizer gives
(no offsets: no spans, message tokens counted apart).
"""

from __future__ import annotations

import numpy as np

from lengthscan.measure.chat.ranges import TokenRanges, offsets_count


class EncodingView:
    """A rendering's ``Encoding`` and text."""

    has_offsets = True

    def __init__(self, encoding, text: str, *, exact: bool):
        self.enc, self.text, self.exact = encoding, text, exact
        self._ids = None
        self._ranges = None

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

    def count(self, spans) -> tuple[int, int, int]:
        """(tokens overlapping the spans, first, last): the assistant mask's sum and ends."""
        if self.exact:
            return offsets_count(self.enc.offsets, spans)
        return self.ranges.count(spans)

    def overlap(self, start: int, end: int) -> int:
        """Tokens overlapping characters [start, end)."""
        if self.exact:
            off = np.asarray(self.enc.offsets, np.int64).reshape(-1, 2)
            return int(((off[:, 1] > start) & (off[:, 0] < end)).sum()) if off.size else 0
        lo, hi = self.ranges.tokens(start, end)
        return hi - lo

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        if not 0 <= position < len(self.enc):
            return False
        if self.exact or self._ids is not None:
            return self.ids[position] == token_id
        return self.ranges.text_of(position, self.text) == token_text

    def mask(self, spans) -> np.ndarray:
        from lengthscan.measure.chat.spans import assistant_mask

        return assistant_mask(self.enc.offsets, spans)


class IdsView:
    """The ids of a tokenizer without encodings (no offsets)."""

    has_offsets = False

    def __init__(self, ids: list):
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def token_is(self, position: int, token_id: int, token_text: str) -> bool:
        return 0 <= position < len(self.ids) and self.ids[position] == token_id


def views(counter, texts: list[str], *, exact: bool) -> list:
    """A view per rendered text."""
    from lengthscan.measure.chat.encoding import rendered_encodings, rendered_ids

    encodings = rendered_encodings(counter, texts)
    if encodings is not None:
        return [EncodingView(e, t, exact=exact) for e, t in zip(encodings, texts)]
    return [IdsView(ids) for ids, _ in rendered_ids(counter, texts)]
