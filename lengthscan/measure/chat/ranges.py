"""Token ranges of character ranges of a rendering, read off the tokenizer's own ``Encoding``.

A trained span or a message is a character range of the rendered text; what is counted is the
tokens overlapping it (the rule of ``return_assistant_tokens_mask``). Asking the ``Encoding`` for
the token at a few characters (``char_to_token``, ``token_to_chars``: Rust calls) answers that
without converting every token's offsets to Python, which costs more than tokenizing. It assumes
token offsets that grow with the token index; ``ChatCounter`` checks it against the full offsets
on the first rows of a run (and counts from offsets when it does not hold).

``char_to_token`` scans the encoding's tokens (its cost grows with the token's position), so this
is for a few ranges of a rendering: ``views.EncodingView`` reads the full offsets (once, then binary
searches) past ``FAST_QUERIES`` ranges, and when a range starts in a run of more than ``MAX_GAP``
characters no token holds (``SlowRanges``).
"""

from __future__ import annotations

import numpy as np

#: ranges of one rendering asked of ``char_to_token`` before its full offsets are read instead
FAST_QUERIES = 64
#: characters no token holds that ``_first_from`` steps over before it gives up (``SlowRanges``)
MAX_GAP = 64


class SlowRanges(Exception):
    """A range starts in a long run of characters no token holds: read the full offsets instead."""


class TokenRanges:
    """Which tokens of one encoding overlap character ranges of its text."""

    def __init__(self, encoding, length: int):
        self.enc = encoding
        self.length = length
        self.n = len(encoding)

    def _first_from(self, char: int):
        """The first token holding a character at or after ``char`` (None: none)."""
        enc, length = self.enc, self.length
        stop = char + MAX_GAP
        while char < length:
            t = enc.char_to_token(char)
            if t is not None:
                return t
            char += 1
            if char > stop:
                raise SlowRanges
        return None

    def tokens(self, start: int, end: int) -> tuple[int, int]:
        """[lo, hi): the tokens overlapping characters [start, end)."""
        lo = self._first_from(start)
        if lo is None:
            return self.n, self.n
        t = self._first_from(end)
        if t is None:
            return lo, self.n
        return lo, (t + 1 if self.enc.token_to_chars(t)[0] < end else t)

    def count(self, spans) -> tuple[int, int, int]:
        """(tokens overlapping any span, first such token or -1, last such token or -1); spans in order."""
        total, first, last, reach = 0, -1, -1, 0
        for start, end in spans:
            lo, hi = self.tokens(start, end)
            lo = max(lo, reach)
            if hi > lo:
                total += hi - lo
                first = lo if first < 0 else first
                last, reach = hi - 1, hi
        return total, first, last

    def text_of(self, token: int, text: str) -> str | None:
        if not 0 <= token < self.n:
            return None
        start, end = self.enc.token_to_chars(token)
        return text[start:end]


def offsets_count(offsets, spans) -> tuple[int, int, int]:
    """``TokenRanges.count`` from the full offsets (the reference it is checked against)."""
    from lengthscan.measure.chat.spans import assistant_mask

    mask = assistant_mask(offsets, spans)
    hits = np.flatnonzero(mask)
    if not hits.size:
        return 0, -1, -1
    return int(hits.size), int(hits[0]), int(hits[-1])


def message_ranges(text: str, messages: list) -> list:
    """Per message with text content: (role, (start, end) of that text in the rendering, or the
    text itself when the rendering does not hold it as written)."""
    spans = content_spans(text, messages)
    return [(messages[k].get("role"), found if found is not None else content) for k, (content, found) in spans.items()]


def content_spans(text: str, messages: list) -> dict:
    """Message index -> (its text content, (start, end) of it in the rendering or None), for the
    messages with text content, found in message order (as written, else stripped)."""
    out, cursor = {}, 0
    for k, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                              and isinstance(p.get("text"), str))
        if not isinstance(content, str) or not content:
            continue
        found = None
        for needle in (content, content.strip()):
            if not needle:
                continue
            pos = text.find(needle, cursor)
            if pos >= 0:
                found = (pos, pos + len(needle))
                cursor = pos + len(needle)
                break
        out[k] = (content, found)
    return out
