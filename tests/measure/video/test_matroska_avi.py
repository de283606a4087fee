"""The Matroska/WebM and AVI header readers against PyAV (FFmpeg's demuxers and decoders), on real
files PyAV writes here, then rewritten ones (lacing, unknown sizes, OpenDML indexes, files cut
short) and damaged ones.

On every valid file, with PyAV's packets of the video stream as torchcodec's exact scan reads them:

* ``frames`` equals the frames PyAV decodes (and its packets with data);
* ``width``/``height`` equal the decoder's ``codec_context`` size, ``rotation`` the decoded
  frames' display rotation (``VideoFrame.rotation``, modulo 360);
* ``duration`` equals the packets' span, max(pts + duration) - min(pts) in the stream's time base
  (torchcodec's ``duration_seconds``), within 1e-9 s; and, for a file with no other stream,
  ``av.open(p).duration`` within one tick of the container's clock (Matroska: the 1 ms
  TimestampScale, the muxer rounding the last frame's duration; AVI: none) plus 1 us (PyAV gives
  it in microseconds);
* ``fps`` equals frames / duration (torchcodec's ``average_fps``).
"""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from lengthscan.measure.images.reader import OverBudget, Reader
from lengthscan.measure.video.avi import avi_info
from lengthscan.measure.video.info import VideoError, VideoInfo
from lengthscan.measure.video.matroska import matroska_info
from tests.support.video import audio_track, make_clip
from tests.support.video import frame_image as _image

av = pytest.importorskip("av")

#: the container clock's tick: what av.open(p).duration may differ from the video's span by (besides
#: its own rounding to microseconds)
TICK = {"matroska": 0.001, "webm": 0.001, "avi": 0.0}


# -- making files ----------------------------------------------------------------------------------
def jpegs(count: int, size=(64, 48)) -> list[bytes]:
    """``count`` JPEG frames (MJPEG packets), to build files by hand."""
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = size[0], size[1], "yuvj420p", Fraction(1, 25)
    out = []
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(_image(i, *size), format="rgb24").reformat(format="yuvj420p")
        frame.pts = i
        out += [bytes(p) for p in ctx.encode(frame)]
    return out


