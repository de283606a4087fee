"""Source formats as objects: one reader per format, shared by the local engine (``sources.scan``)
and the Ray engine (``engines.ray``), which reads each of its tasks with the same reader.

A format object has ``name``, ``claims(part)``, ``spans(part, pieces, least)`` (the part's rows
cut into spans a read task reads apart: whole row groups for Parquet, row ranges otherwise) and
``read(part, columns, wanted, batch_rows, raw, stop=...)`` (``Batch``es of record batches with
their rows' positions in the split). ``READERS`` lists the built-in ones, tried in order on a part
its opener gave no reader. A new format is one module here (its reader), its suffix in
``sources.source.FORMATS`` and where its files are counted into parts, ``Part(..., reader=...,
rows=..., columns=..., schema=...)`` (``sources.files``): both engines then read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lengthscan.sources.formats.batch import BATCH_ROWS, Batch, wanted_rows
from lengthscan.sources.formats.csv import CsvFormat
from lengthscan.sources.formats.datasets import DatasetFormat
from lengthscan.sources.formats.json_lines import JsonLinesFormat
from lengthscan.sources.formats.parquet import ParquetFormat
from lengthscan.sources.source import SourceError, first_line

__all__ = ["BATCH_ROWS", "Batch", "READERS", "ReadTask", "reader_for", "read_part", "read_tasks"]

#: The formats' readers, the first that claims a part reads it.
READERS = (ParquetFormat(), JsonLinesFormat(), CsvFormat(), DatasetFormat())


def reader_for(part):
    """The reader of ``part``'s format: the one its opener gave it (``Part.reader``), else the first
    of ``READERS`` that claims it."""
    if getattr(part, "reader", None) is not None:
        return part.reader
    return next(r for r in READERS if r.claims(part))


@dataclass(frozen=True)
class ReadTask:
    """Rows ``lo``..``hi`` of part ``part`` of a split (part positions), read apart from the others."""

    part: int
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


def read_tasks(split, pieces: int, least: int) -> list[ReadTask]:
    """The split's read tasks in row order, about ``pieces`` in all (each at least ``least`` rows,
    a part's row groups kept whole where it has them)."""
    total = max(1, split.num_rows)
    tasks = []
    for i, part in enumerate(split.parts):
        share = max(1, round(pieces * part.rows / total))
        tasks += [ReadTask(i, lo, hi) for lo, hi in reader_for(part).spans(part, share, least) if hi > lo]
    return tasks


def read_part(split_name: str, part, columns: list[str], *, indices: np.ndarray | None = None,
              batch_rows: int = BATCH_ROWS, raw: tuple = (), span: tuple[int, int] | None = None) -> Iterator[Batch]:
    """``Batch``es of ``columns`` of one part's rows (``indices``: the split's sorted row positions
    asked, None: all; ``span``: only the part's rows ``lo``..``hi``). A file that cannot be read
    (corrupt, truncated, not UTF-8, gone) is a ``SourceError`` naming it; a remote file is checked
    unchanged once read."""
    wanted = wanted_rows(part, indices, span)
    if wanted is not None and not wanted.size:
        return
    try:
        yield from reader_for(part).read(part, columns, wanted, batch_rows, raw, stop=span is not None)
        if part.remote is not None:
            part.remote.check_unchanged(part.path)
    except UNREADABLE as exc:
        if part.remote is not None:  # a file rewritten under a server that ignores If-Match: said so
            part.remote.check_unchanged(part.path)
        kind = "not valid JSON" if isinstance(exc, json.JSONDecodeError) else \
            "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "unreadable (corrupt or truncated?)"
        raise SourceError(f"{part.path or split_name}: {kind}: {first_line(exc)[:200]}") from exc


#: What reading a damaged file raises (a bad Parquet page or compressed block: an ArrowException or OSError).
UNREADABLE = (OSError, EOFError, UnicodeDecodeError, pa.ArrowException, json.JSONDecodeError)
