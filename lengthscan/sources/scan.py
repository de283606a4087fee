"""Stream the rows of a split as Arrow record batches, in row order, with flat memory.

A ``Dataset`` memory-maps its Arrow files: pages it touches count as resident and grow with the
file. For a full pass we therefore read the Arrow stream files themselves through an ordinary file
handle, one record batch at a time; only datasets with transforms on top (an indices mapping,
renamed columns) go through ``datasets``' own iterator. A sample reads only its rows.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lengthscan.sources import arrays
from lengthscan.sources.source import SourceError, SplitSource, first_line

#: Rows per batch handed to the measure step (the tokenizer threads over a batch).
BATCH_ROWS = 2048
#: Row groups with more rows are streamed when sampled, not read whole (flat memory).
LARGE_ROW_GROUP = 65_536


@dataclass(frozen=True, eq=False)
class Batch:
    """Rows of one split: their global positions and the requested columns."""

    rows: np.ndarray
    table: pa.RecordBatch
    #: column -> the rows' values as the JSON Lines file holds them (``json.loads``, not pyarrow's
    #: typed reading, which unifies a column's types across rows); for the ``raw`` columns asked
    raw: dict | None = None


def iter_batches(split: SplitSource, columns: list[str], *, indices: np.ndarray | None = None,
                 batch_rows: int = BATCH_ROWS, raw: tuple = ()) -> Iterator[Batch]:
    """Yield ``Batch``es of ``columns`` for every row (``indices`` None) or the sorted ``indices``.
    ``raw`` columns of a JSON Lines file also come as the file holds them (``Batch.raw``). A file
    that cannot be read (corrupt, truncated, not UTF-8, gone) is a ``SourceError`` naming it."""
    for part in split.parts:
        try:
            yield from _part_rows(split, part, columns, indices, batch_rows, raw)
        except _UNREADABLE as exc:
            if part.remote is not None:  # a file rewritten under a server that ignores If-Match: said so
                part.remote.check_unchanged(part.path)
            kind = "not valid JSON" if isinstance(exc, json.JSONDecodeError) else \
                "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "unreadable (corrupt or truncated?)"
            raise SourceError(f"{part.path or split.name}: {kind}: {first_line(exc)[:200]}") from exc


#: What reading a damaged file raises (a bad Parquet page or compressed block: an ArrowException or OSError).
_UNREADABLE = (OSError, EOFError, UnicodeDecodeError, pa.ArrowException, json.JSONDecodeError)


def _part_rows(split: SplitSource, part, columns: list[str], indices, batch_rows: int, raw: tuple):
    """One part's batches (see ``iter_batches``); a remote file is checked unchanged once read."""
    if part.remote is not None:
        if part.parquet:
            yield from _parquet_batches(part, columns, indices, batch_rows)
        elif part.jsonl_schema is not None:
            yield from _jsonl_batches(part, columns, indices, batch_rows, raw)
        else:
            yield from _csv_batches(part, columns, indices, batch_rows)
        part.remote.check_unchanged(part.path)
        return
    if part.parquet:
        yield from _parquet_batches(part, columns, indices, batch_rows)
        return
    if part.jsonl_schema is not None:
        yield from _jsonl_batches(part, columns, indices, batch_rows, raw)
        return
    lines = _raw_lines(part, raw)  # a JSON Lines file datasets converted: its rows as written
    if indices is None:
        offset = part.start
        for rb in _part_batches(part.dataset, columns, batch_rows):
            rows = np.arange(offset, offset + rb.num_rows, dtype=np.int64)
            yield Batch(rows, rb, lines.take(rows - part.start) if lines else None)
            offset += rb.num_rows
        if offset != part.start + part.rows:
            raise RuntimeError(f"read {offset - part.start} rows of {part.path or split.name}, "
                               f"expected {part.rows}")
    else:
        lo, hi = np.searchsorted(indices, [part.start, part.start + part.rows])
        local = indices[lo:hi] - part.start
        for k in range(0, local.size, batch_rows):
            chunk = local[k:k + batch_rows]
            table = part.dataset.select(chunk).with_format("arrow")[:].select(columns)
            yield Batch(chunk + part.start, _one_batch(table), lines.take(chunk) if lines else None)


