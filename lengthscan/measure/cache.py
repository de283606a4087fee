"""Per-row length cache: a rerun on the same source and tokenizer does not tokenize again.

One Parquet file per (split content, column, role, unit, tokenizer file hash, max_chars,
lengthscan version) under ``$LENGTHSCAN_CACHE`` (default ``~/.cache/lengthscan``). Written only
after a full pass over the split, atomically, named by its key and the SHA-256 of its bytes (a file
that no longer matches is not read but measured again); read back in row order, streamed, so memory
stays flat however many rows there are.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lengthscan import __version__
from lengthscan.sources import arrays
from lengthscan.sources.cache_dir import (
    MISMATCH,
    NO_CHECKSUM,
    cache_root,
    distrust,
    file_digest,
    regular_cache_file,
)

_SCHEMA = pa.schema([("length", pa.int64()), ("flag", pa.int8())])


def field_key(split_fingerprint: str, column: str, name: str, tokenizer_hash: str, max_chars: int) -> str:
    """The cache key of one measured column."""
    payload = json.dumps([__version__, split_fingerprint, column, name, tokenizer_hash, max_chars])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def check_cached(path: Path, schema: pa.Schema, rows: int) -> None:
    """A cached file fit to read: the columns and types written, one row per source row, lengths
    not below -1 (the mark of a row without one). ``pa.ArrowInvalid`` otherwise: the caller skips
    the file with a warning and measures again (a cache never decides a result it cannot vouch for)."""
    meta = pq.ParquetFile(path)
    got = meta.schema_arrow
    if [(f.name, f.type) for f in got] != [(f.name, f.type) for f in schema]:
        raise pa.ArrowInvalid(f"{path.name} holds columns {got.names}, not {schema.names}")
    if meta.metadata.num_rows != rows:
        raise pa.ArrowInvalid(f"{path.name} holds {meta.metadata.num_rows:,} rows, the split {rows:,}")
    for g in range(meta.metadata.num_row_groups):
        group = meta.metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            stats = column.statistics
            if pa.types.is_integer(schema.field(c).type) and stats is not None and stats.has_min_max \
                    and stats.min < -1:
                raise pa.ArrowInvalid(f"{path.name}: column {schema.field(c).name} holds {stats.min}, below -1")


def cached_path(key: str) -> Path | None:
    """The cached file of ``key`` whose content matches the checksum in its name
    (``<key>.<sha256>.parquet``), or None. A file that does not match (changed since it was
    written) or has no checksum is removed with a warning: the caller measures again."""
    folder = cache_root() / "lengths"
    try:
        found = sorted(folder.glob(f"{key}.*parquet"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return None
    for path in found:
        digest = path.name[len(key) + 1:-len(".parquet")]
        if not regular_cache_file(path):  # a FIFO would block the digest's read, /dev/zero never end it
            continue
        try:
            if len(digest) == 64 and file_digest(path) == digest:
                return path
        except OSError:
            continue
        distrust(path, NO_CHECKSUM if len(digest) != 64 else MISMATCH,
                 "length cache", "measuring instead")
    return None


class TableCacheWriter:
    """Streams record batches of one schema to a temporary file; ``commit`` publishes it as
    ``<key>.<sha256 of its bytes>.parquet`` (``cached_path`` verifies it before it is read)."""

    def __init__(self, key: str, schema: pa.Schema):
        self.key = key
        self.folder = cache_root() / "lengths"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tmp = self.folder / f".{key}.parquet.{os.getpid()}.tmp"
        self._writer = pq.ParquetWriter(self.tmp, schema)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def commit(self) -> None:
        """Publish the file (an ``OSError`` where it cannot be: the temporary file removed)."""
        self._writer.close()
        final = self.folder / f"{self.key}.{file_digest(self.tmp)}.parquet"
        try:
            os.replace(self.tmp, final)  # a folder in its place (IsADirectoryError), a read-only folder ...
        except OSError:
            self.tmp.unlink(missing_ok=True)
            raise
        for older in self.folder.glob(f"{self.key}.*parquet"):  # earlier writes of this key
            if older != final:
                older.unlink(missing_ok=True)

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


class CacheWriter(TableCacheWriter):
    """Streams one text column's lengths and flags."""

    def __init__(self, key: str):
        super().__init__(key, _SCHEMA)

    def write(self, lengths: np.ndarray, flags: np.ndarray) -> None:
        columns = [arrays.numeric(lengths, pa.int64()), arrays.numeric(flags, pa.int8())]
        self.write_batch(pa.record_batch(columns, schema=_SCHEMA))


class CacheReader:
    """Reads cached (lengths, flags) for consecutive requests of row positions, in row order."""

    def __init__(self, path: Path, rows: int):
        check_cached(path, _SCHEMA, rows)
        self._file = pq.ParquetFile(path)
        self.num_rows = self._file.metadata.num_rows
        self._batches = self._file.iter_batches(batch_size=65536)
        self._start = 0  # global row position of self._lengths[0]
        self._lengths = np.zeros(0, np.int64)
        self._flags = np.zeros(0, np.int8)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values at sorted ``rows``, each at or after every row asked before."""
        if rows.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int8)
        end = int(rows[-1]) + 1
        while self._start + self._lengths.size < end:
            rb = next(self._batches)
            self._lengths = np.concatenate([self._lengths, arrays.to_numpy(rb.column(0))])
            self._flags = np.concatenate([self._flags, arrays.to_numpy(rb.column(1))])
        local = rows - self._start
        out = self._lengths[local], self._flags[local]
        drop = int(rows[-1]) + 1 - self._start
        self._lengths, self._flags = self._lengths[drop:], self._flags[drop:]
        self._start += drop
        return out


def chat_key(split_fingerprint: str, columns, signature: str, tokenizer_hash: str, max_chars: int) -> str:
    """The cache key of a conversation field: its columns, how it is measured (template, format,
    what is trained), the tokenizer and ``--max-chars``."""
    payload = json.dumps([__version__, split_fingerprint, list(columns), "chat", signature, tokenizer_hash, max_chars])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class TableCacheReader:
    """Reads cached rows at sorted positions, each request at or after the previous ones."""

    def __init__(self, path: Path, schema: pa.Schema, rows: int):
        check_cached(path, schema, rows)
        self._batches = pq.ParquetFile(path).iter_batches(batch_size=65536)
        self._start = 0
        self._buffer: pa.Table | None = None

    def take(self, rows: np.ndarray) -> pa.Table:
        if self._buffer is None:
            self._buffer = pa.Table.from_batches([next(self._batches)])
        end = int(rows[-1]) + 1 if rows.size else self._start
        while self._start + self._buffer.num_rows < end:
            self._buffer = pa.concat_tables([self._buffer, pa.Table.from_batches([next(self._batches)])])
        out = self._buffer.take(arrays.numeric(rows - self._start, pa.int64()))
        drop = end - self._start
        self._buffer = self._buffer.slice(drop)
        self._start += drop
        return out
