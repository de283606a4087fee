"""AVI: the video stream's frames, duration and size from its RIFF chunks, never reading a frame.

The video stream is the first stream list (``LIST strl``) whose header (``strh``) is of type
``vids``; its number ``nn`` begins its chunks' names (``nndc`` compressed, ``nndb`` uncompressed; FFmpeg
takes any two letters after it but ``pc``, a palette change). What
FFmpeg's demuxer (``avidec.c``) makes of them is what torchcodec's exact scan, and so
transformers' ``VideoMetadata``, reports:

* ``frames``: the stream's chunks that hold data: FFmpeg makes a packet of each, and none of an
  empty one (a dropped frame, which still takes its frame's time). ``avih``'s ``dwTotalFrames``
  and ``strh``'s ``dwLength`` are declarations, not trusted. The chunks are read, in FFmpeg's order
  of preference, from the OpenDML index (``indx`` in the stream list: a super index of ``ix##``
  standard indexes, or one standard index), else the legacy index (``idx1``, after ``movi``: the
  first RIFF's chunks; an ``AVIX`` extension's are walked), else by walking the chunk headers of
  the ``movi`` lists (the first RIFF's and every ``AVIX`` extension's, ``LIST rec `` groups
  included). An index is trusted as it is (FFmpeg reads the chunks in order, and finds what it
  lists); no frame's data is read;
* ``duration``: a chunk lasts one tick of ``dwScale / dwRate`` (the stream's time base), so the
  span of the packets' times is the ticks from the first chunk with data to the end of the last
  (empty chunks between them count; the frame count does not include them): torchcodec's
  ``duration_seconds`` and the divisor of its ``average_fps``;
* ``width``, ``height``: the stream format's (``strf``) BITMAPINFOHEADER, ``biWidth`` and
  ``abs(biHeight)`` (negative for a top-down bitmap); ``rotation`` is always 0 (AVI has none).

A video stream with a sample size (``dwSampleSize``, for video always 0 in practice) is still
counted a chunk a frame. An index entry pointing at the same chunk as the entry before it is
counted once, as FFmpeg does. A file cut short has no usable index (indexes are written last):
its ``movi`` is walked to the end, the chunk it ends inside counted where some of its data is
there, as FFmpeg passes on what there is as a (corrupt) packet and torchcodec counts it (a decoder
may make a frame of it or fail). Every chunk walked is counted (``Reader.step``) and every byte
read budgeted (8 bytes a chunk header, 16 an ``idx1`` entry, 8 an OpenDML entry).
"""

from __future__ import annotations

import struct

import numpy as np

from lengthscan.measure.images.reader import Reader
from lengthscan.measure.video.info import VideoError, VideoInfo

#: a palette change chunk's letters (``##pc``), as the high half of a little-endian fourcc
_PALETTE = struct.unpack("<H", b"pc")[0]


def avi_info(reader: Reader) -> VideoInfo:
    """The first video stream of an AVI file (``VideoError`` where there is none, or it holds no
    frame)."""
    head = reader.at(0, 12, "an AVI header") if reader.size >= 12 else b""
    if head[:4] != b"RIFF" or head[8:12] != b"AVI ":
        raise VideoError(f"not an AVI file (RIFF 'AVI '): it begins {head[:12]!r}")
    riff_size = struct.unpack("<I", head[4:8])[0]
    riff_end = 8 + riff_size if riff_size else reader.size  # 0: written by a muxer that could not seek back
    top = _lists(reader, 12, riff_end)
    if b"hdrl" not in top:
        raise VideoError("an AVI without its header list (LIST hdrl)")
    number, scale, rate, width, height, indx = _video_stream(reader, *top[b"hdrl"])
    prefix = b"%02d" % number
    sizes = _odml_index(reader, indx) if indx is not None else None
    if sizes is None:  # idx1 indexes the first RIFF only; an OpenDML extension's chunks are walked
        first = _idx1(reader, *top[b"idx1"], prefix) if b"idx1" in top else None
        if first is None or first.size == 0:  # FFmpeg reads the chunks themselves all the same
            first = _walk(reader, [top.get(b"movi")], prefix)
        sizes = np.concatenate([first, _walk(reader, _extensions(reader, riff_end), prefix)])
    held = np.flatnonzero(sizes)
    if held.size == 0:
        raise VideoError("the video stream holds no frames")
    duration = (int(held[-1]) + 1 - int(held[0])) * scale / rate
    return VideoInfo(duration, int(held.size), held.size / duration, width, height, 0, "avi")


def _chunks(reader: Reader, start: int, end: int):
    """(fourcc, payload start, payload size) of the chunks in [start, end) (``end`` clamped to the
    file: the last may run past it, in a file cut short)."""
    pos, end = start, min(end, reader.size)
    while pos + 8 <= end:
        reader.step()
        tag, size = struct.unpack("<4sI", reader.at(pos, 8, "a chunk header"))
        yield tag, pos + 8, size
        pos += 8 + size + (size & 1)


