"""What every format's reader yields, and the pieces the readers share: ``Batch`` (rows with their
identity, their position in the split), batches cut from a stream of record batches, a read-ahead thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lengthscan.sources import arrays

#: Rows per batch handed to the measure step (the tokenizer threads over a batch).
BATCH_ROWS = 2048
#: At most this many read tasks per stream file (JSON Lines, CSV): each streams it up to its span's end.
STREAM_PIECES = 8


@dataclass(frozen=True, eq=False)
class Batch:
    """Rows of one split: their global positions and the requested columns."""

    rows: np.ndarray
    table: pa.RecordBatch
    #: column -> the rows' values as the JSON Lines file holds them (``json.loads``, not pyarrow's
    #: typed reading, which unifies a column's types across rows); for the ``raw`` columns asked
    raw: dict | None = None


def wanted_rows(part, indices: np.ndarray | None, span: tuple[int, int] | None) -> np.ndarray | None:
    """The split's row positions to read from ``part``: ``indices`` (sorted, global) within the part
    and its local ``span`` (lo, hi), or None for every row of the part."""
    lo, hi = span if span is not None else (0, part.rows)
    whole = lo == 0 and hi == part.rows
    if indices is None:
        return None if whole else np.arange(part.start + lo, part.start + hi, dtype=np.int64)
    a, b = np.searchsorted(indices, [part.start + lo, part.start + hi])
    return indices[a:b]


def sliced(part, batches, wanted: np.ndarray | None, batch_rows: int, lines=None, *,
           stop: bool = False) -> Iterator[Batch]:
    """A part's record batches, read front to back, cut to ``batch_rows`` (or to its ``wanted`` rows;
    ``stop``: the reading ends after the last of them, for a read task of a span of the part)."""
    offset = part.start
    for rb in batches:
        if wanted is None:
            for k in range(0, rb.num_rows, batch_rows):
                piece = rb.slice(k, batch_rows)
                rows = np.arange(offset + k, offset + k + piece.num_rows, dtype=np.int64)
                yield Batch(rows, piece, lines.take(rows - part.start) if lines else None)
        else:
            lo, hi = np.searchsorted(wanted, [offset, offset + rb.num_rows])
            take = wanted[lo:hi]
            for k in range(0, take.size, batch_rows):
                chunk = take[k:k + batch_rows]
                yield Batch(chunk, rb.take(arrays.numeric(chunk - offset, pa.int64())),
                            lines.take(chunk - part.start) if lines else None)
        offset += rb.num_rows
        if stop and wanted is not None and (not wanted.size or offset > wanted[-1]):
            return  # past the last row asked: the rest of the file is not read
    if offset != part.start + part.rows:
        raise RuntimeError(f"read {offset - part.start} rows of {part.path}, expected {part.rows}")


def read_ahead(work: Callable, items: Iterable, depth: int = 4) -> Iterator:
    """``map(work, items)`` computed by a thread up to ``depth`` items ahead, so reading (which
    releases the GIL) overlaps with the consumer's tokenizing; results come in order."""
    results: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce():
        try:
            for item in items:
                if stop.is_set():
                    return
                results.put((True, work(item)))
        except BaseException as exc:  # handed to the consumer, raised there
            results.put((False, exc))
            return
        results.put((True, DONE))

    thread = threading.Thread(target=produce, name="lengthscan-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            ok, value = results.get()
            if not ok:
                raise value
            if value is DONE:
                return
            yield value
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                results.get_nowait()
            except queue.Empty:
                thread.join(0.01)


DONE = object()


def one_batch(table: pa.Table) -> pa.RecordBatch:
    """A table as one record batch (an empty one keeps its schema)."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def even_spans(rows: int, pieces: int, least: int) -> list[tuple[int, int]]:
    """``rows`` cut into up to ``pieces`` contiguous spans of at least ``least`` rows (one span when fewer)."""
    k = max(1, min(pieces, rows // max(1, least)))
    return [(rows * i // k, rows * (i + 1) // k) for i in range(k)] if rows else [(0, 0)]
