"""Where a conversation's images are, and their sizes read from headers.

An image is given as a path (relative paths resolve against the data file's folder, then the
working directory), as bytes, as a ``data:image/...;base64,`` URI, or as the ``{"bytes", "path"}``
dict of a ``datasets`` ``Image(decode=False)`` value. ``image_sizes`` reads each header once
(``headers.image_size``) and returns the size the model's processor sees: the EXIF orientation
applied, as ``transformers``' ``load_image`` and ``datasets``' decoding both apply it.
A bad image never raises: it comes back as an ``ImageProblem`` naming the image and what is wrong
(a path that is a FIFO, socket, device or folder is refused unread: ``unreadable``, "not a regular
file"; so is an image whose metadata is over the reading budget of ``images.reader``).
"""

from __future__ import annotations

import base64
import binascii
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lengthscan.measure.images.headers import ImageError, image_size, image_size_from
from lengthscan.sources.urls import display_url

#: Files whose headers are read at once (reads of cold files overlap).
READ_THREADS = 8


@dataclass(frozen=True)
class ImageProblem:
    """An image that has no size: ``flag`` (missing_file, unreadable) and the reason."""

    flag: str
    reason: str


@dataclass(frozen=True)
class Seen:
    """An image as the processor sees it: width and height once oriented, and what it was."""

    width: int
    height: int
    label: str   # the path, or "<N bytes>"


def describe(ref) -> str:
    """A short name of an image reference, for reasons and reports."""
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return describe(ref["bytes"])
        return describe(ref.get("path"))
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return f"<{len(ref):,} bytes>"
    if isinstance(ref, str) and ref.startswith("data:"):
        return f"<data URI, {len(ref):,} chars>"
    return display_url(str(ref))  # a URL without its credentials and signed query


def image_sizes(refs: list, base_dir: str | None) -> list:
    """Per reference: a ``Seen`` or an ``ImageProblem``. A path (or data URI) given several times
    is read once: rows that share an image, or one row that repeats it, cost one read."""
    limit = _pillow_limit()
    keys = [r if isinstance(r, str) else ("path", r["path"]) if _path_only(r) else k for k, r in enumerate(refs)]
    first = {}
    for k, key in enumerate(keys):
        first.setdefault(key, k)
    todo = sorted(set(first.values()))
    if len(todo) < 4:
        found = [_size(refs[k], base_dir, limit) for k in todo]
    else:
        with ThreadPoolExecutor(min(READ_THREADS, len(todo))) as pool:
            found = list(pool.map(lambda k: _size(refs[k], base_dir, limit), todo))
    by_first = dict(zip(todo, found))
    return [by_first[first[key]] for key in keys]


def _path_only(ref) -> bool:
    """An ``Image(decode=False)`` value that is a path alone."""
    return isinstance(ref, dict) and ref.get("bytes") is None and isinstance(ref.get("path"), str)


def _size(ref, base_dir: str | None, limit: int | None):
    if hasattr(ref, "size") and hasattr(ref, "getexif"):  # a decoded PIL image (datasets' Image(), oriented)
        return Seen(ref.size[0], ref.size[1], "<decoded image>")
    label = describe(ref)
    try:
        data, path = _resolve(ref, base_dir)
    except ImageError as exc:
        return ImageProblem("unreadable", f"image {label!r}: {exc}")
    if data is None and path is None:
        return ImageProblem("missing_file", "an image is missing (null)")
    try:
        size = image_size(data) if data is not None else image_size_from(path)
    except FileNotFoundError:
        return ImageProblem("missing_file", f"image {label!r}: no such file")
    except (IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        return ImageProblem("missing_file", f"image {label!r}: {exc.strerror}")
    except ImageError as exc:
        return ImageProblem("unreadable", f"image {label!r}: {exc}")
    except OSError as exc:
        return ImageProblem("unreadable", f"image {label!r}: {exc.strerror or exc}")
    except ValueError as exc:  # a path holding a NUL character
        return ImageProblem("missing_file", f"image {label!r}: {exc}")
    width, height = size.oriented()
    if limit is not None and width * height > limit:
        return ImageProblem("unreadable", f"image {label!r}: {width:,}x{height:,} is over Pillow's decompression-bomb "
                                          f"limit ({limit:,} pixels): the processor cannot open it")
    return Seen(width, height, label)


def _pillow_limit() -> int | None:
    """The pixels over which Pillow refuses to open an image (``DecompressionBombError``: twice
    ``Image.MAX_IMAGE_PIXELS``); None without Pillow or without a limit."""
    try:
        from PIL import Image
    except ImportError:
        return None
    top = Image.MAX_IMAGE_PIXELS
    return 2 * int(top) if top else None


def _resolve(ref, base_dir: str | None) -> tuple[bytes | None, str | None]:
    """(bytes, path) of an image reference."""
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return _resolve(ref["bytes"], base_dir)
        return _resolve(ref.get("path"), base_dir)
    if ref is None:
        return None, None
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref), None
    if isinstance(ref, str):
        if ref.startswith("data:"):
            return _data_uri(ref), None
        scheme, sep, _ = ref.partition("://")
        if sep and scheme.isalnum() and len(scheme) > 1:
            raise ImageError("a URL; lengthscan reads local image files and bytes (download the images first)")
        return None, local_path(ref, base_dir)
    if isinstance(ref, os.PathLike):
        return None, local_path(os.fspath(ref), base_dir)
    raise ImageError(f"a {type(ref).__name__}, not a path, bytes or a {{'bytes', 'path'}} dict")


def local_path(path: str, base_dir: str | None) -> str:
    """A relative image path resolved: beside the data file, else from the working directory where
    only that exists."""
    if os.path.isabs(path) or base_dir is None or "://" in base_dir:
        return path
    beside = os.path.join(base_dir, path)
    return beside if os.path.exists(beside) or not os.path.exists(path) else path


def _data_uri(uri: str) -> bytes:
    head, sep, body = uri.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError("a data URI that is not base64")
    try:
        return base64.b64decode(body, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"a data URI whose base64 does not decode ({exc})") from None
