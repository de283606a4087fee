"""MP4, MOV (QuickTime) and other ISO base media files: a video track's frames, duration, size and
rotation from the boxes that describe it, never reading a frame.

The video track is the first ``trak`` whose handler (``mdia/hdlr``) is ``vide``. From it:

* ``frames``: the sample count of its sample table (``stsz``/``stz2``); a fragmented file (the
  ``moov`` holding no samples) adds every ``moof/traf/trun`` of the track: what a demuxer reads as
  packets, and what torchcodec's exact mode counts;
* ``duration``: the sum of the samples' durations (``stts``; a fragment's ``trun`` durations, or
  its ``tfhd``/``trex`` default) over the media timescale (``mdhd``), else ``mdhd``'s duration;
* ``width``, ``height``: the coded size of the first sample entry (``stsd``'s visual entry, as the
  decoder opens it; ``tkhd``'s size is the display size, aspect ratio applied);
* ``rotation``: from ``tkhd``'s matrix, the angle a player rotates by (FFmpeg's display matrix).

Boxes are walked through a budgeted ``Reader``: the ``mdat`` (the frames) is seeked past, every
box counted, and a size that runs past its parent or the file is an error naming the box.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from lengthscan.measure.images.reader import CutShort, Reader
from lengthscan.measure.video.info import VideoError, VideoInfo

#: boxes that hold other boxes, on the way to what is read
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"mvex", b"edts"}


def boxes(reader: Reader, start: int, end: int):
    """(type, payload start, payload end) of the boxes in [start, end)."""
    pos = start
    while pos + 8 <= end:
        reader.step()
        size, kind = struct.unpack(">I4s", reader.near(pos, 8, "a box header"))
        head = 8
        if size == 1:
            size = struct.unpack(">Q", reader.near(pos + 8, 8, "a box header"))[0]
            head = 16
        elif size == 0:  # to the end of its parent
            size = end - pos
        if size < head or pos + size > end:
            if pos + size > end >= reader.size and kind == b"mdat":  # a cut file's frames: not read anyway
                return
            raise VideoError(f"the {kind.decode('latin-1')!r} box at byte {pos:,} declares {size:,} bytes, past "
                             f"{'the file' if end >= reader.size else 'its parent box'}")
        yield kind, pos + head, pos + size
        pos += size


def _children(reader: Reader, start: int, end: int) -> dict[bytes, list[tuple[int, int]]]:
    out: dict[bytes, list[tuple[int, int]]] = {}
    for kind, a, b in boxes(reader, start, end):
        out.setdefault(kind, []).append((a, b))
    return out


def _full(reader: Reader, a: int, b: int, what: str) -> tuple[int, bytes]:
    """A full box's (version, payload after version and flags)."""
    if b - a > 64 << 20:
        raise VideoError(f"the {what} box holds {b - a:,} bytes (lengthscan reads no more of one)")
    data = reader.at(a, b - a, f"the {what} box")
    if len(data) < 4:
        raise VideoError(f"the {what} box is empty")
    return data[0], data[4:]


def isobmff_info(reader: Reader) -> VideoInfo:
    """The video track of an ISO base media file (``VideoError`` where there is none)."""
    top = _children(reader, 0, reader.size)
    brand = reader.at(top[b"ftyp"][0][0], 4, "the ftyp box") if b"ftyp" in top else b""
    if b"moov" not in top:
        raise VideoError("no moov box (the file's description): not a complete MP4/MOV, or its end is missing")
    moov_a, moov_b = top[b"moov"][0]
    moov = _children(reader, moov_a, moov_b)
    for a, b in moov.get(b"trak", []):
        track = _track(reader, a, b)
        if track is None:
            continue
        track_id, timescale, mdhd_duration, frames, ticks, width, height, rotation = track
        if b"moof" in top:
            more_frames, more_ticks = _fragments(reader, top[b"moof"], track_id, _trex(reader, moov, track_id))
            frames, ticks = frames + more_frames, ticks + more_ticks
        if timescale <= 0:
            raise VideoError("the video track's timescale (mdhd) is 0")
        duration = (ticks if ticks else mdhd_duration) / timescale
        container = "mov" if brand == b"qt  " else "mp4"
        fps = frames / duration if duration > 0 else None
        return VideoInfo(duration, frames, fps, width, height, rotation, container)
    raise VideoError("no video track (a trak whose handler is 'vide')")


