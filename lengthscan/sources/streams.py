"""Local data files opened for reading: regular files only, decompressed by their suffix, and
checked as they stream by, so that no reader ever holds more than a bounded row.

* ``open_regular``: a FIFO, socket or device named where a file was expected would block or never
  end; it is refused (``NotRegularFile``) without blocking, opened with ``O_NONBLOCK``.
* ``open_data``: ``.gz``, ``.bz2``, ``.zst``/``.zstd`` (pyarrow's codecs) and ``.xz`` (Python's
  ``lzma``) decompressed as they are read.
* ``CheckedLines``: the stream every text reader of a local file (JSON Lines, JSON, CSV/TSV) reads
  through. It counts lines, checks that they are UTF-8 (naming the line and byte that is not) and
  that no line is longer than ``max_row_bytes()`` (a row: JSON Lines and TSV hold one a line; a
  CSV row may span lines inside quotes, checked by ``csv_files``), and that a file read whole (a
  JSON document) is at most ``DOCUMENT_ROWS`` times that. A line is never read whole to find it
  too long: the check sees each block as it passes. The limit is ``$LENGTHSCAN_MAX_ROW_BYTES``
  (default 64 MiB of decompressed bytes): a decompression bomb (a 1 MB ``.jsonl.gz`` holding one
  line of a billion characters, or gigabytes of zero bytes) stops after that much, in flat memory.
"""

from __future__ import annotations

import codecs
import io
import os
import stat
import threading

import numpy as np

from lengthscan.sources.source import SourceError

#: The environment variable that sets the longest row (line) a data file may hold, in bytes.
MAX_ROW_ENV = "LENGTHSCAN_MAX_ROW_BYTES"
#: Its default: 64 MiB, room for a 10-million-character text (``--max-chars``'s default) written
#: with JSON escapes, far below what the readers need memory for (several times a row).
DEFAULT_MAX_ROW = 64 << 20
#: A file read whole (a JSON array document: ``datasets`` loads it at once) may hold this many
#: times the row limit (1 GiB by default).
DOCUMENT_ROWS = 16

#: Compression suffix -> codec (pyarrow's, but "xz": Python's lzma, which pyarrow lacks).
CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz"}

#: The bytes ``bytes.strip`` takes for white space, as a lookup table.
_WHITE = np.zeros(256, bool)
_WHITE[list(b" \t\n\r\x0b\x0c")] = True

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """A path that names no regular file (a FIFO, socket, device or directory): never read."""


class LineError(ValueError):
    """A line that is too long or not UTF-8, for a stream without a file name (its message names
    the line; the caller names the file)."""


def max_row_bytes() -> int:
    """The longest row (line) in bytes a data file may hold: ``$LENGTHSCAN_MAX_ROW_BYTES``, else 64 MiB."""
    text = os.environ.get(MAX_ROW_ENV, "").strip().replace("_", "")
    if not text:
        return DEFAULT_MAX_ROW
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SourceError(f"{MAX_ROW_ENV}={os.environ[MAX_ROW_ENV]!r}: give a whole number of bytes, at least 1 "
                          f"(default {DEFAULT_MAX_ROW:,})")
    return value


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is when it is no regular file ("a FIFO"...), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def special_entry(path) -> str | None:
    """Where a local model, tokenizer or processor is read from (a file, or a folder and the files in
    it, which transformers opens by name): the first that is a FIFO, socket or device, said as
    "PATH: a FIFO, not a regular file" (a read of it would block or never end); None when there is none."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing: the loader says so
    if not stat.S_ISDIR(mode):
        what = kind_of(mode)
        return f"{os.fspath(path)}: {what}, not a regular file" if what is not None else None
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return None
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode  # through links: a link to /dev/zero is a device
        except OSError:
            continue
        what = None if stat.S_ISDIR(mode) else kind_of(mode)
        if what is not None:
            return f"{entry.path}: {what}, not a regular file"
    return None


def open_regular(path) -> io.FileIO:
    """``path`` opened for reading, unbuffered; ``NotRegularFile`` (without blocking) when it is a
    FIFO, socket, device or directory, ``OSError`` when it cannot be opened."""
    what = kind_of(os.stat(path).st_mode)  # a socket cannot even be opened: said as what it is
    if what is not None:
        raise NotRegularFile(f"{os.fspath(path)}: {what}, not a regular file")
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # O_NONBLOCK: a FIFO put there since is opened without waiting for a writer
    try:
        what = kind_of(os.fstat(fd).st_mode)
        if what is not None:
            raise NotRegularFile(f"{os.fspath(path)}: {what}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


#: UTF-8's byte order mark, which some editors write at the start of a text file.
BOM = b"\xef\xbb\xbf"


def codec_of(path: str) -> str | None:
    """The codec a file's name says it is compressed with, or None."""
    name = str(path).lower()
    return next((codec for suffix, codec in CODECS.items() if name.endswith(suffix)), None)


