"""Rendering and tokenizing overlapped within a batch of conversations.

Rendering a chat template is Python (the main thread: its time budget is a signal there);
tokenizing the renderings is the tokenizer's Rust, which releases the GIL. A batch is rendered a
chunk of rows at a time, and each chunk's renderings are tokenized in a thread while the next
chunk renders, so that a batch takes about the longer of the two instead of their sum. The
renderings are tokenized in their order and the views come back in it: the same views as one call
over the whole batch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

#: rows rendered between two tokenizer calls
CHUNK_ROWS = 64
#: chunks tokenized at once: the tokenizer's calls release the GIL, so a second keeps the other
#: core busy where tokenizing takes longer than rendering
ENCODERS = 2


def plan_and_encode(n: int, plan: Callable[[int, int], dict], texts: list[str], encode: Callable[[list[str]], list],
                    chunk: int = CHUNK_ROWS) -> tuple[dict, list]:
    """(row -> plan, a view per rendering): ``plan(lo, hi)`` renders rows ``lo``..``hi`` (appending
    their renderings to ``texts``); ``encode(renderings)`` tokenizes them (in a thread)."""
    if n <= chunk:
        work = plan(0, n)
        return work, encode(texts)
    work: dict = {}
    futures = []
    with ThreadPoolExecutor(ENCODERS, thread_name_prefix="lengthscan-chat-encode") as pool:
        for lo in range(0, n, chunk):
            start = len(texts)
            work.update(plan(lo, min(n, lo + chunk)))
            if len(texts) > start:
                futures.append(pool.submit(encode, texts[start:]))
        encoded = [view for future in futures for view in future.result()]
    return work, encoded
