"""Image sizes from their headers, never decoding: PNG, JPEG, WebP, GIF, BMP and TIFF.

``image_size(data)`` reads the first bytes of a file (``HEAD_BYTES`` are enough for most files;
a JPEG's size marker may follow large EXIF or ICC segments, and a PNG's chunks are walked to IEND
for its orientation chunks, which Pillow honours even after the image data: ``image_size_from``
reads on as needed, and seeks past a PNG's image data) and returns ``ImageSize(width, height,
orientation)``: the size as stored, and the orientation Pillow's ``getexif`` finds (EXIF, else XMP;
1-8, where 5-8 swap width and height once applied, as ``PIL.ImageOps.exif_transpose`` does).
``ImageError`` names what is wrong with an unreadable header.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

#: Bytes that hold the size of every format but JPEG (whose marker segments are walked).
HEAD_BYTES = 64 << 10


_XMP_JPEG = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')


class ImageError(ValueError):
    """Not an image header lengthscan can read (the message says why)."""


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int
    orientation: int = 1   # EXIF orientation; 5-8 are transposed
    format: str = ""

    def oriented(self) -> tuple[int, int]:
        """(width, height) once the EXIF orientation is applied."""
        return (self.height, self.width) if self.orientation in (5, 6, 7, 8) else (self.width, self.height)


def image_size(data: bytes) -> ImageSize:
    """The size in an image's header (``data``: the file's first bytes, or all of it)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    if data[:2] == b"BM":
        return _bmp(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _tiff(data, 0, "TIFF")
    raise ImageError("not a PNG, JPEG, WebP, GIF, BMP or TIFF image")


def image_size_from(path) -> ImageSize:
    """``image_size`` of a file: a PNG's chunk headers are walked with seeks (its metadata may follow
    the image data), other formats read past ``HEAD_BYTES`` only when their header needs it."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
        if head.startswith(b"\x89PNG\r\n\x1a\n"):
            return _png_walk(head, _chunks_of(fh))
        try:
            return image_size(head)
        except _Short:
            return image_size(head + fh.read())


class _Short(ImageError):
    """The header runs past the bytes given."""


def _unpack(fmt: str, data: bytes, at: int):
    size = struct.calcsize(fmt)
    if at < 0 or at + size > len(data):
        raise _Short("the header is cut short")
    return struct.unpack_from(fmt, data, at)


def _positive(w: int, h: int, fmt: str, orientation: int = 1) -> ImageSize:
    if w <= 0 or h <= 0:
        raise ImageError(f"the {fmt} header gives a size of {w}x{h}")
    return ImageSize(w, h, orientation if 1 <= orientation <= 8 else 1, fmt)


_PNG_META = (b"eXIf", b"tEXt", b"zTXt", b"iTXt")


def _png(data: bytes) -> ImageSize:
    return _png_walk(data, _chunks_in(data))


def _chunks_in(data: bytes):
    """(kind, body) of a PNG's chunks in memory (body only for the metadata chunks)."""
    at = 8
    while True:
        length, kind = _unpack(">I4s", data, at)
        if kind in _PNG_META and at + 8 + length > len(data):
            raise _Short("a PNG chunk is cut short")
        yield kind, data[at + 8:at + 8 + length] if kind in _PNG_META else None
        if kind == b"IEND":
            return
        at += 12 + length


def _chunks_of(fh):
    """(kind, body) of a PNG file's chunks, seeking past the image data rather than reading it."""
    at = 8
    while True:
        fh.seek(at)
        head = fh.read(8)
        if len(head) < 8:
            raise ImageError("a PNG that ends before its IEND chunk")
        length, kind = struct.unpack(">I4s", head)
        body = fh.read(length) if kind in _PNG_META else None
        if body is not None and len(body) < length:
            raise ImageError("a PNG chunk is cut short")
        yield kind, body
        if kind == b"IEND":
            return
        at += 12 + length


def _png_walk(data: bytes, chunks) -> ImageSize:
    if data[12:16] != b"IHDR":
        raise ImageError("a PNG without IHDR first")
    w, h = _unpack(">II", data, 16)
    exif = raw = xmp = None
    # the orientation chunks, which Pillow reads after the image data too: eXIf, else the "Raw
    # profile type exif" text ImageMagick writes; XMP's tiff:Orientation when neither has one
    for kind, body in chunks:  # a repeated chunk replaces the one before, as in Pillow's info
        if kind == b"eXIf":
            exif = body
        elif kind in (b"tEXt", b"zTXt", b"iTXt"):
            key, text = _png_text(kind, body)
            if key == b"Raw profile type exif":
                raw = text
            elif key == b"XML:com.adobe.xmp":
                xmp = text
    if exif is None and raw is not None:
        try:
            exif = bytes.fromhex("".join(raw.decode("latin-1").split("\n")[3:]))
        except ValueError:
            exif = None
    return _positive(w, h, "PNG", _orientation(exif, xmp))


def _png_text(kind: bytes, body: bytes) -> tuple[bytes, bytes]:
    """(keyword, text) of a tEXt, zTXt or iTXt chunk (b"" text where it does not decompress)."""
    import zlib

    key, _, rest = body.partition(b"\x00")
    try:
        if kind == b"zTXt":
            return key, zlib.decompress(rest[1:])
        if kind == b"iTXt":
            compressed = rest[:1] == b"\x01"
            rest = rest[2:].split(b"\x00", 2)[-1]  # past the language tag and the translated keyword
            return key, zlib.decompress(rest) if compressed else rest
    except zlib.error:
        return key, b""
    return key, rest


def _jpeg(data: bytes) -> ImageSize:
    at, exif, xmp = 2, None, None
    while True:
        (marker,) = _unpack(">B", data, at)
        if marker != 0xFF:
            raise ImageError("a JPEG whose marker segments are damaged")
        (kind,) = _unpack(">B", data, at + 1)
        if kind == 0xFF:  # fill byte
            at += 1
            continue
        if kind in (0xD8, 0x01) or 0xD0 <= kind <= 0xD7:
            at += 2
            continue
        if kind == 0xD9 or kind == 0xDA:
            raise ImageError("a JPEG with no frame header before its image data")
        (length,) = _unpack(">H", data, at + 2)
        if kind == 0xE1 and data[at + 4:at + 10] == b"Exif\x00\x00" and exif is None:  # Pillow keeps the first
            exif = data[at + 4:at + 2 + length]
        elif kind == 0xE1 and data[at + 4:at + 33] == _XMP_JPEG and xmp is None:
            xmp = data[at + 33:at + 2 + length]
        if kind in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            h, w = _unpack(">HH", data, at + 5)
            return _positive(w, h, "JPEG", _orientation(exif, xmp))
        at += 2 + length


def _webp(data: bytes) -> ImageSize:
    chunk = data[12:16]
    if chunk == b"VP8X":
        (flags,) = _unpack("<B", data, 20)
        _unpack("<3s3s", data, 24)
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return _positive(w, h, "WebP", _webp_orientation(data) if flags & 0x0C else 1)
    if chunk == b"VP8L":
        if data[20:21] != b"\x2f":
            raise ImageError("a lossless WebP without its signature")
        (bits,) = _unpack("<I", data, 21)
        return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, "WebP")
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise ImageError("a lossy WebP without its start code")
        w, h = _unpack("<HH", data, 26)
        return _positive(w & 0x3FFF, h & 0x3FFF, "WebP")
    raise ImageError(f"a WebP whose first chunk is {chunk!r}")


