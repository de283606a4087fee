"""Some rows of a Parquet row group, read by the pages that hold them (the page index).

A file written with one huge row group (pyarrow's default is a million rows) would make a block
sample read whole files. Where the file has an offset index (``write_page_index=True``; written by
``datasets`` and most recent writers), each column chunk's data pages are listed with their byte
range and first row: the pages holding the rows wanted (and the chunk's dictionary page) are
fetched, copied into a small Parquet file of one row group built in memory (a footer of our own:
the column's schema element, its metadata with the new offsets, sizes and value count), and read
with pyarrow. Flat columns only (one leaf each: text, numbers): a nested column's leaves page at
different rows, so such a column is read by row group. The sub-blocks a block sample draws from a
huge row group are runs of pages of its first measured column of at least ``SUB_BLOCK_BYTES``.
"""

from __future__ import annotations

import numpy as np

from lengthscan.sources.thrift import BINARY, I32, I64, LIST, STRUCT, Struct, decode, encode

#: A row group whose first measured column holds at least this many bytes is split into page blocks.
SPLIT_OVER = 8 << 20
#: A page block holds at least this many bytes of that column (runs of whole pages).
SUB_BLOCK_BYTES = 1 << 20
# page types
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3


class PageIndex:
    """A Parquet file's footer (raw thrift) and page index, read through ``read_range(start, end)``."""

    def __init__(self, footer: bytes, read_range):
        self.meta, _ = decode(footer)
        self.read_range = read_range
        self._offsets: dict = {}
        schema = self.meta.get(2)[1]
        self.leaf_of: dict[str, int] = {}  # a flat top-level column -> its leaf (column chunk) index
        self.schema_of: dict[str, Struct] = {}
        self.root = schema[0]
        i, leaf = 1, 0
        while i < len(schema):
            element = schema[i]
            children = element.get(5, 0)
            name = element.get(4).decode("utf-8", "replace")
            if not children:
                self.leaf_of[name], self.schema_of[name] = leaf, element
                i, leaf = i + 1, leaf + 1
                continue
            skip = _subtree(schema, i)
            leaf += sum(1 for e in schema[i:i + skip] if not e.get(5, 0))
            i += skip

    def _chunk(self, group: int, leaf: int) -> Struct:
        return self.meta.get(4)[1][group].get(1)[1][leaf]

    def can_read(self, group: int, columns: list[str]) -> bool:
        """Every column is flat and its chunk in this group has an offset index."""
        return all(c in self.leaf_of and self._chunk(group, self.leaf_of[c]).get(4) is not None for c in columns)

    def pages(self, group: int, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The column's data pages in the group: (byte offset, byte size with header, first row)."""
        key = (group, column)
        if key not in self._offsets:
            chunk = self._chunk(group, self.leaf_of[column])
            start, length = chunk.get(4), chunk.get(5)
            index, _ = decode(self.read_range(start, start + length))
            locations = index.get(1)[1]
            self._offsets[key] = (np.array([p.get(1) for p in locations], np.int64),
                                  np.array([p.get(2) for p in locations], np.int64),
                                  np.array([p.get(3) for p in locations], np.int64))
        return self._offsets[key]

    def sub_blocks(self, group: int, column: str) -> list[int] | None:
        """Rows of each page block of a huge group (None: a group read whole)."""
        chunk = self._chunk(group, self.leaf_of[column]).get(3)
        if chunk.get(7, 0) < SPLIT_OVER:
            return None
        _, sizes, first = self.pages(group, column)
        rows = self.meta.get(4)[1][group].get(3)
        bounds, run = [0], 0
        for k in range(len(sizes)):
            run += int(sizes[k])
            if run >= SUB_BLOCK_BYTES and k + 1 < len(sizes):
                bounds.append(int(first[k + 1]))
                run = 0
        if run and len(bounds) > 1 and run < SUB_BLOCK_BYTES:  # a short last run joins the one before
            bounds.pop()
        bounds.append(rows)
        return np.diff(bounds).tolist()

    def read(self, group: int, columns: list[str], rows: np.ndarray, schema) -> "object":
        """``columns`` of the group's ``rows`` (sorted, local to the group) as a ``pyarrow.Table``."""
        import pyarrow as pa

        arrays = [self._column(group, c, rows).cast(schema.field(c).type) for c in columns]
        return pa.table(arrays, schema=pa.schema([schema.field(c) for c in columns]))

    def _column(self, group: int, column: str, rows: np.ndarray):
        import pyarrow as pa
        import pyarrow.parquet as pq

        offsets, sizes, first = self.pages(group, column)
        total_rows = self.meta.get(4)[1][group].get(3)
        ends = np.append(first[1:], total_rows)
        wanted = np.unique(np.searchsorted(first, rows, side="right") - 1)
        chunk = self._chunk(group, self.leaf_of[column])
        cmd: Struct = chunk.get(3)
        start = cmd.get(11) if cmd.get(11) is not None else cmd.get(9)
        prefix = self.read_range(start, int(offsets[0])) if start < offsets[0] else b""
        body = bytearray()
        for a, b in _runs(wanted):  # contiguous pages in one request
            body += self.read_range(int(offsets[a]), int(offsets[b - 1] + sizes[b - 1]))
        values = uncompressed = 0
        for page in (_pages(prefix) if prefix else []):
            uncompressed += page[2]
        for header_type, num_values, size in _pages(bytes(body)):
            values += num_values
            uncompressed += size
        kept = int((ends[wanted] - first[wanted]).sum())
        mini = self._mini_file(column, cmd, prefix, bytes(body), values, uncompressed, kept)
        table = pq.read_table(pa.BufferReader(mini))
        # a wanted row's place among the rows of the pages copied
        lengths = ends[wanted] - first[wanted]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        page = np.searchsorted(wanted, np.searchsorted(first, rows, side="right") - 1)
        positions = starts[page] + (rows - first[wanted][page])
        return table.column(0).take(pa.array(positions, pa.int64())).combine_chunks()

    def _mini_file(self, column: str, cmd: Struct, prefix: bytes, body: bytes, values: int, uncompressed: int,
                   rows: int) -> bytes:
        meta = Struct(dict(cmd.fields))
        meta.drop(8, 10, 12, 13, 14, 15, 16, 17)
        meta.set(5, I64, values)
        meta.set(6, I64, uncompressed)
        meta.set(7, I64, len(prefix) + len(body))
        meta.set(9, I64, 4 + len(prefix))
        if prefix:
            meta.set(11, I64, 4)
        else:
            meta.drop(11)
        chunk = Struct({2: (I64, 4), 3: (STRUCT, meta)})
        group = Struct({1: (LIST, (STRUCT, [chunk])), 2: (I64, uncompressed), 3: (I64, rows)})
        root = Struct(dict(self.root.fields))
        root.set(5, I32, 1)
        footer = Struct({1: self.meta.fields[1], 2: (LIST, (STRUCT, [root, self.schema_of[column]])),
                         3: (I64, rows), 4: (LIST, (STRUCT, [group]))})
        if 6 in self.meta.fields:
            footer.set(6, BINARY, self.meta.get(6))
        if 7 in self.meta.fields:
            kind, items = self.meta.get(7)
            footer.set(7, LIST, (kind, [items[self.leaf_of[column]]]))
        raw = encode(footer)
        return b"PAR1" + prefix + body + raw + len(raw).to_bytes(4, "little") + b"PAR1"


def page_blocks(metadata, index, groups, columns: list[str]) -> list[int]:
    """A file's blocks for a block sample: each row group, or the page blocks of a huge one whose
    ``columns`` are all flat with a page index. Local and remote copies of a file give the same.
    ``metadata`` is pyarrow's (it says cheaply whether any group is huge); ``index()`` gives the
    file's ``PageIndex``, decoded only then."""
    names = metadata.schema.to_arrow_schema().names if columns else []
    first = next((i for i, leaf in enumerate(metadata.schema) if columns and leaf.path.split(".")[0] == columns[0]),
                 None) if columns and columns[0] in names else None
    if first is None or all(metadata.row_group(g).column(first).total_compressed_size < SPLIT_OVER
                            for g in range(metadata.num_row_groups)):
        return list(groups)
    pages = index()
    out = []
    for g, rows in enumerate(groups):
        sub = pages.sub_blocks(g, columns[0]) if pages.can_read(g, columns) else None
        out.extend(sub if sub else [rows])
    return out


def local_page_index(path: str) -> PageIndex:
    """The page index of a local Parquet file (its footer read from disk)."""
    import os

    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        fh.seek(size - 8)
        length = int.from_bytes(fh.read(4), "little")
        fh.seek(size - 8 - length)
        footer = fh.read(length)

    def read_range(start: int, end: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)
    return PageIndex(footer, read_range)


def _subtree(schema: list, i: int) -> int:
    """How many schema elements the subtree at ``i`` spans (itself and every descendant)."""
    n, todo = 0, 1
    while todo:
        todo += schema[i + n].get(5, 0) - 1
        n += 1
    return n


def _runs(ids: np.ndarray):
    """Runs of consecutive page numbers: (first, end) pairs."""
    if ids.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [ids.size]])
    return [(int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, stops)]


def _pages(data: bytes):
    """(page type, values, uncompressed bytes with header) of each page laid end to end in ``data``."""
    pos = 0
    while pos < len(data):
        header, after = decode(data, pos)
        kind, compressed, raw = header.get(1), header.get(3), header.get(2)
        values = 0
        if kind == DATA_PAGE:
            values = header.get(5).get(1)
        elif kind == DATA_PAGE_V2:
            values = header.get(8).get(1)
        yield kind, values, (after - pos) + raw
        pos = after + compressed
