"""A PNG's size and orientation, its chunks walked as Pillow's ``PngImageFile`` reads them.

Pillow reads the chunks before the image data on opening (their checksums checked, an unknown
chunk skipped, a broken one refusing the file), and the chunks after it once the image is loaded,
which ``exif_transpose`` does first (stopping quietly at a broken chunk header, or at the end of
the file). The metadata among them sets the orientation: ``eXIf``; a text chunk named ``exif``,
``Raw profile type exif`` (ImageMagick's hex EXIF) or ``XML:com.adobe.xmp``; a later chunk replaces
an earlier one. Pillow refuses a PNG whose compressed text or ICC chunk inflates past 1 MiB, whose
text chunks hold more than 64 MiB, or whose ``zTXt``/``iCCP`` names another compression method:
so does this, with Pillow's reason. The image data is seeked past, never read; every chunk read
counts against the ``Reader``'s budget.
"""

from __future__ import annotations

import re
import struct
import zlib

from lengthscan.measure.images.orientation import orientation
from lengthscan.measure.images.reader import (
    PILLOW_TEXT_MEMORY,
    CutShort,
    ImageError,
    ImageSize,
    Reader,
    positive,
)

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CID = re.compile(rb"\w\w\w\w")
#: (bit depth, colour type) pairs Pillow has a mode for (``PngImagePlugin._MODES``).
_MODES = {(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 2), (16, 2), (1, 3), (2, 3), (4, 3), (8, 3), (8, 4),
          (16, 4), (8, 6), (16, 6)}
#: The ``info`` keys that bear on the orientation.
_KEPT = ("exif", "Raw profile type exif", "XML:com.adobe.xmp")
_READ = (b"IHDR", b"eXIf", b"tEXt", b"zTXt", b"iTXt", b"iCCP")
#: Chunks Pillow refuses when shorter than this (its handlers raise: the image cannot be opened).
_SHORTEST = {b"IHDR": 13, b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"acTL": 8}


def png_size(r: Reader) -> ImageSize:
    state = _State(r)
    at = 8
    while True:  # before the image data: as PngImageFile._open reads
        r.step()
        if at + 8 > r.size:
            raise CutShort("a PNG that ends before its image data")
        length, cid = struct.unpack(">I4s", r.near(at, 8))
        if not _CID.match(cid):
            raise ImageError(f"a broken PNG chunk {cid!r} before the image data")
        if cid in (b"IDAT", b"IEND"):
            break
        name = cid.decode("latin-1")
        if at + 8 + length > r.size:
            raise CutShort(f"a PNG whose {name} chunk is cut short")
        whole = r.near(at + 8, min(length + 4, r.size - at - 8))
        body, crc = whole[:length], whole[length:]
        state.chunk(cid, body)
        if len(crc) < 4 or struct.unpack(">I", crc)[0] != zlib.crc32(body, zlib.crc32(cid)) & 0xFFFFFFFF:
            raise ImageError(f"a PNG whose {name} chunk fails its checksum: Pillow refuses it")
        at += 12 + length
    if cid == b"IEND":
        raise ImageError("a PNG without image data")
    if state.size is None:
        raise ImageError("a PNG without an IHDR chunk")
    while cid == b"IDAT":  # the image data: it must be all there to decode
        r.step()
        if at + 8 + length > r.size:
            raise CutShort("a PNG whose image data is cut short")
        at += 12 + length
        head = r.near(at, 8) if at + 8 <= r.size else b""
        if len(head) < 8:
            break
        length, cid = struct.unpack(">I4s", head)
    while len(head) == 8 and _CID.match(cid) and cid != b"IEND":  # after it: as PngImageFile.load_end reads
        r.step()
        if at + 8 + length > r.size:
            raise CutShort(f"a PNG whose {cid.decode('latin-1')} chunk is cut short")
        if cid in _READ:
            state.chunk(cid, r.near(at + 8, length), after=True)
        elif length < _SHORTEST.get(cid, 0):
            state.chunk(cid, b"")
        at += 12 + length
        head = r.near(at, 8) if at + 8 <= r.size else b""
        if len(head) == 8:
            length, cid = struct.unpack(">I4s", head)
    w, h = state.size
    return positive(w, h, "PNG", orientation(state.info))


class _State:
    """What Pillow's ``PngStream`` keeps of the chunks read: the size, the metadata, the text memory."""

    def __init__(self, r: Reader):
        self.r = r
        self.size: tuple[int, int] | None = None
        self.info: dict = {}
        self.text_memory = 0

    def chunk(self, cid: bytes, s: bytes, after: bool = False) -> None:
        """Read one chunk as Pillow's handler does (``after``: past the image data)."""
        if len(s) < _SHORTEST.get(cid, 0):
            raise ImageError(f"a PNG whose {cid.decode('latin-1')} chunk is too short: Pillow refuses it")
        if cid == b"IHDR":
            if s[11]:
                raise ImageError("a PNG of an unknown filter method, which Pillow cannot open")
            if not after:  # the size was read on opening
                if (s[8], s[9]) not in _MODES:
                    raise ImageError(f"a PNG of bit depth {s[8]} and colour type {s[9]}, which Pillow cannot open")
                self.size = struct.unpack(">II", s[:8])
        elif cid == b"eXIf":
            self.info["exif"] = b"Exif\x00\x00" + s
        elif cid == b"tEXt":
            k, _, v = s.partition(b"\x00")
            if k:
                self._text(k, v if k == b"exif" else v.decode("latin-1"), len(v))
        elif cid == b"zTXt":
            k, _, v = s.partition(b"\x00")
            if v and v[0] != 0:
                raise ImageError(f"a PNG zTXt chunk of compression method {v[0]}: Pillow refuses it")
            text = self.r.inflate(v[1:], "a PNG zTXt chunk")
            if k:
                self._text(k, (text or b"").decode("latin-1"), len(text or b""))
        elif cid == b"iTXt":
            self._itxt(s)
        elif cid == b"iCCP":
            i = s.find(b"\x00")
            if i + 1 >= len(s):
                raise ImageError("a PNG whose iCCP chunk is cut short: Pillow refuses it")
            if s[i + 1] != 0:
                raise ImageError(f"a PNG iCCP chunk of compression method {s[i + 1]}: Pillow refuses it")
            self.r.inflate(s[i + 2:], "a PNG iCCP chunk (its ICC profile)")

    def _itxt(self, s: bytes) -> None:
        k, sep, r = s.partition(b"\x00")
        if not sep or len(r) < 2:
            return
        compressed, method, r = r[0], r[1], r[2:]
        parts = r.split(b"\x00", 2)
        if len(parts) < 3:
            return
        lang, tk, v = parts
        if compressed:
            if method != 0:
                return
            v = self.r.inflate(v, "a PNG iTXt chunk")
            if v is None:
                return
        if k == b"XML:com.adobe.xmp":
            self.info["xmp"] = v
        try:
            k.decode("latin-1")
            lang.decode("utf-8")
            tk.decode("utf-8")
            text = v.decode("utf-8")
        except UnicodeError:
            return
        self._text(k, text, len(text))

    def _text(self, key: bytes, value, size: int) -> None:
        name = key.decode("latin-1")
        if name in _KEPT:
            self.info[name] = value
        self.text_memory += size
        if self.text_memory > PILLOW_TEXT_MEMORY:
            raise ImageError(f"a PNG whose text chunks hold over {PILLOW_TEXT_MEMORY >> 20} MiB: Pillow refuses it "
                             "(PngImagePlugin.MAX_TEXT_MEMORY)")
