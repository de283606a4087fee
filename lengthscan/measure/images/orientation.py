"""An image's orientation as ``PIL.ImageOps.exif_transpose`` applies it, from the metadata its
format reader found (``info``: the keys Pillow's plugins fill in, ``"exif"``, ``"Raw profile type
exif"``, ``"XML:com.adobe.xmp"``, ``"xmp"``).

Where Pillow is installed (the images extra), the metadata is handed to Pillow's own ``getexif``
(on an empty ``Image`` holding ``info``), so the answer is the installed Pillow's: which EXIF
prefixes it strips, how it reads a malformed directory, XMP when EXIF has no orientation. An EXIF
block Pillow cannot read makes ``exif_transpose`` raise, so the processor cannot open the image:
``ImageError``. Without Pillow, a small reader of the EXIF directory and XMP stands in.
"""

from __future__ import annotations

import re
import struct
import threading

from lengthscan.measure.images.reader import ImageError, OverBudget

#: ``exif_transpose``'s orientations (the others leave the image as it is).
_TRANSPOSED = {2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8}
#: What ``JpegImageFile`` swallows when it reads the EXIF resolution on opening.
_JPEG_OPEN_ERRORS = (struct.error, KeyError, SyntaxError, TypeError, ValueError, ZeroDivisionError)
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')
#: Pillow warns of malformed EXIF; the warnings are silenced while it reads (one reader at a time).
_QUIET = threading.Lock()


def orientation(info: dict, *, jpeg: bool = False) -> int:
    """1-8 as ``exif_transpose`` applies it; ``jpeg``: the image is a JPEG (Pillow reads its EXIF
    on opening where no JFIF resolution is given, and ignores an EXIF block it cannot read then)."""
    if not any(k in info for k in ("exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp")):
        return 1
    try:
        from PIL import Image
    except ImportError:
        return _without_pillow(info)
    import warnings

    image = Image.Image()
    image.info = dict(info)
    with _QUIET, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if jpeg and "dpi" not in info and "exif" in info:
            try:
                image.getexif()
            except OverBudget:
                raise
            except _JPEG_OPEN_ERRORS:
                pass
        return _transposed(image)


def _transposed(image) -> int:
    """``exif_transpose``'s reading of an opened image's orientation (``ImageError`` where it raises)."""
    try:
        value = image.getexif().get(274, 1)
        return _TRANSPOSED.get(value, 1)
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Pillow raises here, exif_transpose raises too
        raise ImageError(f"its EXIF data is unreadable to Pillow ({type(exc).__name__}: {exc}): the processor "
                         "cannot open it") from None


def pillow_tiff(reader) -> tuple[int, int, int]:
    """(width, height, orientation) of a TIFF as Pillow's ``TiffImageFile`` reads its first
    directory (through ``reader``: within its budget), or None without Pillow."""
    try:
        from PIL import TiffImagePlugin
    except ImportError:
        return None
    import warnings

    reader.seek(0)
    with _QUIET, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            image = TiffImagePlugin.TiffImageFile(reader)
        except ImageError:
            raise
        except Exception as exc:  # noqa: BLE001 - Pillow cannot open it: neither can the processor
            raise ImageError(f"a TIFF Pillow cannot open ({type(exc).__name__}: {exc})") from None
        # the stored size (Pillow 13 swaps ``size`` on opening and transposes on loading, where
        # ``exif_transpose`` then finds nothing to do: the size seen is the same)
        return image.tag_v2[256], image.tag_v2[257], _transposed(image)


def _without_pillow(info: dict) -> int:
    """Pillow's reading, approximately: the EXIF directory's orientation, else XMP's."""
    exif = info.get("exif")
    if exif is None and "Raw profile type exif" in info:
        try:
            exif = bytes.fromhex("".join(info["Raw profile type exif"].split("\n")[3:]))
        except ValueError:
            exif = None
    found = None
    if isinstance(exif, bytes):
        try:
            found = ifd_values(re.sub(b"^(Exif\x00\x00){1,2}", b"", exif), 0).get(274)
        except (ImageError, struct.error):
            found = None
    if found is None:
        xmp = info.get("XML:com.adobe.xmp") or info.get("xmp")
        if isinstance(xmp, str):
            xmp = xmp.encode("utf-8", "replace")
        match = _XMP_ORIENTATION.search(xmp) if xmp else None
        found = int(match[2]) if match else None
    return _TRANSPOSED.get(found, 1)


def ifd_values(data: bytes, base: int) -> dict[int, int]:
    """The short or long values of the first directory of a TIFF structure at ``base`` in ``data``."""
    order = data[base:base + 2]
    if order not in (b"II", b"MM"):
        raise ImageError("a TIFF structure without its byte order")
    e = "<" if order == b"II" else ">"
    (first,) = struct.unpack_from(e + "I", data, base + 4)
    (count,) = struct.unpack_from(e + "H", data, base + first)
    out = {}
    for k in range(count):
        at = base + first + 2 + 12 * k
        tag, kind, _ = struct.unpack_from(e + "HHI", data, at)
        if kind == 3:
            out.setdefault(tag, struct.unpack_from(e + "H", data, at + 8)[0])
        elif kind == 4:
            out.setdefault(tag, struct.unpack_from(e + "I", data, at + 8)[0])
    return out
