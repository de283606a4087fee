"""Ogg Vorbis and Opus lengths as libsndfile 1.2.2 computes them, from the first and the last pages.

libsndfile (ogg_vorbis.c, ogg_opus.c): frames = last granule position - start offset, where the
start offset is the first audio page's granule position minus the samples its complete packets
decode to (Vorbis: block sizes, lapped; Opus: packet durations at 48 kHz), and for Opus also minus
the pre-skip, divided by the factor from 48 kHz down to the decoding rate libsndfile picks.
Every page must pass its CRC, belong to the one logical stream and follow its predecessor (libsndfile
seeks to the end and decodes there, so a damaged page may change its answer: we leave any such
file to it); the last page must carry EOS and end the file. Anything else: None.
"""

from __future__ import annotations

import struct
import zlib

_REV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))  # bit-reversed bytes
_NO_GRANULE = (1 << 64) - 1
_ZERO4 = bytes(4)
MAX_BYTES = 2 << 20  # every page is read and CRC-checked: beyond this libsndfile (~1 ms) is as fast


class _Page:
    __slots__ = ("body", "flags", "granule", "lacing", "off", "seq", "size")

    def __init__(self, off, flags, granule, seq, size, lacing, body):
        self.off, self.flags, self.granule, self.seq = off, flags, granule, seq
        self.size, self.lacing, self.body = size, lacing, body


_HEADER = struct.Struct("<5sBQ4sIIB").unpack_from  # "OggS\0", flags, granule, serial, sequence, CRC, segments


def _pages(data: bytes) -> list[_Page] | None:
    """Every page of a single-stream Ogg file, back to back to its last byte, each passing its CRC.

    Ogg's CRC-32 (0x04C11DB7, MSB first, no initial value or final xor) is zlib's reflected CRC-32
    of the bit-reversed bytes, reversed: one C pass over the file, one CRC call a page.
    """
    rev, crc32, pages, off, n = memoryview(data.translate(_REV)), zlib.crc32, [], 0, len(data)
    serial = data[14:18]
    try:
        while off < n:
            capture, flags, granule, pserial, seq, crc, nseg = _HEADER(data, off)
            lacing = data[off + 27 : off + 27 + nseg]
            size = 27 + nseg + sum(lacing)
            if capture != b"OggS\0" or pserial != serial or not nseg or off + size > n:
                return None
            c = crc32(rev[off + 26 : off + size], crc32(_ZERO4, crc32(rev[off : off + 22], 0xFFFFFFFF)))
            if int.from_bytes((c ^ 0xFFFFFFFF).to_bytes(4, "little").translate(_REV), "big") != crc:
                return None
            pages.append(_Page(off, flags, granule, seq, size, lacing, off + 27 + nseg))
            off += size
    except struct.error:  # a page header cut by the end of the file
        return None
    return pages


def _packets(data: bytes, page: _Page) -> tuple[list[bytes], int | None]:
    """The packet pieces ending on a page (the first continues a packet if flags & 1), and where an
    unfinished last packet starts (None if the page ends with a packet)."""
    out, start, pos = [], page.body, page.body
    for v in page.lacing:
        pos += v
        if v < 255:
            out.append(data[start:pos])
            start = pos
    return out, (start if page.lacing[-1] == 255 else None)


def ogg_info(src):
    """(frames, samplerate, channels, "OGG", subtype) of a complete Vorbis or Opus stream; else None."""
    if src.size > MAX_BYTES:
        return None
    data = src.read(0, src.size)
    pages = _pages(data) if len(data) == src.size else None
    if not pages or pages[0].flags != 2 or pages[-1].flags & 4 == 0 or pages[-1].granule == _NO_GRANULE:
        return None
    granule, seq0 = -1, pages[0].seq
    for i, page in enumerate(pages):  # one stream, in order, continued exactly where a packet was cut
        if page.seq != seq0 + i or (i and page.flags & 2) or (page.flags & 4 and i != len(pages) - 1):
            return None
        if bool(page.flags & 1) != (i > 0 and pages[i - 1].lacing[-1] == 255):
            return None
        if page.granule != _NO_GRANULE:
            if page.granule < granule:
                return None
            granule = page.granule
    first, partial = _packets(data, pages[0])
    if len(first) != 1 or partial is not None:  # BOS page: the identification header only
        return None
    ident = first[0]
    codec = (_vorbis_ident(ident) if ident[:7] == b"\x01vorbis"
             else _opus_head(ident) if ident[:8] == b"OpusHead" else None)
    if codec is None:
        return None
    texts, piece, i = [], None, 1  # header packets: the last must end its page
    while len(texts) < (2 if codec[0] == "VORBIS" else 1):
        if i >= len(pages):
            return None
        packets, partial = _packets(data, pages[i])
        for p in packets:
            texts.append((piece or b"") + p)
            piece = None
        if partial is not None:
            piece = (piece or b"") + data[partial : pages[i].off + pages[i].size]
        i += 1
    if piece is not None or len(texts) != (2 if codec[0] == "VORBIS" else 1) or i >= len(pages):
        return None
    audio = pages[i]  # libsndfile's start offset comes from the first audio page's packets
    bodies, partial = _packets(data, audio)
    if not bodies or audio.granule == _NO_GRANULE or (audio.flags & 4 and partial is not None):
        return None
    frames = _vorbis_frames if codec[0] == "VORBIS" else _opus_frames
    return frames(codec, texts, bodies, audio.granule, audio.flags & 4, pages[-1].granule)