def open_data(path):
    """A local data file front to back, decompressed by its suffix (a binary stream with ``read``)."""
    raw = open_regular(path)
    codec = codec_of(path)
    try:
        if codec is None:
            return raw
        if codec == "xz":
            import lzma

            return lzma.LZMAFile(raw)
        import pyarrow as pa

        return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec)
    except BaseException:
        raw.close()
        raise


def open_text(path, *, document: bool = False, utf8: bool = True) -> "CheckedLines":
    """A local text data file (JSON Lines, JSON, CSV/TSV) decompressed and checked (``CheckedLines``):
    lines of at most ``max_row_bytes()``, or with ``document`` (a file read whole) the whole file
    at most ``DOCUMENT_ROWS`` times that. A file that is no regular file is a ``SourceError``."""
    cap = max_row_bytes()
    try:
        inner = open_data(path)
    except NotRegularFile as exc:
        raise SourceError(f"{exc}; remove it from the source, or name the files to read") from None
    return CheckedLines(inner, os.fspath(path), line_cap=None if document else cap,
                        total_cap=cap * DOCUMENT_ROWS if document else None, utf8=utf8)


#: Seconds ``CheckedLines.close`` waits for a read under way on another thread (an Arrow reader's).
STOP_WAIT_S = 60.0


