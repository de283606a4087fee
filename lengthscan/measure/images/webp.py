"""A WebP's size and orientation, its RIFF chunks walked as libwebp's demuxer (which Pillow's
``WebPImageFile`` reads with) walks them.

The size is the simple format's frame (``VP8 ``, ``VP8L``) or the extended format's canvas
(``VP8X``). Only an extended WebP has metadata: its first ``EXIF`` chunk where the ``VP8X`` flags
announce EXIF, its first ``XMP `` chunk where they announce XMP, wherever they lie (Pillow writes
EXIF after the image data). Chunks are reached by seeking past the ones before, never reading the
image data. The RIFF size bounds the chunks (bytes after it are ignored); a file shorter than it,
or a chunk cut short, is refused, as libwebp refuses it.
"""

from __future__ import annotations

import struct

from lengthscan.measure.images.orientation import orientation
from lengthscan.measure.images.reader import CutShort, ImageError, ImageSize, Reader, positive

_IMAGE_CHUNKS = (b"VP8 ", b"VP8L", b"ANMF")


def webp_size(r: Reader) -> ImageSize:
    (riff,) = struct.unpack("<I", r.at(4, 4, "a WebP header"))
    end = 8 + riff
    if end > r.size:
        raise CutShort(f"a WebP whose RIFF size ({riff:,} bytes) runs past the end of the file")
    head = r.at(12, 18, "a WebP header")
    chunk = head[:4]
    if chunk == b"VP8L":
        if head[8:9] != b"\x2f":
            raise ImageError("a lossless WebP without its signature")
        (bits,) = struct.unpack("<I", r.at(21, 4, "a WebP header"))
        return positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, "WebP")
    if chunk == b"VP8 ":
        if head[11:14] != b"\x9d\x01\x2a":
            raise ImageError("a lossy WebP without its start code")
        w, h = struct.unpack("<HH", r.at(26, 4, "a WebP header"))
        return positive(w & 0x3FFF, h & 0x3FFF, "WebP")
    if chunk != b"VP8X":
        raise ImageError(f"a WebP whose first chunk is {chunk!r}")
    (size,) = struct.unpack("<I", head[4:8])
    flags = head[8]
    w = int.from_bytes(head[12:15], "little") + 1
    h = int.from_bytes(r.at(27, 3, "a WebP header"), "little") + 1
    if size < 10:
        raise ImageError("a WebP whose VP8X chunk is too short")
    wanted = {b"EXIF": "exif"} if flags & 0x08 else {}
    if flags & 0x04:
        wanted[b"XMP "] = "xmp"
    info: dict = {}
    seen: set = set()
    has_image = False
    at = 20 + size + (size & 1)
    while at < end:
        r.step()
        if at + 8 > end:
            raise CutShort("a WebP whose last chunk is cut short")
        kind, length = struct.unpack("<4sI", r.near(at, 8, "a WebP chunk"))
        if at + 8 + length > end:
            raise CutShort(f"a WebP whose {kind.decode('latin-1')!r} chunk is cut short")
        has_image = has_image or kind in _IMAGE_CHUNKS
        if kind in wanted and kind not in seen:  # the first one, as libwebp's WebPDemuxGetChunk
            seen.add(kind)
            body = r.at(at + 8, length)
            if body:  # an empty chunk is no metadata (Pillow keeps what is not empty)
                info[wanted[kind]] = body
        at += 8 + length + (length & 1)
    if not has_image:
        raise ImageError("an extended WebP without image data")
    return positive(w, h, "WebP", orientation(info))