def _track(reader: Reader, a: int, b: int):
    """(track id, timescale, mdhd duration, samples, their ticks, width, height, rotation) of a
    video ``trak``; None for another kind of track."""
    trak = _children(reader, a, b)
    if b"mdia" not in trak or b"tkhd" not in trak:
        return None
    mdia = _children(reader, *trak[b"mdia"][0])
    if b"hdlr" not in mdia or _full(reader, *mdia[b"hdlr"][0], "hdlr")[1][4:8] != b"vide":
        return None
    version, tkhd = _full(reader, *trak[b"tkhd"][0], "tkhd")
    track_id = struct.unpack(">I", tkhd[16 if version else 8:][:4])[0]
    matrix = tkhd[48 if version else 36:][:36]  # after the times, id, duration, layer, group, volume
    rotation = _rotation(matrix) if len(matrix) == 36 else 0
    if b"mdhd" not in mdia:
        raise VideoError("the video track has no mdhd box (its timescale)")
    version, mdhd = _full(reader, *mdia[b"mdhd"][0], "mdhd")
    timescale, duration = struct.unpack(">IQ" if version else ">II", mdhd[16:28] if version else mdhd[8:16])
    if b"minf" not in mdia:
        raise VideoError("the video track has no minf box")
    minf = _children(reader, *mdia[b"minf"][0])
    if b"stbl" not in minf:
        raise VideoError("the video track has no sample table (stbl)")
    stbl = _children(reader, *minf[b"stbl"][0])
    width, height = _coded_size(reader, stbl)
    frames = _sample_count(reader, stbl)
    _check_held(reader, stbl)
    ticks = _ticks(reader, stbl)
    return track_id, timescale, duration, frames, ticks, width, height, rotation


def _coded_size(reader: Reader, stbl: dict) -> tuple[int, int]:
    if b"stsd" not in stbl:
        raise VideoError("the video track has no sample description (stsd)")
    _, stsd = _full(reader, *stbl[b"stsd"][0], "stsd")
    if len(stsd) < 4 + 8 + 28 or struct.unpack(">I", stsd[:4])[0] < 1:
        raise VideoError("the video track's sample description (stsd) holds no entry")
    width, height = struct.unpack(">HH", stsd[4 + 8 + 24:4 + 8 + 28])  # VisualSampleEntry's width, height
    if width <= 0 or height <= 0:
        raise VideoError(f"the video track's sample entry gives a size of {width}x{height}")
    return width, height


def _sample_count(reader: Reader, stbl: dict) -> int:
    for kind, offset in ((b"stsz", 4), (b"stz2", 4)):
        if kind in stbl:
            _, body = _full(reader, *stbl[kind][0], kind.decode())
            if len(body) < offset + 4:
                raise CutShort(f"the {kind.decode()} box is cut short")
            return struct.unpack(">I", body[offset:offset + 4])[0]
    if b"stts" in stbl:
        return sum(n for n, _ in _stts(reader, stbl))
    raise VideoError("the video track has no sample sizes (stsz) or times (stts)")


def _check_held(reader: Reader, stbl: dict) -> None:
    """``VideoError`` where the last chunk of frames ends past the file's end (a cut file: its
    description promises frames that are not there, which a decoder would not find)."""
    for kind, size in ((b"stco", 4), (b"co64", 8)):
        if kind not in stbl:
            continue
        a, b = stbl[kind][0]
        count = struct.unpack(">I", reader.at(a + 4, 4, f"the {kind.decode()} box"))[0]
        if not count or b - a < 8 + count * size:
            return
        offset = int.from_bytes(reader.at(a + 8 + (count - 1) * size, size, f"the {kind.decode()} box"), "big")
        end = offset + _last_chunk_bytes(reader, stbl)
        if end > reader.size:
            raise VideoError(f"the file is cut short: its last frames end at byte {end:,}, past its end "
                             f"({reader.size:,} bytes)")
        return


def _last_chunk_bytes(reader: Reader, stbl: dict) -> int:
    """The bytes of the last chunk's samples (``stsc``'s last entry, ``stsz``'s sizes; 0 where unknown)."""
    if b"stsc" not in stbl or b"stsz" not in stbl:
        return 0
    _, stsc = _full(reader, *stbl[b"stsc"][0], "stsc")
    entries = struct.unpack(">I", stsc[:4])[0] if len(stsc) >= 4 else 0
    if not entries or len(stsc) < 4 + 12 * entries:
        return 0
    per_chunk = struct.unpack_from(">I", stsc, 4 + 12 * (entries - 1) + 4)[0]
    _, stsz = _full(reader, *stbl[b"stsz"][0], "stsz")
    fixed, samples = struct.unpack(">II", stsz[:8])
    if fixed:
        return fixed * min(per_chunk, samples)
    sizes = np.frombuffer(stsz[8:8 + 4 * samples], ">u4")
    return int(sizes[max(0, len(sizes) - per_chunk):].astype(np.int64).sum())


def _stts(reader: Reader, stbl: dict) -> list[tuple[int, int]]:
    _, body = _full(reader, *stbl[b"stts"][0], "stts")
    count = struct.unpack(">I", body[:4])[0] if len(body) >= 4 else 0
    if len(body) < 4 + 8 * count:
        raise CutShort("the stts box (sample times) is cut short")
    return list(struct.iter_unpack(">II", body[4:4 + 8 * count]))


