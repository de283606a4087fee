"""Exact audio lengths from container headers in pure Python: a few reads, no libsndfile, no decoding.

``probe(data, path)`` returns ``(frames, samplerate, channels, format, subtype)`` for a complete,
well-formed file of a common kind: exactly what ``lengthscan.measure.audio.durations``'s libsndfile path reports for
it (libsndfile 1.2.2's own arithmetic, replicated here and compared with it file by file in
tests/measure/audio/test_headers.py). For anything else (another container or codec, an unusual chunk, a
truncated or damaged file, any inconsistency) it returns None and the caller asks libsndfile, so
results do not change: this module only answers faster where the answer is certain. The libsndfile
path also seeks to the last sample of a compressed file to catch truncation, and decodes when that
fails; so for those formats we check at least what that seek would run into:

* WAV (RIFF; PCM 8/16/24/32-bit, IEEE float 32/64, WAVE_FORMAT_EXTENSIBLE PCM/float): data bytes //
  (bytes per sample x channels). Only a data chunk that fits in the file (a longer one is libsndfile's
  "should be" truncation) and only fmt/fact/PEAK/LIST-INFO/JUNK chunks around it. Reads the head.
* FLAC: STREAMINFO's total, if the file ends with a frame whose first sample + block size is that
  total, whose CRC-8 and CRC-16 check and whose size is within STREAMINFO's frame sizes. Reads the
  head and the tail. (libFLAC's seek does not notice damage elsewhere: 1,000,000 damaged copies
  tried.) The one gap: a FLAC cut inside its last frame exactly where the remaining bytes happen to
  pass the CRC-16 (1 in 65,536) and still make a frame no shorter than the stream's shortest.
* Ogg Vorbis/Opus (files up to 2 MiB): the last granule position minus the start offset libsndfile
  derives from the first audio page (Vorbis: packet block sizes; Opus: packet durations, then the
  pre-skip, at libsndfile's decoding rate). Reads the file: every page must pass its CRC and follow
  the one before, the last must carry EOS and end the file.
* MP3 with a LAME Xing/Info tag (files up to 64 MiB): mpg123's gapless count (tag frames x samples
  per frame - encoder delay - padding). Reads the file: the tag's frames must follow it back to
  back to the end (mpg123 walks them to seek), and the tag's byte count must match.
"""

from __future__ import annotations

import math
import os
import stat

from lengthscan.measure.audio.mpeg import mp3_info, mpeg_frame, mpeg_start  # noqa: F401 (re-exported)
from lengthscan.measure.audio.ogg import ogg_info, tags_fit

HEAD = 8192  # bytes read from the start of a file: every header we parse usually fits
MAX_RATE = 655350  # larger (or negative as a C int) rates: libsndfile decides
#: O_NONBLOCK: opening a FIFO (a special file named where audio was expected) must not block
_O_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)


