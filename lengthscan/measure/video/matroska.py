"""Matroska and WebM: a video track's frames, duration, size and rotation from the EBML elements
that describe it, never reading a frame.

Matroska declares no frame count, so the Segment's Clusters are walked element by element (known
or unknown size: a live WebM's Cluster ends where an element that cannot be its child begins),
each ``SimpleBlock`` and ``BlockGroup``'s ``Block`` read only for its header (track number,
timestamp, lacing) and seeked past. What FFmpeg's demuxer (``matroskadec.c``) makes of them is
what torchcodec's exact scan, and so transformers' ``VideoMetadata``, reports:

* ``frames``: the video track's packets: one per Block, one per lace of a laced Block (the count
  is in the Block's header); an unlaced Block with no data is no packet (FFmpeg drops it). An empty
  lace inside a laced Block is counted (FFmpeg drops it too; reading lace sizes is not worth it for
  a lacing video tracks do not use);
* ``duration``: the span of the packets' times, the latest end less the earliest start: a Block's
  time is its Cluster's ``Timestamp`` plus its own offset, its end that time plus its
  ``BlockDuration``, else its track's ``DefaultDuration`` times its laces over the
  ``TimestampScale``, truncated to a tick as FFmpeg does. This is torchcodec's ``duration_seconds``
  and the divisor of its ``average_fps``, so ``fps`` is theirs. The Segment Info's ``Duration``
  (what ``av.open(p).duration`` reports) is the whole Segment's, every track's latest end rounded
  by the muxer: it can differ from the video's span by a tick (5 frames at 24000/1001 fps: 0.209 s
  against 0.208 s), or by much more where audio runs longer; it is used only where the Blocks
  give no span (one frame without a duration);
* ``width``, ``height``: the track's ``PixelWidth`` and ``PixelHeight`` (the coded size);
* ``rotation``: from the track's ``Projection``: a rectangular projection's ``ProjectionPoseRoll``
  (and a yaw of 180, a mirror), as FFmpeg turns it into a display matrix, read back as
  ``av_display_rotation_get`` (modulo 360) as for MP4; 0 otherwise.

The video track is the first ``TrackEntry`` of type 1. ``TrackTimestampScale`` (deprecated) is
ignored. A file cut short gives the frames whose Blocks are wholly in it (FFmpeg drops a cut
Block, so this is its count too); an element that runs past its parent, or a header element past
the file, is a ``VideoError``. Every element walked is counted (``Reader.step``) and every byte
read budgeted (24 bytes a Block): past ``headers.VIDEO_STEPS`` elements (5,000,000: about 10 hours
at 60 frames a second with an audio track) a file is refused with ``OverBudget``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from lengthscan.measure.images.reader import Reader
from lengthscan.measure.video.info import VideoError, VideoInfo

EBML, SEGMENT, INFO, TRACKS, CLUSTER = 0x1A45DFA3, 0x18538067, 0x1549A966, 0x1654AE6B, 0x1F43B675
TIMESTAMP, SIMPLE_BLOCK, BLOCK_GROUP, BLOCK, BLOCK_DURATION = 0xE7, 0xA3, 0xA0, 0xA1, 0x9B
#: what a Cluster may hold (Timestamp, SilentTracks, Position, PrevSize, SimpleBlock, BlockGroup,
#: EncryptedBlock, Void, CRC-32): any other element ends a Cluster of unknown size
_CLUSTER_CHILDREN = {TIMESTAMP, 0x5854, 0xA7, 0xAB, SIMPLE_BLOCK, BLOCK_GROUP, 0xAF, 0xEC, 0xBF}
_DEFAULT_SCALE = 1_000_000  # ns a tick


@dataclass
class _Track:
    number: int = 0
    kind: int = 0
    default_duration: int = 0  # ns a frame; 0: none
    width: int = 0
    height: int = 0
    rotation: int = 0


@dataclass
class _Count:
    """One track's Blocks: packets, the earliest time, the latest explicit end, and the latest
    time of the Blocks timed by ``DefaultDuration`` by their lace count (ticks)."""

    frames: int = 0
    first: int | None = None
    end: int | None = None
    implicit: dict[int, int] = field(default_factory=dict)

    def add(self, time: int | None, laces: int, duration: int | None) -> None:
        self.frames += laces
        if time is None:
            return
        self.first = time if self.first is None else min(self.first, time)
        if duration is None:
            self.implicit[laces] = max(self.implicit.get(laces, time), time)
        else:
            self.end = time + duration if self.end is None else max(self.end, time + duration)

    def span(self, default_duration: int, scale: int) -> int:
        """The latest end less the earliest time (ticks); 0 where no Block was timed."""
        ends = [t + default_duration * laces // scale for laces, t in self.implicit.items()]
        ends += [self.end] if self.end is not None else []
        return max(ends) - self.first if ends and self.first is not None else 0


def matroska_info(reader: Reader) -> VideoInfo:
    """The first video track of a Matroska or WebM file (``VideoError`` where there is none, or
    it holds no frame)."""
    doctype, pos = _ebml_header(reader)
    segment = _element(reader, pos)
    if segment is None or segment[0] != SEGMENT:
        raise VideoError("no Segment after the EBML header")
    _, size, body = segment
    scale, declared, tracks, counts = _segment(reader, body, None if size is None else body + size)
    video = next((t for t in tracks if t.kind == 1), None)
    if video is None:
        raise VideoError("no video track (a TrackEntry of TrackType 1)")
    count = counts.get(video.number, _Count())
    if count.frames == 0:
        raise VideoError("the video track holds no frames")
    if video.width <= 0 or video.height <= 0:
        raise VideoError(f"the video track gives a size of {video.width}x{video.height}")
    ticks = count.span(video.default_duration, scale)
    duration = ticks * scale / 1e9 if ticks > 0 else declared * scale / 1e9
    fps = count.frames / duration if duration > 0 else None
    container = "webm" if doctype == "webm" else "matroska"
    return VideoInfo(duration, count.frames, fps, video.width, video.height, video.rotation, container)


def _ebml_header(reader: Reader) -> tuple[str, int]:
    """(DocType, where the header ends)."""
    element = _element(reader, 0)
    if element is None or element[0] != EBML or element[1] is None:
        raise VideoError("not an EBML file (Matroska/WebM): no EBML header")
    _, size, body = element
    fields = dict(_children(_master(reader, body, size, "the EBML header")))
    doctype = fields.get(0x4282, b"matroska").rstrip(b"\0").decode("latin-1")
    limits = {0x42F7: 1, 0x42F2: 4, 0x42F3: 8, 0x4285: 3}  # EBML and DocType read versions, ID and size lengths
    if any(_uint(fields.get(eid, b"")) > most for eid, most in limits.items()):
        raise VideoError("an EBML header asking for features FFmpeg does not read (versions, ID or size lengths)")
    return doctype, body + size


def _segment(reader: Reader, start: int, end: int | None) -> tuple[int, float, list[_Track], dict[int, _Count]]:
    """(TimestampScale, Duration in ticks, tracks, Blocks counted by track) of a Segment."""
    scale, declared, tracks, counts = _DEFAULT_SCALE, 0.0, [], {}
    limit = reader.size if end is None else min(end, reader.size)
    pos = start
    while pos < limit:
        reader.step()
        element = _element(reader, pos)
        if element is None:
            break  # the file ends inside an element's header
        eid, size, body = element
        if eid == CLUSTER:
            pos = _cluster(reader, body, size, end, counts)
            continue
        if size is None:
            raise VideoError(f"an element (ID 0x{eid:X}) of unknown size at byte {pos:,}: it cannot be skipped")
        if eid == INFO:
            scale, declared = _info(_master(reader, body, size, "the Segment Info"))
        elif eid == TRACKS:
            tracks = [_track(entry) for kind, entry in _children(_master(reader, body, size, "the Tracks"))
                      if kind == 0xAE]
        pos = body + size
    return scale, declared, tracks, counts


def _cluster(reader: Reader, start: int, size: int | None, parent_end: int | None, counts: dict) -> int:
    """Count a Cluster's Blocks; where the next element begins."""
    end = parent_end if size is None else start + size
    limit = reader.size if end is None else min(end, reader.size)
    pos, time = start, None
    while pos < limit:
        reader.step()
        element = _element(reader, pos)
        if element is None:
            return reader.size
        eid, esize, body = element
        if size is None and eid not in _CLUSTER_CHILDREN:
            return pos  # a Cluster of unknown size ends where its parent's next element begins
        if esize is None:
            raise VideoError(f"an element (ID 0x{eid:X}) of unknown size inside a Cluster at byte {pos:,}")
        if end is not None and body + esize > end:
            raise VideoError(f"an element (ID 0x{eid:X}) at byte {pos:,} declares {esize:,} bytes, past its parent")
        if body + esize > reader.size:
            return reader.size  # the file is cut inside this element: its frames are not there
        if eid == TIMESTAMP:
            time = _uint(_master(reader, body, esize, "a Cluster's Timestamp"))
        elif eid == SIMPLE_BLOCK:
            _count(reader, body, esize, time, None, counts)
        elif eid == BLOCK_GROUP:
            _group(reader, body, esize, time, counts)
        pos = body + esize
    return limit if size is not None else pos


