"""Reading an image's header and metadata within a budget: what the format readers share.

A hostile file may declare anything: a metadata chunk of 4 GB, a TIFF directory 3 GB into the file,
a compressed text chunk that inflates to gigabytes, thousands of EXIF segments. So every byte an
image's header is read with goes through a ``Reader``, which counts it: at most ``READ_BUDGET``
bytes are read per image (its data is seeked past, never read) and at most ``INFLATE_BUDGET`` bytes
inflated from its compressed metadata. Past either, the image is refused (``OverBudget``, an
``ImageError``: the row gets an ``unreadable`` reason that says so), never read on.

The budgets hold what Pillow reads of real files: EXIF (at most 64 KiB in a JPEG segment), XMP,
ICC profiles, PNG text chunks (Pillow refuses one that inflates past 1 MiB,
``PngImagePlugin.MAX_TEXT_CHUNK``, and so does lengthscan, with Pillow's reason). A file whose
metadata is over them but that Pillow would still open is refused with a reason, not measured.

``open_regular`` opens a path only where it is a regular file: a FIFO, a socket, a device or a
folder is refused before anything is read from it, so nothing blocks.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass

#: Bytes read from one image's file for its header and metadata, at most.
READ_BUDGET = 8 << 20
#: Bytes inflated from one image's compressed metadata (PNG text and ICC chunks), at most.
INFLATE_BUDGET = 8 << 20
#: What Pillow inflates of one PNG text or ICC chunk (``PngImagePlugin.MAX_TEXT_CHUNK``); past it,
#: Pillow refuses to open the image.
PILLOW_TEXT_CHUNK = 1 << 20
#: The text Pillow keeps of one PNG's text chunks (``PngImagePlugin.MAX_TEXT_MEMORY``).
PILLOW_TEXT_MEMORY = 64 << 20
#: What ``Reader.near`` reads at once.
WINDOW = 64 << 10
#: Chunks, segments or blocks walked in one image, at most (a file of millions of empty chunks
#: would take seconds to walk).
STEP_BUDGET = 200_000


class ImageError(ValueError):
    """Not an image header lengthscan can read (the message says why)."""


class OverBudget(ImageError):
    """Reading on would pass the budget of one image's header and metadata."""


class CutShort(ImageError):
    """The file ends inside a header or a metadata block."""


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int
    orientation: int = 1   # EXIF orientation; 5-8 are transposed
    format: str = ""

    def oriented(self) -> tuple[int, int]:
        """(width, height) once the EXIF orientation is applied."""
        return (self.height, self.width) if self.orientation in (5, 6, 7, 8) else (self.width, self.height)


def positive(w, h, fmt: str, orientation: int = 1) -> ImageSize:
    if not (isinstance(w, int) and isinstance(h, int)) or w <= 0 or h <= 0:
        raise ImageError(f"the {fmt} header gives a size of {w}x{h}")
    return ImageSize(w, h, orientation if 1 <= orientation <= 8 else 1, fmt)


class Reader:
    """A file (or bytes) read at offsets, every byte counted against ``READ_BUDGET``; also a
    file object (``read``, ``seek``, ``tell``) for Pillow's own metadata parsers."""

    def __init__(self, fh, budget: int = READ_BUDGET, steps: int = STEP_BUDGET):
        self._fh = fh
        self._left = budget
        self._budget, self._steps = budget, steps
        self._inflate_left = INFLATE_BUDGET
        self._steps_left = steps
        self._window, self._window_at = b"", 0
        self._pos = 0
        fh.seek(0, io.SEEK_END)
        self.size = fh.tell()
        fh.seek(0)

    @classmethod
    def of_bytes(cls, data: bytes, budget: int = READ_BUDGET, steps: int = STEP_BUDGET) -> Reader:
        return cls(io.BytesIO(data), budget, steps)

    def at(self, offset: int, n: int, what: str = "a header") -> bytes:
        """The ``n`` bytes at ``offset`` (``CutShort`` where the file ends before them)."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise CutShort(f"{what} is cut short (the file ends at byte {self.size:,})")
        self.seek(offset)
        return self.read(n)

    def upto(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer where the file ends)."""
        self.seek(max(0, offset))
        return self.read(max(0, min(n, self.size - offset)))

    def near(self, offset: int, n: int, what: str = "a header") -> bytes:
        """``at`` for small reads at increasing offsets: served from a window of 64 KiB read at
        once (a walk over many small chunks reads each window once)."""
        start = offset - self._window_at
        if start < 0 or start + n > len(self._window):
            if offset < 0 or offset + n > self.size:
                raise CutShort(f"{what} is cut short (the file ends at byte {self.size:,})")
            self._window, self._window_at, start = self.upto(offset, max(n, WINDOW)), offset, 0
        return self._window[start:start + n]

    def byte(self, offset: int) -> int | None:
        """The byte at ``offset`` (None past the end), through the window."""
        return self.near(offset, 1)[0] if 0 <= offset < self.size else None

    def step(self) -> None:
        """Count one chunk, segment or block walked (``OverBudget`` past ``STEP_BUDGET``)."""
        self._steps_left -= 1
        if self._steps_left < 0:
            raise OverBudget(f"more than {self._steps:,} chunks, segments or blocks to walk (lengthscan walks no "
                             "more of one file)")

    # -- the file object Pillow's parsers read ------------------------------------------------------
    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        n = max(0, min(n, self.size - self._pos))
        if n > self._left:
            raise OverBudget(f"more than {self._budget >> 20} MiB of header and metadata to read (lengthscan reads "
                             "no more of one file)")
        self._left -= n
        self._fh.seek(self._pos)
        data = self._fh.read(n)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def inflate(self, compressed: bytes, what: str) -> bytes | None:
        """``compressed`` inflated as Pillow's PNG reader inflates a text or ICC chunk: at most
        ``PILLOW_TEXT_CHUNK`` bytes (past them Pillow refuses the image, and so does this); None
        where it is not zlib data (Pillow reads it as empty)."""
        import zlib

        limit = min(PILLOW_TEXT_CHUNK, self._inflate_left)
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(compressed, limit)
        except zlib.error:
            return None
        if inflater.unconsumed_tail:
            if limit < PILLOW_TEXT_CHUNK:
                raise OverBudget(f"more than {INFLATE_BUDGET >> 20} MiB of compressed metadata to inflate "
                                 "(lengthscan inflates no more of one image)")
            raise ImageError(f"{what} inflates past {PILLOW_TEXT_CHUNK >> 20} MiB: Pillow refuses to open it "
                             "(PngImagePlugin.MAX_TEXT_CHUNK)")
        self._inflate_left -= len(out)
        return out


def open_regular(path) -> io.BufferedReader:
    """``path`` opened for reading where it is a regular file; ``ImageError`` naming what it is
    otherwise (a FIFO, socket, device or folder is never read: it could block or never end).
    Checked before opening, and again on what was opened (the path may change in between)."""
    kind = _special(os.stat(path).st_mode)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = _special(os.fstat(fd).st_mode)
            if kind is None:
                if hasattr(os, "set_blocking"):
                    os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise ImageError(f"not a regular file ({kind})")


def _special(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"