class Source:
    """The start, the size and positioned reads of a file or of bytes already in memory."""

    __slots__ = ("data", "fd", "head", "size")

    def __init__(self, data: bytes | None, path: str | None):
        self.data, self.fd = data, None
        if data is not None:
            self.size, self.head = len(data), data
            return
        self.fd = os.open(path, _O_FLAGS)
        try:
            self.size = os.fstat(self.fd).st_size
            self.head = os.pread(self.fd, HEAD, 0)
        except BaseException:
            os.close(self.fd)
            raise

    def read(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset`` (fewer at the end of the file)."""
        if offset + n <= len(self.head):
            return self.head[offset : offset + n]
        if self.fd is None:
            return self.data[offset : offset + n]
        return os.pread(self.fd, n, offset)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_ADVISE = getattr(os, "posix_fadvise", None)
_WHOLE = (".ogg", ".oga", ".opus", ".mp3")  # read in full (every page, every frame): cheap when cached


def hint(path: str | None) -> None:
    """Ask the kernel to start reading the parts of ``path`` that ``probe`` will read; no wait, no error.

    What is read depends on the format, guessed from the name (a wrong guess costs time, not
    correctness): the head (WAV), head and tail (FLAC and the rest), or the whole file (Ogg, MP3).
    """
    if path is None or _ADVISE is None:
        return
    try:
        fd = os.open(path, _O_FLAGS)
    except (OSError, ValueError):
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # FIFOs, sockets, devices: read_info flags them, unread
            return
        size = st.st_size
        name = path.lower()
        if name.endswith(_WHOLE) and size <= 2 << 20:
            _ADVISE(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        else:
            _ADVISE(fd, 0, HEAD, os.POSIX_FADV_WILLNEED)
            if size > HEAD and not name.endswith(".wav"):
                _ADVISE(fd, max(size - 65536, HEAD), 65536, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def probe(data: bytes | None, path: str | None) -> tuple | None:
    """``(frames, samplerate, channels, format, subtype)`` of a complete, common file; else None."""
    try:
        src = Source(data, path)
    except OSError:
        return None
    try:
        magic = src.head[:4]
        if magic == b"RIFF":
            return _wav(src)
        if magic == b"fLaC":
            return _flac(src)
        if magic == b"OggS":
            return ogg_info(src)
        return mp3_info(src)
    except Exception:  # noqa: BLE001 - anything this parser did not foresee: libsndfile decides
        return None
    finally:
        src.close()


# -- AIFF's sample rate ---------------------------------------------------------------------
def aiff_rate(head: bytes) -> str | None:
    """The COMM chunk's sample rate (an 80-bit IEEE extended float) of an AIFF/AIFC head, in words
    as it is (NaN, inf, 0, a denormal, or the value in Hz); None where the head holds no COMM chunk."""
    if head[:4] != b"FORM" or head[8:12] not in (b"AIFF", b"AIFC"):
        return None
    pos = 12
    while pos + 8 <= len(head):
        cid, n = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "big")
        if cid == b"COMM":
            raw = head[pos + 16 : pos + 26]
            if len(raw) < 10:
                return None
            sign_exp, mantissa = int.from_bytes(raw[:2], "big"), int.from_bytes(raw[2:], "big")
            sign, exp = "-" if sign_exp & 0x8000 else "", sign_exp & 0x7FFF
            if exp == 0x7FFF:
                return "NaN" if mantissa << 1 & (2**64 - 1) else f"{sign}inf"
            if mantissa == 0:
                return "0"
            if exp == 0:
                return "a denormal"
            try:
                return f"{sign}{math.ldexp(mantissa, exp - 16383 - 63):,.6g} Hz"
            except OverflowError:
                return f"{sign}2^{exp - 16383}-scale, beyond any float"
        pos += 8 + n + (n & 1)
    return None


# -- WAV ------------------------------------------------------------------------------------
_PCM = {1: "PCM_U8", 2: "PCM_16", 3: "PCM_24", 4: "PCM_32"}  # by bytes per sample, as libsndfile
_FLOAT = {4: "FLOAT", 8: "DOUBLE"}
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_* after the tag
#: chunks libsndfile only logs and skips by their size
_SKIPPED = {b"fact", b"JUNK", b"PAD ", b"FLLR", b"iXML"}
#: LIST/INFO text items libsndfile reads in full (wavlike_subchunk_parse)
_INFO_ITEMS = {b"ISFT", b"ICOP", b"IARL", b"IART", b"ICMT", b"ICRD", b"IENG", b"IGNR", b"INAM", b"IPRD",
               b"ISBJ", b"ISRC", b"IAUT", b"ITRK"}


def _wav(src: Source):
    head, size = src.head, src.size
    if head[8:12] != b"WAVE":
        return None
    pos, fmt = 12, None
    while True:  # chunks before the data chunk: all in the head
        if pos + 8 > len(head):
            return None
        cid, n = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        body = pos + 8
        if cid == b"data":
            break
        if body + n > min(size, len(head)):
            return None
        if cid == b"fmt " and fmt is None:
            fmt = _wav_fmt(head[body : body + n])
            if fmt is None:
                return None
        elif not _benign_chunk(cid, head[body : body + n], fmt):
            return None
        pos = body + n + (n & 1)
    if fmt is None or n > size - body or (n == 0 and head[4:8] == b"\x08\0\0\0"):
        return None  # no format, truncated data, or an unfinished file: libsndfile's own words
    if src.read(body, 4) in (b"wvpk", b"OggS"):
        return None
    end = body + n + (n & 1)  # libsndfile skips the pad byte of an odd-sized chunk
    if size - end > 4:  # chunks after the data (libsndfile reads them too)
        if size - end > 65536:
            return None
        tail, pos = src.read(end, size - end), 0
        while len(tail) - pos > 4:
            if pos + 8 > len(tail):
                return None
            cid, k = tail[pos : pos + 4], int.from_bytes(tail[pos + 4 : pos + 8], "little")
            if pos + 8 + k > len(tail) or not _benign_chunk(cid, tail[pos + 8 : pos + 8 + k], fmt):
                return None
            pos += 8 + k + (k & 1)
    channels, rate, width, container, subtype = fmt
    return n // (width * channels), rate, channels, container, subtype


def _wav_fmt(body: bytes):
    """(channels, rate, bytes per sample, format, subtype) of a plain PCM/float fmt chunk, else None."""
    if len(body) < 16:
        return None
    tag = int.from_bytes(body[0:2], "little")
    channels = int.from_bytes(body[2:4], "little")
    rate = int.from_bytes(body[4:8], "little")
    align, bits = int.from_bytes(body[12:14], "little"), int.from_bytes(body[14:16], "little")
    if (not 1 <= channels < 1024 or not 1 <= rate <= MAX_RATE or bits not in (8, 16, 24, 32, 64)
            or align != channels * bits // 8):
        return None
    width, container = bits // 8, "WAV"
    if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID decides
        if len(body) < 40 or int.from_bytes(body[16:18], "little") < 22 or body[18:20] != body[14:16]:
            return None
        if body[26:40] != _GUID_TAIL:
            return None
        tag, container = int.from_bytes(body[24:26], "little"), "WAVEX"
    subtype = _PCM.get(width) if tag == 1 else _FLOAT.get(width) if tag == 3 else None
    return None if subtype is None else (channels, rate, width, container, subtype)


def _benign_chunk(cid: bytes, body: bytes, fmt) -> bool:
    """A chunk libsndfile parses without an error or a change of position: skipped, PEAK, LIST/INFO."""
    if cid in _SKIPPED:
        return cid != b"fact" or len(body) >= 4
    if cid == b"PEAK":
        return fmt is not None and len(body) == 8 + 8 * fmt[0]
    if cid != b"LIST" or len(body) <= 8 or len(body) >= 1024 or body[:4] != b"INFO":
        return False
    pos = 4  # INFO items must tile the chunk exactly, each short enough for libsndfile's buffer
    while pos < len(body):
        if pos + 8 > len(body) or body[pos : pos + 4] not in _INFO_ITEMS:
            return False
        k = int.from_bytes(body[pos + 4 : pos + 8], "little")
        k += k & 1
        if k >= 512 or k >= len(body):
            return False
        pos += 8 + k
    return pos == len(body)


# -- FLAC -----------------------------------------------------------------------------------
_FLAC_BITS = {8: "PCM_S8", 16: "PCM_16", 24: "PCM_24"}
_FLAC_SIZES = {1: 8, 2: 12, 4: 16, 5: 20, 6: 24}  # frame header sample size codes (0: STREAMINFO's)
_FLAC_RATES = (88200, 176400, 192000, 8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000)
_FLAC_BLOCKS = {1: 192, 2: 576, 3: 1152, 4: 2304, 5: 4608, **{c: 256 << (c - 8) for c in range(8, 16)}}
_CRC8 = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = ((_c << 1) ^ 0x07) & 0xFF if _c & 0x80 else (_c << 1) & 0xFF
    _CRC8.append(_c)


def _flac(src: Source):
    pos, info = 4, None
    while True:  # metadata blocks: STREAMINFO first; only kinds libFLAC parses without surprises
        block = src.read(pos, 4)
        if len(block) < 4:
            return None
        kind, n = block[0] & 0x7F, int.from_bytes(block[1:4], "big")
        if info is None:
            if kind != 0 or n != 34:
                return None
            info = src.read(pos + 4, 34)
        elif kind not in (1, 3, 4) or (kind == 4 and not tags_fit(src.read(pos + 4, n), 0)):
            return None
        pos += 4 + n
        if block[0] & 0x80:
            break
    min_bs, max_bs = int.from_bytes(info[0:2], "big"), int.from_bytes(info[2:4], "big")
    min_frame, max_frame = int.from_bytes(info[4:7], "big"), int.from_bytes(info[7:10], "big")
    packed = int.from_bytes(info[10:18], "big")
    rate, channels = packed >> 44, ((packed >> 41) & 7) + 1
    bits, total = ((packed >> 36) & 31) + 1, packed & ((1 << 36) - 1)
    if not 1 <= rate <= MAX_RATE or bits not in _FLAC_BITS or total < 1 or min_bs < 16 or max_bs < min_bs:
        return None
    if src.read(pos, 2) not in (b"\xff\xf8", b"\xff\xf9") or pos >= src.size:
        return None
    span = min(src.size - pos, (max_frame or 65536) + 64)
    tail = src.read(src.size - span, span)
    end = len(tail)
    while True:  # the last frame header: sync, CRC-8, and numbering that ends at STREAMINFO's total
        j = max(tail.rfind(b"\xff\xf8", 0, end), tail.rfind(b"\xff\xf9", 0, end))
        if j < 0:
            return None
        frame = _flac_frame(tail, j, (min_bs, max_bs, channels, bits, rate))
        if frame is not None and frame == total:
            # a cut last frame fails its CRC-16 (but for 1 cut in 65,536) or is shorter than the
            # stream's shortest frame (when that is the last, partial block: commonly)
            if not min_frame <= len(tail) - j <= (max_frame or len(tail)) or not _crc16_is_zero(tail[j:]):
                return None  # the last frame is cut or damaged: libsndfile decides
            return total, rate, channels, "FLAC", _FLAC_BITS[bits]
        end = j + 1


def _flac_frame(buf: bytes, j: int, info: tuple) -> int | None:
    """First sample + block size of the frame whose header starts at ``buf[j]``; None if not one."""
    min_bs, max_bs, channels, bits, rate = info
    if len(buf) < j + 6:
        return None
    b2, b3 = buf[j + 2], buf[j + 3]
    bs_code, rate_code, chan, size_code = b2 >> 4, b2 & 15, b3 >> 4, (b3 >> 1) & 7
    if bs_code == 0 or rate_code == 15 or b3 & 1 or size_code in (3, 7) or chan > 10:
        return None
    if (chan + 1 if chan < 8 else 2) != channels or _FLAC_SIZES.get(size_code, bits) != bits:
        return None
    if 0 < rate_code < 12 and _FLAC_RATES[rate_code - 1] != rate:
        return None
    first = buf[j + 4]  # UTF-8 style coded frame or sample number
    extra = 0 if first < 0x80 else 8 - (~first & 0xFF).bit_length() - 1 if first >= 0xC0 else -1
    if extra < 0 or extra > 6:
        return None
    if extra > 5 and not buf[j + 1] & 1:
        return None  # frame numbers have at most 31 bits
    number, p = first & (0x7F if extra == 0 else (1 << (6 - extra)) - 1), j + 5
    for b in buf[p : p + extra]:
        if b & 0xC0 != 0x80:
            return None
        number = (number << 6) | (b & 0x3F)
    p += extra
    if bs_code in (6, 7):
        size = 1 if bs_code == 6 else 2
        block = int.from_bytes(buf[p : p + size], "big") + 1
        p += size
    else:
        block = _FLAC_BLOCKS[bs_code]
    p += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if len(buf) <= p or block > max_bs:
        return None
    crc = 0
    for b in buf[j:p]:
        crc = _CRC8[crc ^ b]
    if crc != buf[p]:
        return None
    if buf[j + 1] & 1:  # variable block size: the sample number
        return number + block
    return number * min_bs + block if min_bs == max_bs else None


_T15 = (1 << 15) | 3  # x^15 + x + 1; FLAC's CRC-16 polynomial is (x + 1)(x^15 + x + 1)


def _crc16_is_zero(frame: bytes) -> bool:
    """FLAC's CRC-16 (0x8005, MSB first, init 0) of a frame including its own CRC is zero.

    That is: the frame's bits, as a polynomial over GF(2), divide by (x + 1)(x^15 + x + 1). By x + 1
    iff the bit count is even; by x^15 + x + 1 by folding with x^(15 s) = (x + 1)^s = x^s + 1 for s a
    power of two (Frobenius), on Python integers: ~15 us for a 4 KB frame, no table.
    """
    m = int.from_bytes(frame, "big")
    if m.bit_count() & 1:
        return False
    n = m.bit_length()
    while n > 29:
        s = 1 << ((n // 29).bit_length() - 1)
        h = m >> (15 * s)
        m ^= (h << (15 * s)) ^ (h << s) ^ h
        n = m.bit_length()
    while n > 15:
        m ^= _T15 << (n - 16)
        n = m.bit_length()
    return m == 0