def _lists(reader: Reader, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    """The first of each ``LIST`` kind (by its list type) and of each other chunk, as (payload
    start, payload end): ``hdrl``, ``movi``, ``idx1``."""
    out: dict[bytes, tuple[int, int]] = {}
    for tag, body, size in _chunks(reader, start, end):
        if tag == b"LIST" and size >= 4 and body + 4 <= reader.size:
            out.setdefault(reader.at(body, 4, "a list's type"), (body + 4, body + size))
        else:
            out.setdefault(tag, (body, body + size))
    return out


def _video_stream(reader: Reader, start: int, end: int) -> tuple[int, int, int, int, int, bytes | None]:
    """(stream number, dwScale, dwRate, width, height, the ``indx`` payload or None) of the first
    video stream list."""
    number = 0
    for tag, body, size in _chunks(reader, start, end):
        if tag != b"LIST" or size < 4 or reader.at(body, 4, "a list's type") != b"strl":
            continue
        parts = {t: (b, s) for t, b, s in _chunks(reader, body + 4, body + size)}
        strh = _payload(reader, *parts[b"strh"], "a stream header (strh)") if b"strh" in parts else b""
        if strh[:4] == b"vids":
            if len(strh) < 36 or b"strf" not in parts:
                raise VideoError("the video stream's header (strh) or format (strf) is missing or too short")
            scale, rate = struct.unpack_from("<II", strh, 20)
            strf = _payload(reader, *parts[b"strf"], "the video stream's format (strf)")
            if len(strf) < 12:
                raise VideoError("the video stream's format (strf) is too short for a BITMAPINFOHEADER")
            width, height = struct.unpack_from("<ii", strf, 4)
            if scale <= 0 or rate <= 0:
                raise VideoError(f"the video stream's time base is {scale}/{rate}")
            if width <= 0 or height == 0:
                raise VideoError(f"the video stream gives a size of {width}x{height}")
            indx = _payload(reader, *parts[b"indx"], "an OpenDML index (indx)") if b"indx" in parts else None
            return number, scale, rate, width, abs(height), indx
        number += 1
    raise VideoError("no video stream (a stream header of type 'vids')")


def _payload(reader: Reader, start: int, size: int, what: str) -> bytes:
    if start + size > reader.size:
        raise VideoError(f"{what} declares {size:,} bytes, past the end of the file ({reader.size:,} bytes)")
    return reader.at(start, size, what)


def _odml_index(reader: Reader, indx: bytes) -> np.ndarray | None:
    """The chunk sizes the OpenDML index gives the stream, in order; None where it gives none (an
    empty or unreadable one: FFmpeg then falls back on ``idx1``)."""
    if len(indx) < 24:
        return None
    longs, sub_type, kind, count = struct.unpack_from("<HBBI", indx)
    if sub_type != 0 or count == 0:
        return None
    if kind == 1:
        return _standard_index(indx)
    if kind != 0 or longs != 4 or len(indx) < 24 + 16 * count:
        return None
    sizes = []
    for offset, size, _ in struct.iter_unpack("<QII", indx[24:24 + 16 * count]):
        reader.step()
        if size < 8 or offset + size > reader.size:
            return None  # a standard index past the end (a file cut short: its indexes are written last)
        part = _standard_index(reader.at(offset + 8, size - 8, "an OpenDML standard index (ix##)"))
        if part is None:
            return None
        sizes.append(part)
    return np.concatenate(sizes) if sizes else None


def _standard_index(data: bytes) -> np.ndarray | None:
    """The chunk sizes of an OpenDML standard index (``AVI_INDEX_OF_CHUNKS``): its entries' sizes,
    the key frame bit (31) cleared; an entry pointing where the one before it does, dropped."""
    if len(data) < 24:
        return None
    longs, sub_type, kind, count = struct.unpack_from("<HBBI", data)
    if kind != 1 or sub_type != 0 or longs != 2 or len(data) < 24 + 8 * count:
        return None
    entries = np.frombuffer(data, "<u4", 2 * count, 24).reshape(count, 2)
    return _distinct(entries[:, 0], entries[:, 1] & 0x7FFFFFFF)


def _idx1(reader: Reader, start: int, end: int, prefix: bytes) -> np.ndarray | None:
    """The chunk sizes the legacy index gives the stream (``prefix``: its number), in order; None
    where it is cut short (FFmpeg then reads the chunks themselves)."""
    if end > reader.size:
        return None
    count = (end - start) // 16
    entries = np.frombuffer(reader.at(start, 16 * count, "the index (idx1)"), "<u4").reshape(count, 4)
    ids = entries[:, 0]
    mine = entries[((ids & 0xFFFF) == struct.unpack("<H", prefix)[0]) & ((ids >> 16) != _PALETTE)]
    return _distinct(mine[:, 2], mine[:, 3])


def _distinct(offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    keep = np.ones(len(offsets), bool)
    keep[1:] = offsets[1:] != offsets[:-1]
    return sizes[keep].astype(np.int64)


def _extensions(reader: Reader, riff_end: int) -> list[tuple[int, int] | None]:
    """The ``movi`` of every OpenDML extension (``RIFF AVIX``) after the first RIFF."""
    out = []
    for tag, body, size in _chunks(reader, riff_end + (riff_end & 1), reader.size):
        if tag == b"RIFF" and body + 4 <= reader.size and reader.at(body, 4, "a RIFF type") == b"AVIX":
            out.append(_lists(reader, body + 4, body + size).get(b"movi"))
    return out


def _walk(reader: Reader, movis: list[tuple[int, int] | None], prefix: bytes) -> np.ndarray:
    """The sizes of the stream's chunks in the ``movi`` lists, read from their headers (a ``LIST``
    inside, ``rec ``, is stepped into). A chunk the file ends inside is counted where some of its
    data is there: FFmpeg makes a (corrupt) packet of what is."""
    sizes = []
    for movi in movis:
        if movi is None:
            continue
        start, end = movi
        pos, end = start, min(end, reader.size)
        while pos + 8 <= end:
            reader.step()
            tag, size = struct.unpack("<4sI", reader.at(pos, 8, "a chunk header"))
            if tag == b"LIST":
                pos += 12  # into the list: its chunks follow
                continue
            if tag[:2] == prefix and tag[2:] != b"pc":  # any two letters but a palette change, as FFmpeg
                sizes.append(size if pos + 8 < reader.size else 0)
            if pos + 8 + size > reader.size:
                break  # cut short here
            pos += 8 + size + (size & 1)
    return np.array(sizes, np.int64)
