"""How deep a JSON file's objects and arrays nest, line by line, without parsing it.

``nesting`` reads one line's brackets with a regex that skips strings whole (the reference).
``first_deep_line`` answers for a whole file: a file whose text holds many brackets (code, man
pages) is read in blocks of whole lines, and each block's strings and brackets are found with
numpy, no Python per line. A quote opens or closes a string unless a run of an odd number of
backslashes, inside a string, comes before it; a block where some backslash lies outside every
string (no valid JSON has one: there a quote's meaning depends on the scan) is read with
``nesting`` instead, so both ways give the same lines.
"""

from __future__ import annotations

import io
import re

import numpy as np

#: The tokens that nest (and the strings, skipped whole, that may hold them as text).
TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)  # linear: nothing to backtrack

#: Bytes of whole lines read at a time.
_BLOCK = 8 << 20


def nesting(raw: bytes, depth: int = 0) -> tuple[int, int]:
    """(deepest level reached, level at the end) of one line's brackets, from ``depth``."""
    top = depth
    for token in TOKENS.findall(raw):
        if token in (b"[", b"{"):
            depth += 1
            top = max(top, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return top, depth


def first_deep_line(open_stream, limit: int) -> int | None:
    """The first line (from 1) at which the file's objects and arrays nest more than ``limit``
    levels (for a JSON array file, inside its outer array); None when none does."""
    depth, extra, first = 0, None, 1
    with io.BufferedReader(open_stream()) as fh:
        while True:
            block = fh.read(_BLOCK)
            if not block:
                return None
            if not block.endswith(b"\n"):
                block += fh.readline()  # whole lines only
            if extra is None:
                head = block.lstrip()
                if head:
                    extra = 1 if head[:1] == b"[" else 0  # a JSON array file's own brackets
            found, depth = _block(block, depth, limit + (extra or 0))
            if found is not None:
                return first + found
            first += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def deep_line_in(lines: bytes, limit: int) -> int | None:
    """The index (from 0) of the first of ``lines`` (whole lines of a JSON Lines file) whose
    objects and arrays nest more than ``limit`` levels; None when none does."""
    return _block(lines, 0, limit)[0]


def _block(block: bytes, depth: int, limit: int) -> tuple[int | None, int]:
    """(index of the first line of ``block`` that reaches past ``limit``, or None; the depth at its end)."""
    data = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(data == 10)  # line i ends at ends[i] (the last may end without one)
    quotes = np.flatnonzero(data == 34)
    slashes = np.flatnonzero(data == 92)
    if quotes.size and slashes.size:  # a quote after an odd run of backslashes is escaped (inside a string)
        follows = np.zeros(quotes.size, bool)
        follows[quotes > 0] = data[quotes[quotes > 0] - 1] == 92
        after = quotes[follows]
        first = np.ones(slashes.size, bool)
        first[slashes > 0] = data[slashes[slashes > 0] - 1] != 92
        starts = slashes[first]  # where each run of backslashes begins
        runs = after - starts[np.searchsorted(starts, after - 1, side="right") - 1]
        escaped = np.zeros(quotes.size, bool)
        escaped[np.flatnonzero(follows)[runs % 2 == 1]] = True
        quotes = quotes[~escaped]
    if not _inside(slashes, quotes, ends).all():  # a backslash outside strings, no JSON: the regex decides
        return _by_regex(block, depth, limit)
    brackets = np.flatnonzero((data == 91) | (data == 93) | (data == 123) | (data == 125))
    brackets = brackets[~_inside(brackets, quotes, ends)]
    if not brackets.size:
        return None, depth
    kinds = data[brackets]
    step = np.where((kinds == 91) | (kinds == 123), 1, -1)
    levels = depth + np.cumsum(step)
    over = np.flatnonzero((step > 0) & (levels > limit))
    if over.size:
        return int(np.searchsorted(ends, brackets[over[0]])), int(levels[-1])
    return None, int(levels[-1])


def _inside(points: np.ndarray, quotes: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which ``points`` lie inside a string: an odd number of the line's quotes before them (a
    string left open runs to the end of its line)."""
    if not points.size or not quotes.size:
        return np.zeros(points.size, bool)
    line_start = np.concatenate(([0], ends + 1))
    before = np.searchsorted(quotes, points)  # quotes before each point, in the block
    line = np.searchsorted(ends, points)
    at_line = np.searchsorted(quotes, line_start[line])  # quotes before the point's line
    return (before - at_line) % 2 == 1


def _by_regex(block: bytes, depth: int, limit: int) -> tuple[int | None, int]:
    for i, raw in enumerate(block.split(b"\n")):
        top, depth = nesting(raw, depth)
        if top > limit:
            return i, depth
    return None, depth