def _group(reader: Reader, start: int, size: int, time: int | None, counts: dict) -> None:
    """Count a BlockGroup's Block, timed by its BlockDuration where it has one."""
    block, duration, pos = None, None, start
    while pos < start + size:
        reader.step()
        element = _element(reader, pos)
        if element is None or element[1] is None or element[2] + element[1] > start + size:
            raise VideoError(f"a BlockGroup at byte {start:,} holds an element past its end")
        eid, esize, body = element
        if eid == BLOCK:
            block = (body, esize)
        elif eid == BLOCK_DURATION:
            duration = _uint(_master(reader, body, esize, "a BlockDuration"))
        pos = body + esize
    if block is not None:
        _count(reader, *block, time, duration or None, counts)


def _count(reader: Reader, start: int, size: int, time: int | None, duration: int | None, counts: dict) -> None:
    """Add one Block (its header: track number, signed 16-bit time offset, flags, lace count)."""
    head = reader.at(start, min(size, 12), "a Block's header")
    track, n = _vint(head, 0, "a Block's track number")
    if track is None or n + 3 > len(head):
        raise VideoError(f"a Block at byte {start:,} is too short for its header")
    (offset,), flags = struct.unpack_from(">h", head, n), head[n + 2]
    laces, data = 1, size - n - 3
    if flags & 0x06:
        if n + 4 > len(head):
            raise VideoError(f"a laced Block at byte {start:,} without its lace count")
        laces = head[n + 3] + 1
    elif data == 0:
        return  # an empty frame: FFmpeg makes no packet of it
    at = time + offset if time is not None and time + offset >= 0 else None
    counts.setdefault(track, _Count()).add(at, laces, duration)


