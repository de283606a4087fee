"""A video's ``VideoInfo`` from its container's headers, never decoding: the format told by its
first bytes (ISO base media: MP4, MOV, M4V, 3GP; Matroska and WebM; AVI), each walked by its own
reader through a budgeted ``Reader`` (``images/reader.py``: a hostile header cannot make it read
without bound, and a FIFO, socket, device or folder is refused unread).
"""

from __future__ import annotations

from lengthscan.measure.images.reader import Reader, open_regular
from lengthscan.measure.video.info import VideoError, VideoInfo

#: the box types an ISO base media file may begin with
_ISO_FIRST = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"styp", b"sidx", b"uuid"}
#: EBML's magic: Matroska and WebM
EBML = b"\x1a\x45\xdf\xa3"
#: Header and index bytes read of one video, at most (an MP4's sample table holds 4 bytes a frame;
#: a Matroska file's walk reads about 24 bytes a frame)
VIDEO_READ_BUDGET = 256 << 20
#: Elements, chunks or boxes walked in one video, at most (Matroska: a Block each, about 2.5 a frame
#: with an audio track: some 10 hours at 60 frames a second)
VIDEO_STEPS = 5_000_000


def video_info(data: bytes) -> VideoInfo:
    """The ``VideoInfo`` of a video's bytes."""
    return _info(Reader.of_bytes(bytes(data), VIDEO_READ_BUDGET, VIDEO_STEPS))


def video_info_from(path) -> VideoInfo:
    """The ``VideoInfo`` of the video file at ``path``."""
    with open_regular(path) as fh:
        return _info(Reader(fh, VIDEO_READ_BUDGET, VIDEO_STEPS))


def _info(reader: Reader) -> VideoInfo:
    head = reader.upto(0, 12)
    if head[4:8] in _ISO_FIRST:
        from lengthscan.measure.video.isobmff import isobmff_info

        return isobmff_info(reader)
    if head.startswith(EBML):
        from lengthscan.measure.video.matroska import matroska_info

        return matroska_info(reader)
    if head[:4] == b"RIFF" and head[8:12] in (b"AVI ", b"AVIX"):
        from lengthscan.measure.video.avi import avi_info

        return avi_info(reader)
    raise VideoError(f"not a video container lengthscan reads (MP4/MOV, Matroska/WebM, AVI): it begins {head[:8]!r}")