class CheckedLines(io.RawIOBase):
    """A binary stream read through: lines counted, checked to be UTF-8 (``utf8``) and at most
    ``line_cap`` bytes, and the whole at most ``total_cap`` bytes (see the module). A failed check
    is a ``SourceError`` naming ``label`` (the file) and the line, or a ``LineError`` naming the
    line without a ``label``. ``line`` is the number of lines read to their end so far.

    pyarrow's JSON and CSV readers read it ahead on Arrow's I/O threads, calling into Python; a
    thread still doing so when the interpreter exits aborts the process ("terminate called without
    an active exception", ``PyGILState_Release``): so ``close`` (the end of a ``with`` block, on an
    error too) waits for a read under way, and every read after it returns nothing, which ends the
    reader's read-ahead."""

    def __init__(self, inner, label: str | None = None, *, line_cap: int | None = None,
                 total_cap: int | None = None, utf8: bool = True):
        super().__init__()
        self.inner, self.label = inner, label
        self.line_cap, self.total_cap, self.utf8 = line_cap, total_cap, utf8
        self.line = 0  # lines ended so far
        self.run = 0  # bytes of the line under way (since the last newline)
        self.total = 0  # bytes read so far
        self.tally = False  # count the lines of white space alone (``blank``, ``filled_lines``)
        self.blank = 0  # lines ended so far that hold nothing but white space
        self.longest = 0  # bytes of the longest line so far (the one under way counted as far as read)
        self._ws = True  # the line under way holds nothing but white space so far
        self._pending = b""  # the start of a UTF-8 character cut by the end of the last block
        self._started = False  # a leading UTF-8 byte order mark is dropped (pyarrow before 26 refuses it)
        self._state = threading.Condition()  # reads under way, and whether the reader is done (``close``)
        self._reading, self._stopped, self._ended = 0, False, False
        self._others = False  # another thread than the one that opened it has read it (a reader's)
        self._opener = threading.get_ident()

    @property
    def filled_lines(self) -> int:
        """Lines read so far that hold more than white space (the last one too, ended or not); only
        with ``tally`` set before the first read."""
        return self.line - self.blank + (not self._ws)

    # -- io.RawIOBase ---------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        with self._state:
            if self._stopped:  # closed: the end, for a read-ahead thread still asking
                self._ended = True
                self._state.notify_all()
                return b""
            self._reading += 1
            self._others = self._others or threading.get_ident() != self._opener
        ended = True  # unless a read returns data: the end, or an error, after which the reader stops
        try:
            data = self._read_inner(size)
            if data:
                self._see(data)
                ended = False
            elif self._pending and self.utf8:
                self._not_utf8(self._pending, 0, "the file ends inside a character")
            return data
        finally:
            with self._state:
                self._reading -= 1
                self._ended = self._ended or ended
                self._state.notify_all()

    def _read_inner(self, size: int | None) -> bytes:
        """One read of the stream underneath, less a leading UTF-8 byte order mark."""
        while True:
            data = self.inner.read() if size is None or size < 0 else self.inner.read(size)
            data = bytes(data) if not isinstance(data, bytes) else data
            if self._started or not data:
                return data
            self._started = True
            while len(data) < len(BOM) and data == BOM[:len(data)]:  # a first read cut inside the mark
                more = self.inner.read(len(BOM) - len(data))
                if not more:
                    break
                data += bytes(more)
            if not data.startswith(BOM):
                return data
            data = data[len(BOM):]
            if data:
                return data

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            with self._state:  # a read under way on a reader's thread ends first; the next finds the end
                self._stopped = True
                self._state.wait_for(lambda: self._reading == 0, timeout=STOP_WAIT_S)
                if self._others and not self._ended:  # a reader left reading ahead: its next read (the end)
                    self._state.wait_for(lambda: self._ended, timeout=0.2)
            try:
                self.inner.close()
            finally:
                super().close()

    # -- the checks -----------------------------------------------------------------------------
    def _see(self, data: bytes) -> None:
        self.total += len(data)
        if self.total_cap is not None and self.total > self.total_cap:
            self._fail(f"holds more than {_size(self.total_cap)} decompressed, the most a file read whole (a JSON "
                       f"document) may hold ({DOCUMENT_ROWS} times {MAX_ROW_ENV}); give it as JSON Lines (one object "
                       f"a line), which streams, or raise {MAX_ROW_ENV}")
        if self.utf8 and (self._pending or not data.isascii()):
            self._check_utf8(data)
        raw = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(raw == 0x0A)
        cap = self.line_cap
        if ends.size == 0:
            self.run += len(data)
            self.longest = max(self.longest, self.run)
            if self.tally and self._ws:
                self._ws = not data.strip()
            if cap is not None and self.run > cap:
                self._too_long(self.line + 1)
            return
        if cap is not None:
            if self.run + int(ends[0]) > cap:
                self._too_long(self.line + 1)
            if len(data) > cap + 1:  # a line inside this block may be over the limit too
                over = np.flatnonzero(np.diff(ends) - 1 > cap)
                if over.size:
                    self._too_long(self.line + int(over[0]) + 2)
        if self.tally:
            self._tally(data, raw, ends)
        first = self.run + int(ends[0])  # the line under way, ended in this block
        inner = int((np.diff(ends) - 1).max()) if ends.size > 1 else 0
        self.line += int(ends.size)
        self.run = len(data) - int(ends[-1]) - 1
        self.longest = max(self.longest, first, inner, self.run)
        if cap is not None and self.run > cap:
            self._too_long(self.line + 1)

    def _tally(self, data: bytes, raw, ends) -> None:
        """Count the lines of white space alone that end in ``data`` (``ends``: its line breaks): only
        lines that start with white space are looked at, few in JSON Lines."""
        blank = int(self._ws and not data[:ends[0]].strip())
        for k in np.flatnonzero(_WHITE[raw[ends[:-1] + 1]]).tolist():
            blank += not data[ends[k] + 1:ends[k + 1]].strip()
        self.blank += blank
        tail = int(ends[-1]) + 1
        self._ws = tail == len(data) or bool(_WHITE[raw[tail]]) and not data[tail:].strip()

    def _check_utf8(self, data: bytes) -> None:
        if self._pending:
            data = self._pending + data
        try:  # not final: a character cut by the block's end is left over, checked with the next block
            _, used = codecs.utf_8_decode(data, "strict", False)
        except UnicodeDecodeError as exc:
            self._not_utf8(data, exc.start, None)
        self._pending = data[used:]

    def _not_utf8(self, data: bytes, at: int, why: str | None) -> None:
        """Name the line and byte of ``data[at]`` (``data``: the pending bytes, then this block)."""
        # ``self.line``/``self.run`` still describe where ``data`` starts, less the pending bytes
        before = data[:at]
        newlines = before.count(b"\n")
        start = self.run - len(self._pending) if newlines == 0 else 0
        column = start + at - (before.rfind(b"\n") + 1) + 1
        line = self.line + newlines + 1
        shown = repr(data[at:at + 1]) if at < len(data) else "the end of the file"
        self._fail(f"line {line} is not UTF-8 text (byte {column:,} of the line: {why or shown}); re-encode the "
                   "file as UTF-8")

    def _too_long(self, line: int) -> None:
        self._fail(f"line {line} is longer than {_size(self.line_cap)}, the longest row lengthscan reads (read no "
                   f"further); shorten or split that row, or raise the limit with {MAX_ROW_ENV}=BYTES if it is real")

    def _fail(self, message: str) -> None:
        if self.label is not None:
            raise SourceError(f"{self.label}: {message}")
        raise LineError(message)


def _size(n: int) -> str:
    """A byte count for a message: in MiB or GiB when whole, with the exact count."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift:,} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"