def _info(data: bytes) -> tuple[int, float]:
    fields = dict(_children(data))
    scale = _uint(fields[0x2AD7B1]) if 0x2AD7B1 in fields else _DEFAULT_SCALE
    if scale <= 0:
        raise VideoError("the Segment's TimestampScale is 0")
    duration = _float(fields.get(0x4489, b""))
    return scale, duration if math.isfinite(duration) and duration > 0 else 0.0


def _track(data: bytes) -> _Track:
    """A TrackEntry's number, type, DefaultDuration and Video element's size and rotation."""
    fields = dict(_children(data))
    video = dict(_children(fields.get(0xE0, b"")))
    rotation = _rotation(dict(_children(video[0x7670]))) if 0x7670 in video else 0
    return _Track(_uint(fields.get(0xD7, b"")), _uint(fields.get(0x83, b"")), _uint(fields.get(0x23E383, b"")),
                  _uint(video.get(0xB0, b"")), _uint(video.get(0xBA, b"")), rotation)


def _rotation(projection: dict[int, bytes]) -> int:
    """FFmpeg's display matrix from a rectangular Projection's pose (``mkv_create_display_matrix``),
    as ``av_display_rotation_get`` reads it, modulo 360: the roll, less 180 for a mirrored one."""
    private = projection.get(0x7672, b"")
    if _uint(projection.get(0x7671, b"")) != 0 or (private and private[0] != 0):
        return 0  # a spherical projection, or one FFmpeg does not know
    yaw, pitch, roll = (_float(projection.get(eid, b"")) for eid in (0x7673, 0x7674, 0x7675))
    if pitch != 0.0 or yaw not in (0.0, 180.0, -180.0) or not math.isfinite(roll):
        return 0  # not a 2D rotation: FFmpeg ignores it
    angle = roll - 180.0 if yaw else roll
    return int(round(angle / 90.0)) * 90 % 360


