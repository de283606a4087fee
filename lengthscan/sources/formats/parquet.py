"""Parquet files (local or remote) read with pyarrow: every row group in turn, or only the row
groups (a remote file: the pages) that hold the rows asked."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from lengthscan.sources import arrays
from lengthscan.sources.formats.batch import Batch, even_spans, one_batch, read_ahead

#: Row groups with more rows are streamed when sampled, not read whole (flat memory).
LARGE_ROW_GROUP = 65_536


class ParquetFormat:
    """A Parquet part (``Part.parquet``); its row groups are its read tasks' boundaries."""

    name = "parquet"

    def claims(self, part) -> bool:
        return part.parquet

    def spans(self, part, pieces: int, least: int) -> list[tuple[int, int]]:
        """Runs of whole row groups, about ``part.rows / pieces`` rows each (at least ``least``)."""
        groups = part.groups or (part.rows,)
        size = max(least, -(-part.rows // max(1, pieces)))
        spans, lo, at = [], 0, 0
        for n in groups:
            if n >= 2 * size:  # a huge row group (a whole file in one): cut in row spans of its own
                if at > lo:
                    spans.append((lo, at))
                spans += [(at + a, at + b) for a, b in even_spans(n, n // size, least)]
                at = lo = at + n
                continue
            at += n
            if at - lo >= size:
                spans.append((lo, at))
                lo = at
        if at > lo or not spans:
            spans.append((lo, at))
        return spans

    def read(self, part, columns: list[str], wanted, batch_rows: int, raw: tuple = (), *,
             stop: bool = False) -> Iterator[Batch]:
        import pyarrow.parquet as pq

        pf = part.remote.parquet(part.path) if part.remote is not None else pq.ParquetFile(part.path)
        if wanted is None:
            yield from _every_row(part, pf, columns, batch_rows)
        else:
            yield from _some_rows(part, pf, columns, wanted - part.start, batch_rows)


def _every_row(part, pf, columns: list[str], batch_rows: int) -> Iterator[Batch]:
    offset = part.start
    # a remote file row group by row group: its pre-buffered reads then hold one group at a time
    groups = [[g] for g in range(pf.metadata.num_row_groups)] if part.remote is not None else [None]
    for rb in (rb for g in groups for rb in pf.iter_batches(batch_size=batch_rows, columns=columns, row_groups=g)):
        yield Batch(np.arange(offset, offset + rb.num_rows, dtype=np.int64), rb)
        offset += rb.num_rows
    if offset != part.start + part.rows:
        raise RuntimeError(f"read {offset - part.start} rows of {part.path}, expected {part.rows}")


def _some_rows(part, pf, columns: list[str], local: np.ndarray, batch_rows: int) -> Iterator[Batch]:
    """The rows at ``local`` (part positions, sorted), by the row groups holding them."""
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
            if at.size == sizes[g]:  # every row of the group (a read task's span): no copy
                return in_group, group
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
                yield Batch(rows[k:k + batch_rows], one_batch(table.slice(k, batch_rows)))
