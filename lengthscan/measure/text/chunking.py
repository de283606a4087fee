"""Texts cut into runs of bounded characters, so one tokenizer call never holds too much."""

from __future__ import annotations


def chunks(texts: list[str], budget: int):
    """(start, stop) ranges of ``texts`` with at most ``budget`` characters each (>= 1 text)."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        if size and size + len(text) > budget:
            yield start, i
            start, size = i, 0
        size += len(text)
    if start < len(texts):
        yield start, len(texts)