def _webp_orientation(data: bytes) -> int:
    """The orientation in a VP8X WebP's EXIF chunk, else its XMP chunk's."""
    found: dict = {}
    at = 12
    while at + 8 <= len(data):
        kind, length = struct.unpack_from("<4sI", data, at)
        if kind in (b"EXIF", b"XMP ") and kind not in found:
            found[kind] = data[at + 8:at + 8 + length]
        at += 8 + length + (length & 1)
    return _orientation(found.get(b"EXIF"), found.get(b"XMP "))


def _gif(data: bytes) -> ImageSize:
    """The logical screen, grown to the first frame's extent where that is larger (as Pillow does)."""
    w, h, packed = _unpack("<HHB", data, 6)
    at = 13 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
    while True:
        (kind,) = _unpack("<B", data, at)
        if kind == 0x21:  # an extension: its label, then data sub-blocks up to an empty one
            at += 2
            while True:
                (size,) = _unpack("<B", data, at)
                at += 1 + size
                if size == 0:
                    break
        elif kind == 0x2C:
            x0, y0, fw, fh = _unpack("<HHHH", data, at + 1)
            return ImageSize(max(w, x0 + fw), max(h, y0 + fh), 1, "GIF")
        else:  # the trailer, or bytes that are not a block: the screen's size
            return ImageSize(w, h, 1, "GIF")


def _bmp(data: bytes) -> ImageSize:
    (header,) = _unpack("<I", data, 14)
    if header == 12:  # OS/2 BITMAPCOREHEADER
        w, h = _unpack("<HH", data, 18)
    else:
        w, h = _unpack("<ii", data, 18)
    return _positive(w, abs(h), "BMP")


def _tiff(data: bytes, base: int, fmt: str) -> ImageSize:
    """Width, height and orientation from a TIFF's first IFD (``base``: where the TIFF starts)."""
    tags = _ifd(data, base)
    if 256 not in tags or 257 not in tags:
        raise ImageError("a TIFF whose first directory has no width or height")
    return _positive(tags[256], tags[257], fmt, tags.get(274, 1))


def _orientation(exif: bytes | None, xmp: bytes | None) -> int:
    """The orientation as Pillow's ``getexif`` gives it: the EXIF tag, else XMP's ``tiff:Orientation``."""
    found = _exif_orientation(exif) if exif else None
    if found is None and xmp:
        match = _XMP_ORIENTATION.search(xmp)
        found = int(match[2]) if match else None
    return 1 if found is None else found


def _exif_orientation(exif: bytes) -> int | None:
    """The orientation tag of an EXIF block (None: it has none); up to two "Exif" prefixes, as Pillow."""
    exif = re.sub(b"^(Exif\x00\x00){1,2}", b"", exif)
    try:
        return _ifd(exif, 0).get(274)
    except ImageError:
        return None


def _ifd(data: bytes, base: int) -> dict[int, int]:
    """The short or long values of a TIFF structure's first directory."""
    order = data[base:base + 2]
    if order not in (b"II", b"MM"):
        raise ImageError("a TIFF structure without its byte order")
    e = "<" if order == b"II" else ">"
    (first,) = _unpack(e + "I", data, base + 4)
    (count,) = _unpack(e + "H", data, base + first)
    out = {}
    for k in range(count):
        at = base + first + 2 + 12 * k
        tag, kind, _ = _unpack(e + "HHI", data, at)
        if kind == 3:
            (out[tag],) = _unpack(e + "H", data, at + 8)
        elif kind == 4:
            (out[tag],) = _unpack(e + "I", data, at + 8)
    return out
