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


def overlapped(n: int, texts_of: Callable[[range], tuple], tokenize: Callable, chunk: int = CHUNK_ROWS,
               workers: int = ENCODERS):
    """``(jobs, tokenize(texts))`` for each chunk of ``n`` rows, in order: ``texts_of(rows)`` returns a
    chunk's ``(texts, jobs)``, rendered here, while earlier chunks' texts are tokenized in ``workers``
    threads."""
    if n <= chunk:
        texts, jobs = texts_of(range(n))
        yield jobs, tokenize(texts)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="lengthscan-encode") as pool:
        pending = []
        for lo in range(0, n, chunk):
            texts, jobs = texts_of(range(lo, min(n, lo + chunk)))
            pending.append((jobs, pool.submit(tokenize, texts)))
        for jobs, future in pending:
            yield jobs, future.result()


def plan_and_encode(n: int, plan: Callable[[int, int], dict], texts: list[str], encode: Callable[[list[str]], list],
                    chunk: int = CHUNK_ROWS) -> tuple[dict, list]:
    """(row -> plan, a view per rendering): ``plan(lo, hi)`` renders rows ``lo``..``hi`` (appending
    their renderings to ``texts``); ``encode(renderings)`` tokenizes them (in a thread)."""
    def texts_of(rows: range) -> tuple:
        start = len(texts)
        work = plan(rows.start, rows.stop)
        return texts[start:], work

    work: dict = {}
    encoded: list = []
    for part, views in overlapped(n, texts_of, lambda rendered: encode(rendered) if rendered else [], chunk):
        work.update(part)
        encoded += views
    return work, encoded
