"""MP3 lengths as libsndfile 1.2.2 (mpg123, gapless) reports them, for LAME-tagged files.

mpg123 takes the frame count from the Xing/Info tag of the first frame and, with the LAME
extension's encoder delay and padding, reports frames x samples per frame - delay - padding (its
own decoder delay of 529 samples cancels out while the padding is at least that). When libsndfile
seeks to the last sample (lengthscan.measure.audio.durations's truncation check), mpg123 walks every frame header
to get there, so a damaged header changes its answer: we walk them too (~0.2 us a frame) and
leave any file that is not exactly the tag's frames, back to back, to it.

Also here: the frame walk lengthscan.measure.audio.durations uses for MP3s without a tag (libsndfile only estimates).
"""

from __future__ import annotations

import struct
from functools import lru_cache

# kbit/s by (MPEG-1?, layer); index 0 (free format) and 15 (bad) are not walkable.
_MPEG_KBPS = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MPEG_KBPS[(False, 3)] = _MPEG_KBPS[(False, 2)]
_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_GAPLESS_DELAY = 529  # mpg123's decoder delay, added to both ends of the gapless range
#: every frame is walked (as mpg123 does when libsndfile seeks to the end, ~10x slower): bound the read
MP3_MAX_BYTES = 64 << 20


def mpeg_frame(header: int) -> tuple[int, int] | None:
    """(bytes, samples) of the MPEG audio frame with this 4-byte header; None if not one."""
    version, layer_bits = (header >> 19) & 3, (header >> 17) & 3
    kbps_i, rate_i, pad = (header >> 12) & 15, (header >> 10) & 3, (header >> 9) & 1
    if header >> 21 != 0x7FF or version == 1 or layer_bits == 0 or kbps_i in (0, 15) or rate_i == 3:
        return None
    layer, mpeg1 = 4 - layer_bits, version == 3
    bitrate, rate = _MPEG_KBPS[(mpeg1, layer)][kbps_i] * 1000, _MPEG_RATES[version][rate_i]
    if layer == 1:
        return (12 * bitrate // rate + pad) * 4, 384
    samples = 1152 if (layer == 2 or mpeg1) else 576
    return samples // 8 * bitrate // rate + pad, samples


def mpeg_start(blob: bytes) -> int:
    """Offset of the first MPEG frame: after an ID3v2 tag, if any."""
    if blob[:3] == b"ID3" and len(blob) >= 10:
        return 10 + ((blob[6] & 127) << 21 | (blob[7] & 127) << 14 | (blob[8] & 127) << 7 | (blob[9] & 127))
    return 0


@lru_cache(maxsize=64)
def _frame_sizes(second: int, third: int, mono: bool) -> dict[int, int]:
    """Frame size by 4-byte header, for every header like the first (version, layer, CRC flag, rate,
    mono or not; any bitrate, padding, private bit, mode extension, copyright, original, emphasis but 2)."""
    sizes = {}
    for b in range(256):
        found = mpeg_frame(0xFF000000 | second << 16 | b << 8) if (b >> 2) & 3 == (third >> 2) & 3 else None
        for v in range(256) if found else ():
            if (v >> 6 == 3) == mono and v & 3 != 2:
                sizes[0xFF000000 | second << 16 | b << 8 | v] = found[0]
    return sizes


_U32 = struct.Struct(">I").unpack_from


def _walk(data: bytes, pos: int, end: int, header: int) -> int:
    """Frames from ``pos`` if they are all like the first header and end exactly at ``end``; else -1."""
    size_of = _frame_sizes((header >> 16) & 0xFF, (header >> 8) & 0xFF, (header >> 6) & 3 == 3).get
    count = 0
    try:
        while pos < end:
            pos += size_of(_U32(data, pos)[0], end)  # not such a header: past the end, and out
            count += 1
    except struct.error:  # a header cut by the end of the data
        return -1
    return count if pos == end else -1


# -- MP3 without a tag: lengthscan.measure.audio.durations counts its frames ----------------------------------------
_VBR_TAGS = (b"Xing", b"Info", b"VBRI")


def _mpeg_walk(blob: bytes, start: int) -> int:
    """Samples in the complete MPEG frames from ``start`` until the first non-frame (ID3v1, APE, junk)."""
    i, samples = start, 0
    while i + 4 <= len(blob):
        frame = mpeg_frame(int.from_bytes(blob[i : i + 4], "big"))
        if frame is None or i + frame[0] > len(blob):
            break
        i, samples = i + frame[0], samples + frame[1]
    return samples


def untagged_mp3_samples(data: bytes | None, path: str | None) -> int | None:
    """Samples in an MP3 without a Xing/Info/VBRI tag, by walking its frames; None when tagged.

    Untagged, libsndfile only estimates the length (and stops decoding there): see lengthscan.measure.audio.durations.
    """
    blob = data if data is not None else _file_head(path)
    start = mpeg_start(blob)
    first = mpeg_frame(int.from_bytes(blob[start : start + 4], "big")) if len(blob) >= start + 4 else None
    if first is None or any(t in blob[start : start + first[0]] for t in _VBR_TAGS):
        return None
    if data is None:
        return walk_file(path, start) or None
    return _mpeg_walk(blob, start) or None


def walk_file(path: str, start: int, window: int = 4 << 20) -> int:
    """``_mpeg_walk`` of a file read ``window`` bytes at a time (memory bounded whatever its size)."""
    samples, pending = 0, b""
    with open(path, "rb") as fh:
        fh.seek(start)
        while True:
            chunk = fh.read(window)
            blob = pending + chunk
            i = 0
            while i + 4 <= len(blob):
                frame = mpeg_frame(int.from_bytes(blob[i : i + 4], "big"))
                if frame is None:
                    return samples
                if i + frame[0] > len(blob):
                    break
                i, samples = i + frame[0], samples + frame[1]
            if not chunk:
                return samples
            pending = blob[i:]


def _file_head(path: str) -> bytes:
    """The file's bytes up to 4 KiB past any ID3v2 tag: enough to hold the first MPEG frame."""
    with open(path, "rb") as fh:
        start = mpeg_start(fh.read(10))
        fh.seek(0)
        return fh.read(start + 4096)


# -- MP3 with a LAME tag: the fast path ------------------------------------------------------
def mp3_info(src):
    """(frames, samplerate, channels, "MP3", "MPEG_LAYER_III") of a complete LAME-tagged MP3; else None."""
    head = src.head
    if head[:3] == b"ID3" and (len(head) < 10 or head[5] & 0x10 or any(b & 0x80 for b in head[6:10])):
        return None  # an ID3v2 footer or a malformed size: not worth the risk
    start = mpeg_start(head)
    frame = src.read(start, 2048)
    header = int.from_bytes(frame[:4], "big") if len(frame) >= 4 else 0
    found = mpeg_frame(header)
    if found is None or (header >> 17) & 3 != 1:  # Xing/LAME tags are layer III only (mpg123)
        return None
    size, spf = found
    lsf, mono, version = (header >> 19) & 3 != 3, (header >> 6) & 3 == 3, (header >> 19) & 3
    off = 4 + ((9 if lsf else 17) if mono else (17 if lsf else 32))  # mpg123's check_lame_tag
    if (len(frame) < size or size - 4 < off - 4 + 8 or any(frame[6:off])
            or frame[off : off + 4] not in (b"Xing", b"Info")):
        return None
    flags, p = int.from_bytes(frame[off + 4 : off + 8], "big"), off + 8
    if flags & 3 != 3:
        return None
    frames, stream = int.from_bytes(frame[p : p + 4], "big"), int.from_bytes(frame[p + 4 : p + 8], "big")
    p += 8 + (100 if flags & 4 else 0) + (4 if flags & 8 else 0)
    if p + 24 > size or frame[p : p + 4] != b"LAME":
        return None
    delay = (frame[p + 21] << 4) | (frame[p + 22] >> 4)
    padding = ((frame[p + 22] << 8) | frame[p + 23]) & 0xFFF
    samples = frames * spf - delay - padding
    # padding under mpg123's own decoder delay changes its arithmetic: leave those to libsndfile
    if frames < 1 or padding < _GAPLESS_DELAY or samples < 1:
        return None
    if not 128 < src.size <= MP3_MAX_BYTES:
        return None
    end = src.size - (128 if src.read(src.size - 128, 3) == b"TAG" else 0)
    if stream != end - start and stream != src.size - start:
        return None  # the file is not the size the tag says: maybe cut short
    # libsndfile's seek to the end walks every frame (mpg123): so do we, and any surprise is its business
    if _walk(src.read(0, end), start + size, end, header) != frames:
        return None
    rate = _MPEG_RATES[version][(header >> 10) & 3]
    return samples, rate, 1 if mono else 2, "MP3", "MPEG_LAYER_III"