def _parquet_batches(part, columns: list[str], indices, batch_rows: int) -> Iterator[Batch]:
    """A Parquet file read with pyarrow: every row group in turn, or only those holding sampled rows."""
    import pyarrow.parquet as pq

    pf = part.remote.parquet(part.path) if part.remote is not None else pq.ParquetFile(part.path)
    if indices is None:
        offset = part.start
        # a remote file row group by row group: its pre-buffered reads then hold one group at a time
        groups = [[g] for g in range(pf.metadata.num_row_groups)] if part.remote is not None else [None]
        for rb in (rb for g in groups for rb in pf.iter_batches(batch_size=batch_rows, columns=columns,
                                                                    row_groups=g)):
            yield Batch(np.arange(offset, offset + rb.num_rows, dtype=np.int64), rb)
            offset += rb.num_rows
        if offset != part.start + part.rows:
            raise RuntimeError(f"read {offset - part.start} rows of {part.path}, expected {part.rows}")
        return
    local = indices[(indices >= part.start) & (indices < part.start + part.rows)] - part.start
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    group_of = np.searchsorted(starts, local, side="right") - 1
    # sampled rows of consecutive row groups gather into full batches: a 1% sample of small row
    # groups would otherwise make batches of a few rows, each paying the per-batch costs
    pending, pending_rows = [], []
    bounds = np.searchsorted(group_of, np.unique(group_of), side="left").tolist() + [local.size]

    def read(span):
        g, in_group = int(group_of[span[0]]), local[span[0]:span[1]]
        at = in_group - starts[g]
        pages = part.remote.page_index(part.path) if part.remote is not None and at.size < sizes[g] else None
        if pages is not None and pages.can_read(g, columns):
            # a remote file's rows by the pages that hold them, not the whole row group
            return in_group, pages.read(g, columns, at, pf.schema_arrow)
        if sizes[g] <= LARGE_ROW_GROUP:
            group = pf.read_row_group(g, columns=columns, use_threads=False)
            return in_group, group.take(arrays.numeric(at, pa.int64()))
        # a huge row group (a whole file in one, say) is streamed, keeping only the sampled rows
        pieces, offset = [], 0
        for rb in pf.iter_batches(batch_size=LARGE_ROW_GROUP, row_groups=[g], columns=columns, use_threads=False):
            lo, hi = np.searchsorted(at, [offset, offset + rb.num_rows])
            if hi > lo:
                pieces.append(pa.Table.from_batches([rb.take(arrays.numeric(at[lo:hi] - offset, pa.int64()))]))
            offset += rb.num_rows
        return in_group, pa.concat_tables(pieces)

    done = 0
    for in_group, table in read_ahead(read, zip(bounds[:-1], bounds[1:]), depth=1024):  # items are small
        pending.append(table)
        pending_rows.append(in_group)
        done += in_group.size
        if sum(r.size for r in pending_rows) >= batch_rows or done == local.size:
            table, rows = pa.concat_tables(pending), np.concatenate(pending_rows) + part.start
            pending, pending_rows = [], []
            for k in range(0, rows.size, batch_rows):
                yield Batch(rows[k:k + batch_rows], _one_batch(table.slice(k, batch_rows)))


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
        results.put((True, _DONE))

    thread = threading.Thread(target=produce, name="lengthscan-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            ok, value = results.get()
            if not ok:
                raise value
            if value is _DONE:
                return
            yield value
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                results.get_nowait()
            except queue.Empty:
                thread.join(0.01)


_DONE = object()


def _jsonl_batches(part, columns: list[str], indices, batch_rows: int, raw: tuple = ()) -> Iterator[Batch]:
    """A JSON Lines file streamed with pyarrow, block by block (a sample takes its rows on the way);
    ``raw`` columns are also parsed line by line with ``json.loads``, in step with the reader."""
    import pyarrow.json as pj

    from lengthscan.sources.files import json_parse_options, json_read_options

    with _stream(part) as fh:  # closed at the end, on an error, or when the batches are left unread
        reader = pj.open_json(fh, read_options=json_read_options(part.jsonl_schema),
                              parse_options=json_parse_options(part.jsonl_schema))
        lines = RawLines(part.path, raw, lambda: _stream(part)) if raw else None
        yield from _sliced(part, (rb.select(columns) for rb in reader), indices, batch_rows, lines)


def _stream(part):
    """The part's file front to back, decompressed (a remote file through its counted reads), as a
    ``streams.CheckedLines``: closing it stops the read-ahead of the Arrow reader reading it."""
    from lengthscan.sources.streams import CheckedLines, open_text

    if part.remote is not None:
        return CheckedLines(part.remote.stream(part.path), part.path, utf8=False)

    return open_text(part.path, utf8=False)  # checked as UTF-8 when the file was opened (its layout)


def _csv_batches(part, columns: list[str], indices, batch_rows: int) -> Iterator[Batch]:
    """A CSV/TSV file streamed with pyarrow (every column as text), a sample taking its rows on the way."""
    import pyarrow.csv as pacsv

    from lengthscan.sources.csv_files import pyarrow_convert_options, pyarrow_parse_options

    tsv = str(part.path).lower().split("?")[0].removesuffix(".gz").removesuffix(".bz2").endswith(".tsv")
    with _stream(part) as fh:
        reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(use_threads=False),
                                parse_options=pyarrow_parse_options(tsv),
                                convert_options=pyarrow_convert_options(part.csv_schema, columns))
        yield from _sliced(part, reader, indices, batch_rows)


