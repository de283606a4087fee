"""A remote file as pyarrow reads it: ranged reads with retries, byte accounting and change detection.

``RemoteFile`` is a raw (unbuffered) file object: each ``read`` is one request for exactly the
bytes asked, so Parquet reads fetch the footer and the column chunks of the row groups read and
nothing else. Sequential readers (JSON Lines, CSV) wrap it in a large ``io.BufferedReader``.
A failed request (a timeout, a server error) is retried ``network.RETRIES`` times with exponential
backoff, then the run stops with a ``SourceError`` naming the file and the byte range; a file that
is no longer the one listed (``network.Changed``), and an answer that is not the bytes asked
(``network.WrongAnswer``), stop it at once. Files are named as ``RemoteEntry.name`` shows them.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field

from lengthscan.sources.remote import network
from lengthscan.sources.remote.network import Changed, Gone, RemoteEntry
from lengthscan.sources.remote.stores import store_for
from lengthscan.sources.source import SourceError, first_line

#: Bytes a sequential reader (JSON Lines, CSV) asks at once.
STREAM_BLOCK = 8 << 20


@dataclass
class Traffic:
    """What reading a source cost: data bytes received, requests, retries (thread-safe)."""

    bytes_read: int = 0
    requests: int = 0
    retries: int = 0
    by_file: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def counts(self) -> tuple[int, int, int]:
        """(bytes read, requests, retries) so far."""
        with self._lock:
            return self.bytes_read, self.requests, self.retries

    def add_counts(self, counts: tuple[int, int, int]) -> None:
        """Add what another process read (a Ray actor's reads of the same files)."""
        with self._lock:
            self.bytes_read += counts[0]
            self.requests += counts[1]
            self.retries += counts[2]

    def add(self, url: str, n: int) -> None:
        with self._lock:
            self.bytes_read += n
            self.requests += 1
            self.by_file[url] = self.by_file.get(url, 0) + n

    def retried(self) -> None:
        with self._lock:
            self.retries += 1


class RemoteFile(io.RawIOBase):
    """``entry``'s bytes, read by range through its store; every byte received counts in ``traffic``."""

    def __init__(self, entry: RemoteEntry, traffic: Traffic):
        super().__init__()
        self.entry, self.traffic = entry, traffic
        self._read = store_for(entry.url).opener(entry)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self.entry.size

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.entry.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        data = self.read_range(self._pos, min(self._pos + len(buffer), self.entry.size))
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``, retried with backoff; a ``SourceError`` naming the range when it fails."""
        if end <= start:
            return b""
        name, wait, timeouts = self.entry.name, network.BACKOFF, 0
        for attempt in range(network.RETRIES + 1):
            try:
                data = self._read(start, end)
            except Changed as exc:
                raise SourceError(f"{name}: the file changed during the run ({exc}); nothing was mixed: "
                                  "run again") from None
            except Gone as exc:
                raise SourceError(f"{name}: bytes {start}-{end - 1}: {exc}") from None
            except SourceError:
                raise
            except Exception as exc:  # each library its own errors (aiohttp's, pyarrow's OSError, timeouts)
                timeouts += network.is_timeout(exc)
                if attempt == network.RETRIES or timeouts > network.TIMEOUT_RETRIES:
                    why = network.timeout_text(exc) if network.is_timeout(exc) else first_line(exc)
                    raise SourceError(f"{name}: bytes {start}-{end - 1}: the request failed "
                                      f"{attempt + 1} times ({why})") from None
                self.traffic.retried()
                time.sleep(wait)
                wait = min(wait * 2, network.BACKOFF_MAX)
                continue
            self.traffic.add(name, len(data))
            if len(data) != end - start:
                raise SourceError(f"{name}: bytes {start}-{end - 1}: {len(data):,} bytes came back "
                                  f"of {end - start:,} (the file is shorter than when it was listed: changed "
                                  "during the run?)")
            return data
        raise AssertionError("unreachable")


def parquet_file(entry: RemoteEntry, traffic: Traffic):
    """(``pyarrow.parquet.ParquetFile`` over the remote file, its raw footer, the file): the footer
    read exactly (8 bytes for its length, then the footer, where pyarrow would read the last 64 KiB),
    then each row group's column chunks in one coalesced request (``pre_buffer``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = RemoteFile(entry, traffic)
    size = entry.size
    if size < 12:
        raise SourceError(f"{entry.name}: {size} bytes: too short for a Parquet file")
    tail = raw.read_range(size - 8, size)
    if tail[4:] != b"PAR1":
        raise SourceError(f"{entry.name}: not a Parquet file (no PAR1 at its end)")
    length = int.from_bytes(tail[:4], "little")
    if length + 12 > size:
        raise SourceError(f"{entry.name}: its Parquet footer claims {length:,} bytes of a {size:,}-byte file")
    footer = raw.read_range(size - 8 - length, size - 8)
    meta = pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail))
    return pq.ParquetFile(pa.PythonFile(raw, mode="r"), metadata=meta, pre_buffer=True), footer, raw


def input_stream(entry: RemoteEntry, traffic: Traffic):
    """The file read front to back in ``STREAM_BLOCK`` requests, decompressed by its suffix."""
    import pyarrow as pa

    raw = pa.PythonFile(io.BufferedReader(RemoteFile(entry, traffic), buffer_size=STREAM_BLOCK), mode="r")
    codec = _codec(entry.name)
    return pa.CompressedInputStream(raw, codec) if codec else raw


def _codec(url: str) -> str | None:
    name = url.lower().split("?")[0]
    for suffix, codec in ((".gz", "gzip"), (".bz2", "bz2"), (".zst", "zstd"), (".zstd", "zstd"), (".xz", "lzma")):
        if name.endswith(suffix):
            return codec
    return None
