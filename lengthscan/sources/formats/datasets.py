"""Sources ``datasets`` opened: ``save_to_disk`` folders, Arrow files, JSON array files, local
CSV/TSV (its conversion gives the columns' types), audio folders, a hub dataset ``load_dataset``
converted. A full pass reads the Arrow stream files through a file handle (flat memory: a memory
map's touched pages count as resident); a dataset with transforms on top (an indices mapping,
renamed columns) goes through ``datasets``' own iterator; a sample reads only its rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from lengthscan.sources.formats.batch import Batch, even_spans, one_batch
from lengthscan.sources.formats.raw_lines import raw_lines_of


class DatasetFormat:
    """Any other part: a ``datasets.Dataset`` (opened lazily by the part)."""

    name = "dataset"

    def claims(self, part) -> bool:
        return True

    def spans(self, part, pieces: int, least: int) -> list[tuple[int, int]]:
        return even_spans(part.rows, pieces, least)

    def read(self, part, columns: list[str], wanted, batch_rows: int, raw: tuple = (), *,
             stop: bool = False) -> Iterator[Batch]:
        lines = raw_lines_of(part, raw)  # a JSON Lines file datasets converted: its rows as written
        if wanted is None:
            offset = part.start
            for rb in _dataset_batches(part.dataset, columns, batch_rows):
                rows = np.arange(offset, offset + rb.num_rows, dtype=np.int64)
                yield Batch(rows, rb, lines.take(rows - part.start) if lines else None)
                offset += rb.num_rows
            if offset != part.start + part.rows:
                raise RuntimeError(f"read {offset - part.start} rows of {part.path or 'the dataset'}, "
                                   f"expected {part.rows}")
            return
        local = wanted - part.start
        for k in range(0, local.size, batch_rows):
            chunk = local[k:k + batch_rows]
            table = part.dataset.select(chunk).with_format("arrow")[:].select(columns)
            yield Batch(chunk + part.start, one_batch(table), lines.take(chunk) if lines else None)


def _dataset_batches(ds, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    files = plain_arrow_files(ds)
    if files is None:
        for table in ds.with_format("arrow").iter(batch_size=batch_rows):
            yield one_batch(table.select(columns))
        return
    for path in files:
        with pa.OSFile(path, "rb") as fh:
            reader = pa.ipc.open_stream(fh)
            for rb in reader:
                rb = rb.select(columns)
                for k in range(0, rb.num_rows, batch_rows):
                    yield rb.slice(k, batch_rows)


#: Transforms datasets records on a memory-mapped table that leave its rows and columns as stored.
HARMLESS_REPLAYS = {"replace_schema_metadata"}


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
        if any(op not in HARMLESS_REPLAYS for op, _, _ in block.replays or ()):
            return None
        if block.table.schema.names != ds.column_names:
            return None
        paths.append(block.path)
    return paths