def _sliced(part, batches, indices, batch_rows: int, lines=None) -> Iterator[Batch]:
    """A part's record batches, read front to back, cut to ``batch_rows`` (or to its sampled rows)."""
    offset = part.start
    wanted = None if indices is None else indices[(indices >= part.start) & (indices < part.start + part.rows)]
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
    if offset != part.start + part.rows:
        raise RuntimeError(f"read {offset - part.start} rows of {part.path}, expected {part.rows}")


class RawLines:
    """The ``columns`` of a JSON Lines file's rows parsed with ``json.loads``, line by line, for
    rows asked in increasing order (blank lines are skipped, as the readers skip them)."""

    def __init__(self, path: str, columns: tuple, open_stream=None):
        self.path, self.columns = path, columns
        self._lines = _json_lines(path, open_stream)
        self._next = 0  # the row the next line holds

    def take(self, rows) -> dict:
        """column -> values of the rows at these (sorted, not yet passed) positions in the file."""
        from lengthscan.sources.json_lines import json_error

        parsed = []
        for row in np.asarray(rows).tolist():
            while self._next < row:
                next(self._lines)
                self._next += 1
            number, line = next(self._lines)
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SourceError(f"{self.path}: line {number} is not valid JSON: {json_error(exc)}; fix or remove "
                                  "that line") from None
            self._next += 1
        return {c: [r.get(c) if isinstance(r, dict) else None for r in parsed] for c in self.columns}


def _json_lines(path: str, open_stream=None):
    """(line number, line) of the lines of a JSON Lines file (decompressed) that hold a row."""
    import io

    from lengthscan.sources.streams import open_text

    stream = open_stream() if open_stream is not None else open_text(path)
    with io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8", newline="\n") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, line


def _raw_lines(part, raw: tuple) -> RawLines | None:
    """Raw values for a part that ``datasets`` read from one JSON Lines file (None otherwise)."""
    if not raw or not part.path:
        return None
    name = str(part.path).lower()
    for ext in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(ext)
    if not name.endswith((".jsonl", ".json", ".ndjson")):
        return None
    from lengthscan.sources.files import looks_like_lines

    return RawLines(part.path, raw) if looks_like_lines(part.path) else None


def _part_batches(ds, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    files = plain_arrow_files(ds)
    if files is None:
        for table in ds.with_format("arrow").iter(batch_size=batch_rows):
            yield _one_batch(table.select(columns))
        return
    for path in files:
        with pa.OSFile(path, "rb") as fh:
            reader = pa.ipc.open_stream(fh)
            for rb in reader:
                rb = rb.select(columns)
                for k in range(0, rb.num_rows, batch_rows):
                    yield rb.slice(k, batch_rows)


#: Transforms datasets records on a memory-mapped table that leave its rows and columns as stored.
_HARMLESS_REPLAYS = {"replace_schema_metadata"}


def plain_arrow_files(ds) -> list[str] | None:
    """The Arrow files that hold exactly ``ds``'s rows in order, or None if ``ds`` has transforms."""
    # ``_indices`` (a select/shuffle mapping) and ``_data`` (its Arrow table) are datasets' own private
    # attributes: no public API says whether a Dataset's rows are exactly its cache files'.
    if ds._indices is not None:
        return None
    from datasets.table import ConcatenationTable, InMemoryTable, MemoryMappedTable

    table = ds._data
    if isinstance(table, MemoryMappedTable):
        blocks = [table]
    elif isinstance(table, ConcatenationTable):
        if any(len(row) != 1 for row in table.blocks):
            return None
        blocks = [row[0] for row in table.blocks]
    elif isinstance(table, InMemoryTable):
        return None
    else:
        return None
    paths = []
    for block in blocks:
        if not isinstance(block, MemoryMappedTable) or block.path is None:
            return None
        if any(op not in _HARMLESS_REPLAYS for op, _, _ in block.replays or ()):
            return None
        if block.table.schema.names != ds.column_names:
            return None
        paths.append(block.path)
    return paths


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
