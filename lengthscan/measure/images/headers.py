"""Image sizes from their headers, never decoding: PNG, JPEG, WebP, GIF, BMP and TIFF.

``image_size(data)`` reads an image's bytes, ``image_size_from(path)`` a file (a regular one: a FIFO,
socket, device or folder is refused unread), and both return ``ImageSize(width, height,
orientation)``: the size as stored, and the orientation ``PIL.ImageOps.exif_transpose`` applies (1-8,
where 5-8 swap width and height). Each format is walked as Pillow's reader walks it, seeking past the
image data (a PNG's or WebP's metadata may follow it) and reading within a budget
(``reader.READ_BUDGET``, ``reader.INFLATE_BUDGET``), so a hostile header cannot make it read or
inflate without bound. ``ImageError`` names what is wrong with an unreadable header, or why Pillow
would refuse the file.
"""

from __future__ import annotations

import struct

from lengthscan.measure.images.jpeg import jpeg_size
from lengthscan.measure.images.orientation import ifd_values, pillow_tiff
from lengthscan.measure.images.png import SIGNATURE, png_size
from lengthscan.measure.images.reader import (
    CutShort,
    ImageError,
    ImageSize,
    OverBudget,
    Reader,
    open_regular,
    positive,
)
from lengthscan.measure.images.webp import webp_size

#: The TIFF headers Pillow opens (``TiffImagePlugin.PREFIXES``): classic and BigTIFF, either byte
#: order, and the two that swap the version's bytes.
_TIFF = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+", b"MM*\x00", b"II\x00*")

__all__ = ["CutShort", "ImageError", "ImageSize", "OverBudget", "image_size", "image_size_from"]


def image_size(data: bytes) -> ImageSize:
    """The size in an image's header (``data``: the image's bytes)."""
    return _size(Reader.of_bytes(bytes(data)))


def image_size_from(path) -> ImageSize:
    """``image_size`` of the file at ``path`` (``ImageError`` where it is not a regular file)."""
    with open_regular(path) as fh:
        return _size(Reader(fh))


def _size(r: Reader) -> ImageSize:
    head = r.upto(0, 16)
    if head.startswith(SIGNATURE):
        return png_size(r)
    if head.startswith(b"\xff\xd8"):
        return jpeg_size(r)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return webp_size(r)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(r)
    if head[:2] == b"BM":
        return _bmp(r)
    if head[:4] in _TIFF:
        return _tiff(r)
    raise ImageError("not a PNG, JPEG, WebP, GIF, BMP or TIFF image")


def _gif(r: Reader) -> ImageSize:
    """The logical screen, grown to the first frame's extent where that is larger, as Pillow's
    ``GifImageFile`` reads them (bytes that start no block skipped; no frame: Pillow refuses it)."""
    w, h, packed = struct.unpack("<HHB", r.at(6, 5, "a GIF header"))
    byte = r.byte
    at = 13 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
    while True:
        r.step()
        kind = byte(at)
        if kind is None or kind == 0x3B:  # the end, or the trailer, before any frame
            raise ImageError("a GIF without an image")
        if kind == 0x2C:  # an image descriptor, then its palette, then its code size
            x0, y0, fw, fh, flags = struct.unpack("<HHHHB", r.at(at + 1, 9, "a GIF image descriptor"))
            palette = 3 << ((flags & 7) + 1) if flags & 0x80 else 0
            if byte(at + 10 + palette) is None:
                raise CutShort("a GIF whose first image is cut short")
            if not fw or not fh:
                raise ImageError(f"a GIF whose first image is {fw}x{fh}: Pillow cannot load it")
            return ImageSize(max(w, x0 + fw), max(h, y0 + fh), 1, "GIF")
        at += 1
        if kind != 0x21:  # a byte that starts no block: Pillow reads on
            continue
        if byte(at) is None:
            raise CutShort("a GIF extension is cut short")
        at += 1  # past its label: data sub-blocks up to an empty one (or the end of the file)
        while (size := byte(at)) is not None:
            r.step()
            at += 1 + size
            if size == 0:
                break


def _bmp(r: Reader) -> ImageSize:
    """The size in a BMP's info header, as Pillow's ``BmpImageFile`` reads it; an uncompressed
    bitmap whose rows the file does not hold is cut short (Pillow cannot load it)."""
    data_at, header = struct.unpack("<II", r.at(10, 8, "a BMP header"))
    if header not in (12, 40, 52, 56, 64, 108, 124):
        raise ImageError(f"a BMP info header of {header} bytes, which Pillow does not read")
    info = r.at(18, header - 4, "a BMP info header")
    if header == 12:  # OS/2 BITMAPCOREHEADER
        w, h, _, bits = struct.unpack("<HHHH", info[:8])
        compression = 0
    else:
        w, h, _, bits, compression = struct.unpack("<iiHHI", info[:16])
        h = abs(h)
    if compression == 0 and bits in (1, 2, 4, 8, 16, 24, 32) and w > 0:
        rows = (w * bits + 31) // 32 * 4
        if data_at + rows * h > r.size:
            raise CutShort(f"a BMP whose pixel rows are cut short ({r.size:,} bytes for {data_at + rows * h:,})")
    return positive(w, h, "BMP")


def _tiff(r: Reader) -> ImageSize:
    """Width, height and orientation of a TIFF's first directory, read by Pillow's own
    ``TiffImageFile`` through the budgeted reader (a small reader of its own without Pillow)."""
    read = pillow_tiff(r)
    if read is not None:
        w, h, orientation = read
        return positive(w, h, "TIFF", orientation)
    head = r.at(0, 8, "a TIFF header")
    if head[:4] not in _TIFF[:2]:
        raise ImageError("a BigTIFF, which lengthscan reads with Pillow only (pip install pillow)")
    e = "<" if head[:2] == b"II" else ">"
    (first,) = struct.unpack(e + "I", head[4:8])
    (count,) = struct.unpack(e + "H", r.at(first, 2, "a TIFF directory"))
    entries = r.at(first + 2, 12 * count, "a TIFF directory")
    tags = ifd_values(head[:4] + struct.pack(e + "I", 8) + struct.pack(e + "H", count) + entries, 0)
    if 256 not in tags or 257 not in tags:
        raise ImageError("a TIFF whose first directory has no width or height")
    return positive(tags[256], tags[257], "TIFF", tags.get(274, 1))
