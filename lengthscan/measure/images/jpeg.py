"""A JPEG's size and orientation, its marker segments walked as Pillow's ``JpegImageFile`` walks
them up to the start of scan.

As there: bytes between segments that are not a marker are skipped, fill bytes too; a marker Pillow
does not know refuses the file; the last frame header gives the size (8-bit samples of 1, 3 or 4
components, or Pillow cannot open it); the EXIF segments are joined (the first one's block, the
later ones' bytes appended), the last XMP segment is kept, a JFIF resolution is noted (Pillow reads
the EXIF on opening when there is none, ignoring an EXIF block it cannot read). A segment cut short
refuses the file, as in Pillow. Segments that bear on none of this are seeked past.
"""

from __future__ import annotations

import struct

from lengthscan.measure.images.orientation import orientation
from lengthscan.measure.images.reader import CutShort, ImageError, ImageSize, Reader, positive

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE}
#: Markers without a length (Pillow's ``MARKER`` entries without a handler).
_BARE = {0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)}
#: Of those, the ones libjpeg refuses before the image data (a second start of image, an end of
#: image, reserved markers): Pillow reads past them, then cannot decode the image.
_FATAL = {0xC8, 0xD8, 0xD9, *range(0xF0, 0xFE)}
#: Frame types libjpeg cannot decode (hierarchical, and lossless arithmetic-coded, JPEG).
_UNDECODED = {0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE}
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
#: How far the bytes between segments are searched for the next marker at a time.
_SCAN = 4096


def jpeg_size(r: Reader) -> ImageSize:
    if r.upto(0, 3) != b"\xff\xd8\xff":
        raise ImageError("not a JPEG (no start-of-image marker)")
    info: dict = {}
    size = None
    icc: list[bytes] = []   # the ICC_PROFILE segments' first 14 bytes
    pos = 3                  # the byte after a marker's 0xFF
    while True:
        r.step()
        kind = r.byte(pos)
        if kind is None:
            raise CutShort("a JPEG that ends before its image data")
        pos += 1
        if kind == 0xFF:  # a fill byte
            continue
        if kind in _FATAL:
            raise ImageError(f"a JPEG with a 0xFF{kind:02X} marker before its image data, which libjpeg refuses")
        if kind == 0x00 or kind in _BARE:
            pos = _next_marker(r, pos)
            continue
        if kind < 0xC0:
            raise ImageError(f"a JPEG with an unknown marker 0xFF{kind:02X}: Pillow refuses it")
        (length,) = struct.unpack(">H", r.near(pos, 2, "a JPEG segment"))
        n = max(0, length - 2)
        if pos + 2 + n > r.size:
            raise CutShort(f"a JPEG whose 0xFF{kind:02X} segment is cut short")
        body_at, pos = pos + 2, pos + 2 + n
        if kind == 0xDA:  # start of scan: the image data follows
            break
        if kind in _SOF:
            size = _frame(r.at(body_at, n), icc)
            if kind in _UNDECODED:
                raise ImageError(f"a JPEG of frame type 0xFF{kind:02X}, which libjpeg cannot decode")
            icc = []
        elif kind == 0xDB:
            _quantization(r.at(body_at, n))
        elif kind == 0xE0:
            _jfif(r.at(body_at, min(n, 12)), info)
        elif kind == 0xE1:
            _app1(r, body_at, n, info)
        elif kind == 0xE2:
            s = r.at(body_at, min(n, 14))
            if s.startswith(b"ICC_PROFILE\x00"):
                icc.append(s)
        elif kind == 0xED:
            _photoshop(r.at(body_at, n))
        elif kind == 0xEE:
            s = r.at(body_at, min(n, 7))
            if s.startswith(b"Adobe") and len(s) < 7:
                raise ImageError("a JPEG whose Adobe segment is cut short: Pillow refuses it")
        pos = _next_marker(r, pos)
    if size is None:
        raise ImageError("a JPEG with no frame header before its image data")
    if "exif" in info:
        info["exif"] = bytes(info["exif"])
    return positive(size[0], size[1], "JPEG", orientation(info, jpeg=True))


def _next_marker(r: Reader, pos: int) -> int:
    """The position after the next 0xFF byte (Pillow skips what lies between)."""
    if r.byte(pos) == 0xFF:
        return pos + 1
    while True:
        block = r.upto(pos, _SCAN)
        if not block:
            raise CutShort("a JPEG that ends before its image data")
        found = block.find(b"\xff")
        if found >= 0:
            return pos + found + 1
        pos += len(block)


def _frame(s: bytes, icc: list) -> tuple[int, int]:
    if len(s) < 6:
        raise ImageError("a JPEG whose frame header is cut short")
    if s[0] != 8:
        raise ImageError(f"a JPEG of {s[0]}-bit samples, which Pillow cannot open")
    if s[5] not in (1, 3, 4):
        raise ImageError(f"a JPEG of {s[5]} components, which Pillow cannot open")
    if icc and len(min(icc)) < 14:
        raise ImageError("a JPEG whose ICC profile segment is cut short: Pillow refuses it")
    h, w = struct.unpack(">HH", s[1:5])
    return w, h


def _quantization(s: bytes) -> None:
    while s:
        length = 1 + (64 if s[0] // 16 == 0 else 128)
        if len(s) < length:
            raise ImageError("a JPEG with a bad quantization table: Pillow refuses it")
        s = s[length:]


def _jfif(s: bytes, info: dict) -> None:
    if not s.startswith(b"JFIF"):
        return
    if len(s) < 7:
        raise ImageError("a JPEG whose JFIF segment is cut short: Pillow refuses it")
    if len(s) >= 12 and s[7] in (1, 2):  # dots per inch or per centimetre
        info["dpi"] = True


def _app1(r: Reader, at: int, n: int, info: dict) -> None:
    head = r.at(at, min(n, len(_XMP)))
    if head.startswith(b"Exif\x00\x00"):
        s = r.at(at, n)
        if "exif" in info:  # joined, as Pillow joins them
            info["exif"] += s[6:]
        else:
            info["exif"] = bytearray(s)
    elif head.startswith(_XMP):
        info["xmp"] = r.at(at, n).split(b"\x00", 1)[1]


def _photoshop(s: bytes) -> None:
    """Pillow's walk of a Photoshop segment's resources: a cut-short one raises where it indexes."""
    if not s.startswith(b"Photoshop 3.0\x00"):
        return
    at = 14
    while s[at:at + 4] == b"8BIM":
        at += 4
        if at + 2 > len(s):
            return  # struct.error, which Pillow catches
        at += 2
        if at >= len(s):
            raise ImageError("a JPEG whose Photoshop segment is cut short: Pillow refuses it")
        at += 1 + s[at]
        at += at & 1
        if at + 4 > len(s):
            return
        (size,) = struct.unpack(">I", s[at:at + 4])
        at += 4 + size
        at += at & 1