# -- what PyAV finds -------------------------------------------------------------------------------
def reference(path: Path, decode: bool = True) -> dict:
    """PyAV's packets with data, their span in seconds, the container's duration, and (decoding)
    the frames, the decoder's size and the frames' rotation."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.duration or 0) for p in container.demux(stream) if p.size and p.pts is not None]
        span = (max(a + d for a, d in packets) - min(a for a, _ in packets)) * stream.time_base
        out = {"packets": len(packets), "span": float(span),
               "container": container.duration / 1e6 if container.duration is not None else None}
    if decode:
        with av.open(str(path)) as container:
            frames = list(container.decode(video=0))
            ctx = container.streams.video[0].codec_context
            out.update(frames=len(frames), width=ctx.width, height=ctx.height, rotation=frames[0].rotation % 360)
    return out


def read(path: Path) -> VideoInfo:
    with open(path, "rb") as fh:
        return (avi_info if path.suffix == ".avi" else matroska_info)(Reader(fh))


def check(path: Path, *, only_video: bool = True) -> VideoInfo:
    """The reader's answer on ``path``, asserted against PyAV's (the rules in the module docstring)."""
    info, ref = read(path), reference(path)
    assert info.frames == ref["frames"] == ref["packets"]
    assert (info.width, info.height, info.rotation) == (ref["width"], ref["height"], ref["rotation"])
    assert info.duration == pytest.approx(ref["span"], abs=1e-9)
    if only_video and ref["container"] is not None:
        assert abs(info.duration - ref["container"]) <= TICK[info.container] + 1e-6
    assert info.fps == pytest.approx(info.frames / info.duration)
    return info


# -- real files ------------------------------------------------------------------------------------
CLIPS = {
    "vp8.webm": dict(codec="libvpx", rate=25, frames=40),
    "vp9-odd.webm": dict(codec="libvpx-vp9", rate=Fraction(30000, 1001), frames=20, size=(321, 181)),
    "h264-2997.mkv": dict(codec="libx264", rate=Fraction(30000, 1001), frames=45),
    "h264-23976.mkv": dict(codec="libx264", rate=Fraction(24000, 1001), frames=25),
    "mpeg4-24.mkv": dict(codec="mpeg4", rate=24, frames=30, size=(322, 182)),
    "h264-vfr.mkv": dict(codec="libx264", frames=10, pts_ms=[0, 40, 70, 150, 160, 300, 310, 400, 420, 500]),
    "vp9-vfr.webm": dict(codec="libvpx-vp9", frames=6, pts_ms=[0, 33, 100, 117, 400, 433]),
    "mjpeg-24.avi": dict(codec="mjpeg", rate=24, frames=30),
    "mpeg4-30.avi": dict(codec="mpeg4", rate=30, frames=40),
    "mjpeg-odd.avi": dict(codec="mjpeg", rate=Fraction(30000, 1001), frames=12, size=(321, 181)),
}


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_clips_agree_with_pyav(tmp_path, name):
    spec = CLIPS[name]
    info = check(make_clip(tmp_path / name, **spec))
    assert info.frames == spec["frames"]
    assert info.container == name.rsplit(".", 1)[1].replace("mkv", "matroska")
    if "pts_ms" not in spec:  # a constant rate: the average is it, to the container's rounding of times
        assert info.fps == pytest.approx(float(spec["rate"]), rel=0.01)


def test_several_clusters_are_walked(tmp_path):
    path = make_clip(tmp_path / "long.mkv", rate=30, frames=300, size=(322, 182))
    assert path.read_bytes().count(b"\x1f\x43\xb6\x75") >= 2  # Cluster IDs
    info = check(path)
    assert (info.frames, info.duration, info.fps) == (300, 10.0, 30.0)


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotation(tmp_path, rotation):
    info = check(make_clip(tmp_path / f"r{rotation}.mkv", frames=5, rotation=rotation))
    assert info.rotation == rotation and info.oriented() == ((96, 160) if rotation in (90, 270) else (160, 96))


@pytest.mark.parametrize("suffix", [".mkv", ".avi"])
def test_audio_track_is_not_counted(tmp_path, suffix):
    """A longer audio track: the container's duration is the audio's, the video's span is not."""
    codec = "libx264" if suffix == ".mkv" else "mpeg4"
    info = check(make_clip(tmp_path / f"av{suffix}", codec, rate=25, frames=25, audio_seconds=2.0), only_video=False)
    assert info.frames == 25 and info.duration == pytest.approx(1.0)
    assert reference(tmp_path / f"av{suffix}", decode=False)["container"] > 1.5


def test_live_webm_without_sizes_or_duration(tmp_path):
    """Written to a stream that cannot seek: a Segment of unknown size, no Duration."""

    class Sink:
        def __init__(self):
            self.data = bytearray()

        def write(self, data):
            self.data += data
            return len(data)

    sink = Sink()
    with av.open(sink, "w", format="webm", options={"live": "1"}) as out:
        stream = out.add_stream("libvpx", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(40):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(_image(i, 64, 48), format="rgb24")))
        out.mux(stream.encode())
    path = tmp_path / "live.webm"
    path.write_bytes(bytes(sink.data))
    assert bytes(sink.data).find(b"\x18\x53\x80\x67\x01\xff\xff\xff\xff\xff\xff\xff") > 0  # unknown size
    info = check(path)
    assert info.frames == 40 and reference(path, decode=False)["container"] is None