# -- Vorbis ---------------------------------------------------------------------------------
def _vorbis_ident(p: bytes):
    """("VORBIS", rate, channels, (short, long) block sizes) of a valid identification header."""
    if len(p) != 30 or int.from_bytes(p[7:11], "little") != 0 or not p[29] & 1:
        return None
    channels, rate = p[11], int.from_bytes(p[12:16], "little")
    short, long = 1 << (p[28] & 15), 1 << (p[28] >> 4)
    if channels < 1 or not 1 <= rate <= 655350 or short < 64 or long < short or long > 8192:
        return None
    return "VORBIS", rate, channels, (short, long)


def _vorbis_modes(setup: bytes) -> list[int] | None:
    """Block flags of the setup header's modes, read backwards from its framing bit (as ffmpeg does).

    Each mode is 41 bits (block flag, window type 0, transform type 0, mapping) and a 6-bit count
    precedes them: take the largest count whose modes all look valid. A wrong guess gives a wrong
    duration, which the caller's start-offset check (0 for any stream that starts at its start) rejects.
    """
    if setup[:7] != b"\x05vorbis":
        return None
    v = int.from_bytes(setup, "little")
    top = v.bit_length() - 1  # the framing bit
    best, k = None, 0
    while k < 64 and top - 41 * (k + 1) - 6 >= 56:
        at = top - 41 * (k + 1)
        if (v >> (at + 1)) & 0xFFFFFFFF or (v >> (at + 33)) & 0xFF > 63:
            break
        k += 1
        if (v >> (at - 6)) & 63 == k - 1:
            best = k
    if best is None:
        return None
    return [(v >> (top - 41 * (best - i))) & 1 for i in range(best)]


def _vorbis_frames(codec, texts, bodies, granule, eos, end_granule):
    _, rate, channels, sizes = codec
    if texts[0][:7] != b"\x03vorbis":
        return None
    modes = _vorbis_modes(texts[1])
    if modes is None:
        return None
    bits, last, duration = (len(modes) - 1).bit_length(), -1, 0
    for p in bodies:  # vorbis_packet_blocksize: audio packets only, lapped halves
        if not p or p[0] & 1:
            continue
        mode = (p[0] >> 1) & ((1 << bits) - 1)
        if mode >= len(modes):
            continue
        size = sizes[modes[mode]]
        if last != -1:
            duration += (last + size) >> 2
        last = size
    if granule > duration or (granule < duration and not eos):
        return None  # a stream that does not start at 0, or an ambiguous one: libsndfile decides
    return end_granule, rate, channels, "OGG", "VORBIS"  # the start offset is 0


# -- Opus -----------------------------------------------------------------------------------
def _opus_head(p: bytes):
    """("OPUS", preskip, channels, factor from 48 kHz) of a mono/stereo OpusHead libsndfile accepts."""
    if len(p) != 19 or p[8] not in (0, 1) or p[9] not in (1, 2) or p[18] != 0:
        return None
    rate = int.from_bytes(p[12:16], "little")
    factor = 1 if rate > 24000 else 2 if rate > 16000 else 3 if rate > 12000 else 4 if rate > 8000 else 6
    return "OPUS", int.from_bytes(p[10:12], "little"), p[9], factor


def _opus_samples(p: bytes) -> int:
    """opus_packet_get_nb_samples(p, 48000); negative for an invalid packet."""
    if not p:
        return -1
    toc, code = p[0], p[0] & 3
    count = 1 if code == 0 else 2 if code < 3 else (p[1] & 0x3F if len(p) >= 2 else -1)
    if count < 0:
        return -1
    if toc & 0x80:
        size = 120 << ((toc >> 3) & 3)
    elif toc & 0x60 == 0x60:
        size = 960 if toc & 8 else 480
    else:
        size = 2880 if (toc >> 3) & 3 == 3 else 480 << ((toc >> 3) & 3)
    samples = count * size
    return -1 if samples * 25 > 48000 * 3 else samples


def _opus_frames(codec, texts, bodies, granule, eos, end_granule):
    _, preskip, channels, factor = codec
    if texts[0][:8] != b"OpusTags" or not tags_fit(texts[0], 8):
        return None
    duration = sum(s for s in map(_opus_samples, bodies) if s > 0)
    if duration <= 0 or (not eos and duration > granule) or (eos and duration < granule):
        return None
    start = 0 if eos else granule - duration
    if end_granule < start + preskip:
        return None
    return (end_granule - start - preskip) // factor, 48000 // factor, channels, "OGG", "OPUS"


def tags_fit(body: bytes, skip: int) -> bool:
    """A Vorbis comment packet whose vendor string and tags fit in it, as libsndfile checks them."""
    if len(body) < skip + 8:
        return False
    p = skip + 4 + int.from_bytes(body[skip : skip + 4], "little")
    if p + 4 > len(body):
        return False
    count, p = int.from_bytes(body[p : p + 4], "little"), p + 4
    for _ in range(count):
        if p + 4 > len(body):
            return False
        p += 4 + int.from_bytes(body[p : p + 4], "little")
        if p > len(body):
            return False
    return True