# -- EBML ------------------------------------------------------------------------------------------
def _element(reader: Reader, pos: int) -> tuple[int, int | None, int] | None:
    """(ID, size or None where unknown, where the payload begins) of the element at ``pos``; None
    where the file ends inside its header."""
    head = _head(reader.upto(pos, 12), 0, pos)
    return None if head is None else (head[0], head[1], pos + head[2])


def _head(data: bytes, at: int, where: int | None = None) -> tuple[int, int | None, int] | None:
    """(ID, size or None where unknown, header length) of the element header at ``data[at:]``;
    None where ``data`` ends inside it."""
    if at >= len(data):
        return None
    width = 9 - data[at].bit_length()  # an ID's length: its first byte's leading zeros, plus one
    if width > 4:
        raise VideoError(f"not an EBML element{'' if where is None else f' at byte {where:,}'} (an ID cannot "
                         f"begin with 0x{data[at]:02X})")
    size, n = _vint(data, at + width, "an element's size")
    return None if n == 0 else (int.from_bytes(data[at:at + width], "big"), size, width + n)


def _vint(data: bytes, at: int, what: str) -> tuple[int | None, int]:
    """(value, length) of the variable-size integer at ``at``: None where all its bits are set (an
    unknown size); length 0 where ``data`` ends inside it."""
    if at >= len(data):
        return None, 0
    if data[at] == 0:
        raise VideoError(f"{what} is not an EBML number (a zero first byte)")
    n = 9 - data[at].bit_length()
    if at + n > len(data):
        return None, 0
    value = int.from_bytes(data[at:at + n], "big") & ((1 << (7 * n)) - 1)
    return (None if value == (1 << (7 * n)) - 1 else value), n


def _children(data: bytes):
    """(ID, payload) of the elements of a master element's payload, read whole."""
    pos = 0
    while pos < len(data):
        head = _head(data, pos)
        if head is None or head[1] is None or pos + head[2] + head[1] > len(data):
            raise VideoError("an element runs past its parent, or has an unknown size where one is needed")
        eid, size, n = head
        yield eid, data[pos + n:pos + n + size]
        pos += n + size


def _master(reader: Reader, start: int, size: int | None, what: str) -> bytes:
    """A header element's payload, read whole (its size checked against the file first)."""
    if size is None or start + size > reader.size:
        raise VideoError(f"{what} declares {'an unknown size' if size is None else f'{size:,} bytes'}, past the "
                         f"end of the file ({reader.size:,} bytes)")
    return reader.at(start, size, what)


def _uint(value: bytes) -> int:
    if len(value) > 8:
        raise VideoError(f"an unsigned integer of {len(value)} bytes")
    return int.from_bytes(value, "big")


def _float(value: bytes) -> float:
    if len(value) in (4, 8):
        return struct.unpack(">f" if len(value) == 4 else ">d", value)[0]
    if value:
        raise VideoError(f"a float of {len(value)} bytes")
    return 0.0