# -- Matroska built by hand: lacing, BlockGroups, unknown sizes ------------------------------------
def element(eid: int, payload: bytes = b"", *, unknown: bool = False) -> bytes:
    size = (1 << 57) - 1 if unknown else 1 << 56 | len(payload)  # 8-byte sizes (all ones: unknown)
    return eid.to_bytes((eid.bit_length() + 7) // 8, "big") + size.to_bytes(8, "big") + payload


def uint(eid: int, value: int) -> bytes:
    return element(eid, value.to_bytes(8, "big"))


def block(frames: list[bytes], offset: int, lacing: str = "", simple: bool = True) -> bytes:
    """A SimpleBlock (or a Block) of track 1 at ``offset`` ticks, its ``frames`` laced."""
    flags = {"": 0, "xiph": 0x02, "fixed": 0x04, "ebml": 0x06}[lacing] | (0x80 if simple else 0)
    head = b"\x81" + struct.pack(">hB", offset, flags)
    if lacing:
        head += bytes([len(frames) - 1])
    if lacing == "xiph":
        for f in frames[:-1]:
            head += b"\xff" * (len(f) // 255) + bytes([len(f) % 255])
    elif lacing == "ebml":
        head += (1 << 56 | len(frames[0])).to_bytes(8, "big")
        for a, b in zip(frames, frames[1:-1]):
            head += (1 << 56 | (len(b) - len(a) + (1 << 55) - 1)).to_bytes(8, "big")
    return element(0xA3 if simple else 0xA1, head + b"".join(frames))


def matroska(clusters: list[bytes], *, size=(64, 48), default_ns: int = 40_000_000, projection: bytes = b"",
             duration_ms: float = 0, unknown_segment: bool = True) -> bytes:
    video = uint(0xB0, size[0]) + uint(0xBA, size[1]) + (element(0x7670, projection) if projection else b"")
    track = element(0xAE, uint(0xD7, 1) + uint(0x73C5, 1) + uint(0x83, 1) + element(0x86, b"V_MJPEG")
                    + (uint(0x23E383, default_ns) if default_ns else b"") + element(0xE0, video))
    info = uint(0x2AD7B1, 1_000_000) + (element(0x4489, struct.pack(">d", duration_ms)) if duration_ms else b"")
    body = element(0x1549A966, info) + element(0x1654AE6B, track) + b"".join(clusters)
    head = element(0x1A45DFA3, element(0x4282, b"matroska") + uint(0x4287, 4) + uint(0x4285, 2))
    return head + (element(0x18538067, body, unknown=unknown_segment) if unknown_segment else element(0x18538067, body))


def cluster(time: int, *blocks: bytes, unknown: bool = False) -> bytes:
    return element(0x1F43B675, uint(0xE7, time) + b"".join(blocks), unknown=unknown)


def test_laced_blocks_groups_and_unknown_sizes(tmp_path):
    """Xiph, fixed and EBML lacing, BlockGroups with and without a BlockDuration, an empty block,
    Clusters of unknown size ended by the next Cluster, a Void and Tags."""
    f = jpegs(14)
    pad = max(len(x) for x in f[4:7])
    fixed = [x + bytes(pad - len(x)) for x in f[4:7]]  # equal sizes: the decoder ignores bytes after EOI
    group = element(0xA0, block([f[10]], 40, simple=False) + uint(0x9B, 120))
    data = matroska([
        cluster(0, block(f[:1], 0), block(f[1:4], 40, "xiph"), unknown=True),
        cluster(160, block(fixed, 0, "fixed"), block([], 100), block(f[7:10], 120, "ebml"), unknown=True),
        element(0xEC, bytes(10)),
        cluster(400, element(0xA0, block([f[11]], 0, simple=False)), group, block(f[12:14], 200, "xiph")),
        element(0x1254C367, element(0x7373, b"")),
    ])
    path = tmp_path / "laced.mkv"
    path.write_bytes(data)
    info = check(path)
    assert info.frames == 14 and info.duration == pytest.approx(0.680)  # 400 + 200 + 2 x 40 ms


def test_mirrored_projection(tmp_path):
    """A yaw of 180 (a mirror) and a roll of 90: FFmpeg's display matrix reads as 270 degrees."""
    pose = element(0x7673, struct.pack(">d", 180.0)) + element(0x7675, struct.pack(">d", 90.0))
    path = tmp_path / "mirror.mkv"
    path.write_bytes(matroska([cluster(0, *(block([x], 40 * i) for i, x in enumerate(jpegs(3))))], projection=pose))
    assert check(path).rotation == 270


def test_one_frame_without_a_duration_takes_the_segment_duration(tmp_path):
    path = tmp_path / "one.mkv"
    path.write_bytes(matroska([cluster(0, block(jpegs(1), 0))], default_ns=0, duration_ms=40.0))
    info = read(path)
    assert (info.frames, info.duration, info.fps) == (1, 0.04, 25.0)
    assert reference(path)["frames"] == 1


# -- AVI rewritten: no index, an OpenDML index, lists, empty chunks --------------------------------
def riff_chunk(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload + b"\0" * (len(payload) & 1)


def avi_parts(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The ``LIST hdrl`` chunk of an AVI, and the chunks of its ``movi``."""
    pos, hdrl, movi = 12, b"", []
    while pos < len(data):
        tag, size = struct.unpack_from("<4sI", data, pos)
        if tag == b"LIST" and data[pos + 8:pos + 12] == b"hdrl":
            hdrl = data[pos:pos + 8 + size]
        elif tag == b"LIST" and data[pos + 8:pos + 12] == b"movi":
            at = pos + 12
            while at < pos + 8 + size:
                ctag, csize = struct.unpack_from("<4sI", data, at)
                movi.append((ctag, data[at + 8:at + 8 + csize]))
                at += 8 + csize + (csize & 1)
        pos += 8 + size + (size & 1)
    return hdrl, movi


def joined(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(riff_chunk(tag, payload) for tag, payload in chunks)


def avi(hdrl: bytes, movi: bytes, tail: bytes = b"") -> bytes:
    return riff_chunk(b"RIFF", b"AVI " + hdrl + riff_chunk(b"LIST", b"movi" + movi) + tail)


def idx1(chunks: list[tuple[bytes, bytes]]) -> bytes:
    entries, offset = b"", 4
    for tag, payload in chunks:
        entries += struct.pack("<4sIII", tag, 0x10, offset, len(payload))
        offset += 8 + len(payload) + (len(payload) & 1)
    return riff_chunk(b"idx1", entries)


def odml(hdrl: bytes, chunks: list[tuple[bytes, bytes]]) -> bytes:
    """An AVI whose video stream has an OpenDML super index (in the ``JUNK`` FFmpeg reserves for one
    in the stream list) of one standard index (``ix00``, the last chunk of ``movi``), and a wrong
    ``idx1`` (of 2 frames) that must not be read."""
    junk = hdrl.index(b"JUNK")
    room = struct.unpack_from("<I", hdrl, junk + 4)[0]
    movi_at = 12 + len(hdrl) + 8  # where "movi" is
    entries, pos = b"", movi_at + 4
    for tag, payload in chunks:
        entries += struct.pack("<II", pos + 8 - movi_at, len(payload))
        pos += 8 + len(payload) + (len(payload) & 1)
    ix = riff_chunk(b"ix00", struct.pack("<HBBI4sQI", 2, 0, 1, len(chunks), b"00dc", movi_at, 0) + entries)
    indx = struct.pack("<HBBI4s12xQII", 4, 0, 0, 1, b"00dc", pos, len(ix), len(chunks))
    hdrl = hdrl[:junk] + b"indx" + hdrl[junk + 4:junk + 8] + indx + bytes(room - len(indx)) + hdrl[junk + 8 + room:]
    movi = joined(chunks) + ix
    return avi(hdrl, movi, idx1(chunks[:2]))


def test_avi_indexes_and_walks(tmp_path):
    """The same 20 frames behind each way of finding them: an ``idx1`` or none (with a dropped
    frame), ``LIST rec`` groups, an OpenDML index, an ``AVIX`` extension, a RIFF size of 0."""
    source = make_clip(tmp_path / "src.avi", "mjpeg", rate=25, frames=20, size=(64, 48))
    hdrl, chunks = avi_parts(source.read_bytes())
    assert len(chunks) == 20
    empty = chunks[:7] + [(b"00dc", b"")] + chunks[7:]  # a dropped frame: no packet, one tick
    length = hdrl.index(b"strh") + 8 + 32  # its dwLength, which counts the dropped frame
    counted = hdrl[:length] + struct.pack("<I", 21) + hdrl[length + 4:]
    grouped = b"".join(riff_chunk(b"LIST", b"rec " + riff_chunk(*a) + riff_chunk(*b))
                       for a, b in zip(chunks[::2], chunks[1::2]))
    extension = riff_chunk(b"RIFF", b"AVIX" + riff_chunk(b"LIST", b"movi" + joined(chunks[10:])))
    files = {"idx1": avi(counted, joined(empty), idx1(empty)),
             "walk": avi(counted, joined(empty)),
             "rec": avi(hdrl, grouped),
             "odml": odml(hdrl, chunks),
             "avix": avi(hdrl, joined(chunks[:10]), idx1(chunks[:10])) + extension,  # idx1: the first RIFF's
             "riff0": b"RIFF\0\0\0\0" + avi(hdrl, joined(chunks))[8:]}  # a muxer that could not seek back
    for name, data in files.items():
        path = tmp_path / f"{name}.avi"
        path.write_bytes(data)
        info = check(path)
        assert info.frames == 20, name
        assert info.duration == pytest.approx(21 / 25 if name in ("idx1", "walk") else 20 / 25), name


# -- files cut short -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cut.mkv", "cut.webm", "cut.avi"])
def test_cut_in_half_counts_the_packets_there(tmp_path, name):
    """A file cut short counts what a demuxer still reads: Matroska's whole Blocks (FFmpeg drops a
    cut one), AVI's chunks with some data (FFmpeg passes on a cut one as a corrupt packet; it may
    or may not decode). Both are torchcodec's count; the span is the packets' as well."""
    codec = {"mkv": "libx264", "webm": "libvpx", "avi": "mjpeg"}[name.rsplit(".", 1)[1]]
    full = make_clip(tmp_path / f"full-{name}", codec, rate=25, frames=60)
    path = tmp_path / name
    path.write_bytes(full.read_bytes()[:full.stat().st_size // 2])
    info, ref = read(path), reference(path, decode=False)
    assert 0 < info.frames == ref["packets"] < 60
    assert info.duration == pytest.approx(ref["span"], abs=1e-9)


# -- what is refused -------------------------------------------------------------------------------
def test_no_video(tmp_path):
    audio = tmp_path / "audio.mka"
    with av.open(str(audio), "w", format="matroska") as out:
        audio_track(out, out.add_stream("aac", rate=48000), 0.2)
    with pytest.raises(VideoError, match="no video track"):
        read(audio)
    audio_avi = tmp_path / "audio.avi"
    with av.open(str(audio_avi), "w") as out:
        audio_track(out, out.add_stream("mp2", rate=48000), 0.2)
    with pytest.raises(VideoError, match="no video stream"):
        read(audio_avi)


@pytest.mark.parametrize("suffix", [".mkv", ".webm", ".avi"])
def test_no_frames(tmp_path, suffix):
    path = make_clip(tmp_path / f"empty{suffix}", "mjpeg" if suffix == ".avi" else "libvpx", frames=0)
    with pytest.raises(VideoError, match="holds no frames"):
        read(path)


@pytest.mark.parametrize("reader", [matroska_info, avi_info])
@pytest.mark.parametrize("data", [b"", b"\x00" * 64, np.random.default_rng(7).bytes(4096),
                                  b"RIFF\x10\0\0\0WAVEfmt ", b"\x1aE\xdf\xa3\x80\x18S\x80g" + bytes(40)])
def test_not_these_containers(reader, data):
    with pytest.raises(VideoError):
        reader(Reader.of_bytes(data))


def test_corrupt_inside(tmp_path):
    data = bytearray(make_clip(tmp_path / "c.mkv", "libvpx", frames=5).read_bytes())
    cluster_at = data.index(b"\x1f\x43\xb6\x75")
    data[cluster_at + 4 + 9 - data[cluster_at + 4].bit_length()] = 0  # the Cluster's first child's ID
    with pytest.raises(VideoError):
        matroska_info(Reader.of_bytes(bytes(data)))


def test_huge_declared_sizes(tmp_path):
    """Sizes far past the file: refused or walked to the end, never read or looped on."""
    data = make_clip(tmp_path / "h.mkv", "libvpx", frames=5).read_bytes()
    tracks = data.rindex(b"\x16\x54\xae\x6b")  # the Tracks (the SeekHead names it before)
    width = 9 - data[tracks + 4].bit_length()  # the Tracks' size, replaced by 2**48 - 1 bytes
    huge = data[:tracks + 4] + b"\x01\x00\xff\xff\xff\xff\xff\xff" + data[tracks + 4 + width:]
    with pytest.raises(VideoError, match="past the end of the file"):
        matroska_info(Reader.of_bytes(huge))
    void = matroska([element(0xEC, bytes(4))]).replace(b"\xec\x01\x00\x00\x00\x00\x00\x00\x04",
                                                       b"\xec\x01\x0f\xff\xff\xff\xff\xff\xff")
    with pytest.raises(VideoError, match="holds no frames"):  # the Void took the rest of the file
        matroska_info(Reader.of_bytes(void))
    cluster_at = data.index(b"\x1f\x43\xb6\x75")
    width = 9 - data[cluster_at + 4].bit_length()
    endless = data[:cluster_at + 4] + b"\x01\x00\xff\xff\xff\xff\xff\xff" + data[cluster_at + 4 + width:]
    assert matroska_info(Reader.of_bytes(endless)).frames == 5  # walked to the file's end
    hdrl, chunks = avi_parts(make_clip(tmp_path / "h.avi", "mjpeg", frames=3).read_bytes())
    big_movi = bytearray(avi(hdrl, joined(chunks)))
    movi = big_movi.index(b"movi")
    big_movi[movi - 4:movi] = b"\xf0\xff\xff\xff"
    assert avi_info(Reader.of_bytes(bytes(big_movi))).frames == 3  # walked to the file's end
    strh = bytearray(big_movi)
    at = strh.index(b"strh")
    strh[at + 4:at + 8] = b"\xf0\xff\xff\xff"
    with pytest.raises(VideoError, match="past the end of the file"):
        avi_info(Reader.of_bytes(bytes(strh)))


def test_endless_little_elements_hit_the_step_budget():
    void = b"\xec\x80"  # an empty Void: 2 bytes
    data = matroska([cluster(0, void * 200_001)])
    with pytest.raises(OverBudget):
        matroska_info(Reader.of_bytes(data))
    strh = b"vids" + bytes(16) + struct.pack("<II", 1, 25) + bytes(28)
    strf = struct.pack("<Iii", 40, 64, 48) + bytes(28)
    hdrl = riff_chunk(b"LIST", b"hdrl" + riff_chunk(b"LIST", b"strl" + riff_chunk(b"strh", strh)
                                                    + riff_chunk(b"strf", strf)))
    with pytest.raises(OverBudget):
        avi_info(Reader.of_bytes(avi(hdrl, riff_chunk(b"JUNK", b"") * 200_001)))
