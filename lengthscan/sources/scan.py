"""Stream the rows of a split as Arrow record batches, in row order, with flat memory.

Each part is read by its format's reader (``sources.formats``), the same reader the Ray engine
reads its tasks with: Parquet by row groups, JSON Lines and remote CSV streamed with pyarrow, what
``datasets`` opened through its Arrow files. A sample reads only its rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lengthscan.sources.formats import BATCH_ROWS, Batch, read_part
from lengthscan.sources.formats.batch import read_ahead
from lengthscan.sources.formats.datasets import plain_arrow_files
from lengthscan.sources.source import SplitSource

__all__ = ["BATCH_ROWS", "Batch", "iter_batches", "plain_arrow_files", "read_ahead"]


def iter_batches(split: SplitSource, columns: list[str], *, indices: np.ndarray | None = None,
                 batch_rows: int = BATCH_ROWS, raw: tuple = ()) -> Iterator[Batch]:
    """Yield ``Batch``es of ``columns`` for every row (``indices`` None) or the sorted ``indices``.
    ``raw`` columns of a JSON Lines file also come as the file holds them (``Batch.raw``). A file
    that cannot be read (corrupt, truncated, not UTF-8, gone) is a ``SourceError`` naming it."""
    for part in split.parts:
        yield from read_part(split.name, part, columns, indices=indices, batch_rows=batch_rows, raw=raw)