def _ticks(reader: Reader, stbl: dict) -> int:
    """The span of the samples' presentation times: the latest end (time plus duration) less the
    earliest time, composition offsets (``ctts``: frames stored out of order) applied."""
    if b"stts" not in stbl:
        return 0
    table = _stts(reader, stbl)
    counts = np.array([n for n, _ in table], np.int64)
    deltas = np.repeat(np.array([d for _, d in table], np.int64), counts)
    if b"ctts" not in stbl or not deltas.size:
        return int(deltas.sum())
    version, body = _full(reader, *stbl[b"ctts"][0], "ctts")
    count = struct.unpack(">I", body[:4])[0] if len(body) >= 4 else 0
    if len(body) < 4 + 8 * count:
        raise CutShort("the ctts box (composition offsets) is cut short")
    pairs = np.frombuffer(body[4:4 + 8 * count], (">u4" if not version else ">i4")).astype(np.int64).reshape(-1, 2)
    offsets = np.repeat(pairs[:, 1], pairs[:, 0])
    return _span(deltas, offsets)


def _span(deltas: np.ndarray, offsets: np.ndarray) -> int:
    """max(pts + duration) - min(pts), pts = dts + offset (offsets short of the samples: 0)."""
    n = min(len(deltas), len(offsets))
    pts = np.cumsum(deltas) - deltas
    pts[:n] += offsets[:n]
    return int((pts + deltas).max() - pts.min())


def _trex(reader: Reader, moov: dict, track_id: int) -> int:
    """The track's default sample duration for fragments (``mvex/trex``; 0: none)."""
    if b"mvex" not in moov:
        return 0
    for a, b in _children(reader, *moov[b"mvex"][0]).get(b"trex", []):
        _, body = _full(reader, a, b, "trex")
        if len(body) >= 12 and struct.unpack(">I", body[:4])[0] == track_id:
            return struct.unpack(">I", body[8:12])[0]
    return 0


def _fragments(reader: Reader, moofs: list, track_id: int, default_duration: int) -> tuple[int, int]:
    """(samples, ticks) of the track in every movie fragment."""
    frames = ticks = 0
    for a, b in moofs:
        for t_a, t_b in _children(reader, a, b).get(b"traf", []):
            traf = _children(reader, t_a, t_b)
            if b"tfhd" not in traf:
                continue
            _, tfhd = _full(reader, *traf[b"tfhd"][0], "tfhd")
            flags = struct.unpack(">I", reader.at(traf[b"tfhd"][0][0], 4, "the tfhd box"))[0] & 0xFFFFFF
            if struct.unpack(">I", tfhd[:4])[0] != track_id:
                continue
            at, duration = 4, default_duration
            for bit, size in ((0x1, 8), (0x2, 4)):
                at += size if flags & bit else 0
            if flags & 0x8:
                duration = struct.unpack(">I", tfhd[at:at + 4])[0]
            for r_a, r_b in traf.get(b"trun", []):
                n, spent = _trun(reader, r_a, r_b, duration)
                frames, ticks = frames + n, ticks + spent
    return frames, ticks


def _trun(reader: Reader, a: int, b: int, default_duration: int) -> tuple[int, int]:
    flags = struct.unpack(">I", reader.at(a, 4, "the trun box"))[0] & 0xFFFFFF
    version, body = _full(reader, a, b, "trun")
    count = struct.unpack(">I", body[:4])[0]
    at = 4 + (4 if flags & 0x1 else 0) + (4 if flags & 0x4 else 0)
    fields = [bit for bit in (0x100, 0x200, 0x400, 0x800) if flags & bit]
    stride = 4 * len(fields)
    if len(body) < at + stride * count:
        raise CutShort("a trun box (a fragment's samples) is cut short")
    table = np.frombuffer(body[at:at + stride * count], ">u4").astype(np.int64).reshape(count, len(fields))
    deltas = table[:, 0] if flags & 0x100 else np.full(count, default_duration, np.int64)
    if not flags & 0x800 or not count:
        return count, int(deltas.sum())
    offsets = table[:, fields.index(0x800)]
    if version:
        offsets = offsets.astype(np.uint32).view(np.int32).astype(np.int64)
    return count, _span(deltas, offsets)


def _rotation(matrix: bytes) -> int:
    """The rotation of ``tkhd``'s transformation matrix, in degrees (0, 90, 180, 270), as FFmpeg
    reads it from the display matrix (``av_display_rotation_get``, modulo 360)."""
    a, b, _, c, d = struct.unpack(">iiiii", matrix[:20])
    if not any((a, b, c, d)):
        return 0
    return -int(round(math.degrees(math.atan2(b, a)) / 90.0)) * 90 % 360
