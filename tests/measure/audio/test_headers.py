"""The pure-Python header parsers (lengthscan.measure.audio.headers) against libsndfile, file by file.

``read_info`` skips libsndfile where ``audio_headers.probe`` can parse a header itself; these tests
check that every answer equals the libsndfile path's (``audio.libsndfile_info``: frames, rate,
channels, format, subtype, decoded, flag and error message), by path and from bytes, on real files:
every format soundfile writes at many rates, channel counts and lengths (0 frames to minutes),
espeak-ng speech, scipy's odd WAVs, then cut, padded, re-tagged and damaged copies of them.
"""

from __future__ import annotations

import io
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile

from lengthscan.measure.audio import durations as audio
from lengthscan.measure.audio.headers import hint, mpeg_frame, probe
from tests.support import audio_files as af

# libsndfile reading cut files from BytesIO (the reference path) makes soundfile's seek callback
# raise inside cffi: reported, harmless, not ours
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

RATES = (8000, 16000, 22050, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the rates libsndfile encodes Opus at


def _write(path: Path, frames: int, rate: int, channels: int, fmt: str, subtype: str, **kw) -> Path:
    with soundfile.SoundFile(path, "w", rate, channels, subtype, format=fmt, **kw) as f:
        if frames:
            f.write(af.signal(frames, rate, channels, seed=frames + rate + channels))
    return path


def _corpus(d: Path) -> list[Path]:
    """Complete files: each combination below, lengths chosen to hit block and page edges."""
    out, i = [], 0
    lengths = (0, 1, 575, 4097, 16001)
    wav = [("WAV", s) for s in ("PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")]
    wav += [("WAVEX", s) for s in ("PCM_16", "PCM_24", "FLOAT")] + [("RF64", "PCM_16"), ("AIFF", "PCM_16")]
    for (fmt, sub), rate, ch, n in _spread([wav, RATES, (1, 2, 6), lengths], 120):
        out.append(_write(d / f"w{i}.{fmt.lower()}", n, rate, ch, fmt, sub))
        i += 1
    for sub, rate, ch, n in _spread([("PCM_S8", "PCM_16", "PCM_24"), RATES, (1, 2, 6), lengths + (4096, 4608)], 50):
        out.append(_write(d / f"f{i}.flac", n, rate, ch, "FLAC", sub))
        i += 1
    for rate, ch, n in _spread([RATES, (1, 2), lengths + (48000,)], 24):
        out.append(_write(d / f"v{i}.ogg", n, rate, ch, "OGG", "VORBIS"))
        i += 1
    for rate, ch, n in _spread([OPUS_RATES, (1, 2), lengths + (48000,)], 20):
        out.append(_write(d / f"o{i}.opus", n, rate, ch, "OGG", "OPUS"))
        i += 1
    modes = ({}, {"bitrate_mode": "CONSTANT", "compression_level": 0.5},
             {"bitrate_mode": "VARIABLE", "compression_level": 0.9})
    for kw, rate, ch, n in _spread([modes, RATES + (11025, 12000, 24000, 32000), (1, 2), lengths[1:] + (1152,)], 45):
        out.append(_write(d / f"m{i}.mp3", n, rate, ch, "MP3", "MPEG_LAYER_III", **kw))
        i += 1
    minutes = 8000 * 150  # two and a half minutes
    for fmt, sub, ext in (("WAV", "PCM_16", "wav"), ("FLAC", "PCM_16", "flac"), ("OGG", "VORBIS", "ogg"),
                          ("OGG", "OPUS", "opus"), ("MP3", "MPEG_LAYER_III", "mp3")):
        out.append(_write(d / f"long.{ext}", minutes, 8000, 1, fmt, sub))
    return out


def _spread(axes: list, n: int) -> list[tuple]:
    """``n`` combinations of the axes: each axis cycles through its values in its own shuffled order."""
    rng = np.random.default_rng(len(axes) * 1000 + n)
    columns = []
    for axis in axes:
        order = [axis[i] for _ in range(n // len(axis) + 1) for i in rng.permutation(len(axis))]
        columns.append(order[:n])
    return list(zip(*columns))


def _speech(d: Path) -> list[Path]:
    if shutil.which("espeak-ng") is None:
        return []
    out = []
    for i, text in enumerate(af.SENTENCES):
        wav = af.espeak_wav(d / f"speech{i}.wav", text)
        y, rate = soundfile.read(wav)
        out.append(wav)
        for fmt, sub, ext in (("FLAC", "PCM_16", "flac"), ("OGG", "VORBIS", "ogg"), ("MP3", "MPEG_LAYER_III", "mp3")):
            soundfile.write(d / f"speech{i}.{ext}", y, rate, format=fmt, subtype=sub)
            out.append(d / f"speech{i}.{ext}")
        soundfile.write(d / f"speech{i}.opus", y, 16000 if rate == 16000 else 24000, format="OGG", subtype="OPUS")
        out.append(d / f"speech{i}.opus")
    return out


def _variants(src: Path, d: Path) -> list[Path]:
    """Cut copies (header only, mid-file, one byte short ...), junk appended, a byte flipped near the end."""
    data, out = src.read_bytes(), []
    cuts = sorted({12, 44, 100, len(data) // 10, len(data) // 2, len(data) - 200, len(data) - 3, len(data) - 1})
    for k, cut in enumerate(c for c in cuts if 0 < c < len(data)):
        out.append(d / f"{src.stem}-cut{k}{src.suffix}")
        out[-1].write_bytes(data[:cut])
    out.append(d / f"{src.stem}-junk{src.suffix}")
    out[-1].write_bytes(data + b"\x00junk after the end" * 3)
    for k, at in enumerate((len(data) - 5, len(data) // 2, len(data) // 3 + 1)):  # near the end, mid-file
        if len(data) > 64:
            flipped = bytearray(data)
            flipped[at] ^= 0x10
            out.append(d / f"{src.stem}-flip{k}{src.suffix}")
            out[-1].write_bytes(bytes(flipped))
    return out


def _wav_with_chunks(src: Path, d: Path) -> list[Path]:
    """A plain PCM WAV rewritten with a LIST/INFO chunk (as ffmpeg writes) before or after the data."""
    data = src.read_bytes()
    fmt_end, body = 36, data[44:]
    info = b"INFO" + b"ISFT" + struct.pack("<I", 14) + b"Lavf60.16.100\0"
    chunk = b"LIST" + struct.pack("<I", len(info)) + info
    before = data[12:fmt_end] + chunk + data[36:44] + body
    after = data[12:44] + body + chunk
    out = []
    for name, riff in (("before", before), ("after", after)):
        out.append(d / f"{src.stem}-list-{name}.wav")
        out[-1].write_bytes(b"RIFF" + struct.pack("<I", len(riff) + 4) + b"WAVE" + riff)
    bad = bytearray(before)  # an INFO item too long for libsndfile's buffer: not ours to parse
    at = bad.find(b"ISFT") + 4
    bad[at : at + 4] = struct.pack("<I", 600)
    out.append(d / f"{src.stem}-list-bad.wav")
    out[-1].write_bytes(b"RIFF" + struct.pack("<I", len(bad) + 4) + b"WAVE" + bytes(bad))
    return out


def _mp3_tags(src: Path, d: Path) -> list[Path]:
    """The MP3 with an ID3v2 tag before it, an ID3v1 tag after it, and without its Xing/Info frame."""
    data = src.read_bytes()
    frame = b"TIT2" + struct.pack(">I", 6) + b"\0\0" + b"\x03title"
    id3 = b"ID3\x03\x00\x00" + bytes([0, 0, 0, len(frame)]) + frame
    id3v1 = b"TAG" + b"title".ljust(30, b"\0") + bytes(95)
    out = [d / f"{src.stem}-id3v2.mp3", d / f"{src.stem}-id3v1.mp3", d / f"{src.stem}-badheader.mp3"]
    out[0].write_bytes(id3 + data)
    out[1].write_bytes(data + id3v1)
    second = mpeg_frame(int.from_bytes(data[:4], "big"))[0]  # the first audio frame's header
    damaged = bytearray(data)
    damaged[second + 2] ^= 0x40  # another bitrate: mpg123 loses the frame chain when it seeks
    out[2].write_bytes(bytes(damaged))
    out.append(af.strip_mp3_tag(src, d / f"{src.stem}-untagged.mp3"))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("headers")
    complete = _corpus(d) + _speech(d)
    odd = af.scipy_test_wavs()
    derived = []
    short = [p for p in complete if p.stat().st_size < 200_000]
    for p in short[::3]:
        derived += _variants(p, d)
    for p in [p for p in complete if p.suffix == ".wav" and soundfile.info(str(p)).subtype == "PCM_16"][:6]:
        derived += _wav_with_chunks(p, d)
    for p in [p for p in complete if p.suffix == ".mp3"][:12]:
        derived += _mp3_tags(p, d)
    return {"complete": complete, "odd": odd, "derived": derived}


def _same(path: Path) -> bool:
    """read_info equals the libsndfile path, by path and from bytes; asserts with the difference."""
    data = path.read_bytes()
    ref, got = audio.libsndfile_info(None, str(path)), audio.read_info(str(path))
    assert got == ref, (path, got, ref)
    ref_b, got_b = audio.libsndfile_info(data, None), audio.read_info(data)
    assert got_b == ref_b, (path, got_b, ref_b)
    assert (probe(None, str(path)) is None) == (probe(data, None) is None), path
    return probe(data, None) is not None


def test_complete_files_match_libsndfile_and_take_the_fast_path(files):
    fast = {}
    for path in files["complete"]:
        hit = _same(path)
        info = audio.read_info(str(path))
        try:
            ref = soundfile.info(str(path))
        except soundfile.LibsndfileError:  # 0-frame FLAC and MP3: libsndfile cannot open them
            assert info.flag == "unreadable" and not hit, path
            continue
        assert (info.frames, info.samplerate, info.channels, info.format, info.subtype) == (
            ref.frames, ref.samplerate, ref.channels, ref.format, ref.subtype), path
        fmt = ref.format
        fast.setdefault(fmt, []).append(hit)
    # the parsers cover these in full (every complete file of them skips libsndfile) ...
    for fmt in ("WAV", "WAVEX", "FLAC", "OGG"):
        assert all(fast[fmt]), (fmt, fast[fmt].count(False))
    # ... MP3 except the shortest (LAME's padding then falls under mpg123's decoder delay)
    assert sum(fast["MP3"]) >= 0.8 * len(fast["MP3"])
    # ... and leave the rest to libsndfile
    assert not any(fast["RF64"]) and not any(fast["AIFF"])
    assert len(files["complete"]) >= 260


def test_odd_wavs_match_libsndfile(files):
    for path in files["odd"]:
        _same(path)


def test_cut_padded_retagged_and_damaged_copies_match_libsndfile(files):
    derived = files["derived"]
    hits = [_same(p) for p in derived]
    assert len(derived) >= 400
    # a cut copy is never answered from its header when libsndfile would flag or refuse it
    for path, hit in zip(derived, hits):
        if hit:
            assert audio.libsndfile_info(None, str(path)).flag in (None, "empty"), path
    by_name = {p.name: hit for p, hit in zip(derived, hits)}
    assert all(hit for name, hit in by_name.items() if "-list-before" in name or "-list-after" in name)
    assert not any(hit for name, hit in by_name.items() if "-list-bad" in name or "-untagged" in name)
    assert not any(hit for name, hit in by_name.items() if "-badheader" in name)
    assert any(hit for name, hit in by_name.items() if name.endswith("-id3v2.mp3"))
    # a damaged Ogg page anywhere fails its CRC: libsndfile decides (it may notice, when it seeks)
    assert not any(hit for name, hit in by_name.items() if "-flip" in name and name.endswith((".ogg", ".opus")))


def test_truncated_compressed_files_fall_back(tmp_path):
    """The cases tests/measure/audio/test_durations.py pins down, seen from here: the header parsers decline them."""
    good = {
        "flac": _write(tmp_path / "g.flac", 48000, 16000, 1, "FLAC", "PCM_16"),
        "mp3": _write(tmp_path / "g.mp3", 48000, 16000, 2, "MP3", "MPEG_LAYER_III"),
        "ogg": _write(tmp_path / "g.ogg", 48000, 16000, 1, "OGG", "VORBIS"),
        "wav": _write(tmp_path / "g.wav", 48000, 16000, 2, "WAV", "PCM_16"),
    }
    for name, path in good.items():
        assert probe(None, str(path)) is not None, name
        half = af.truncate(path, tmp_path / f"half.{name}")
        assert probe(None, str(half)) is None, name
        assert probe(half.read_bytes(), None) is None, name
    assert audio.read_info(str(tmp_path / "half.flac")).flag == "unreadable"
    assert audio.read_info(str(tmp_path / "half.mp3")).flag == "truncated"
    assert audio.read_info(str(tmp_path / "half.wav")).flag == "truncated"


def test_probe_reads_only_the_ends_of_a_file(tmp_path):
    """A long file costs the same as a short one: the parsers read its head and its tail."""
    path = _write(tmp_path / "long.flac", 16000 * 60, 16000, 1, "FLAC", "PCM_16")
    data = path.read_bytes()
    middle = len(data) // 2
    damaged = data[:middle] + bytes(1000) + data[middle + 1000 :]  # the middle zeroed: header parse cannot see it
    assert probe(damaged, None) == probe(data, None) == (16000 * 60, 16000, 1, "FLAC", "PCM_16")


def test_bytes_values_and_memoryviews(files):
    path = next(p for p in files["complete"] if p.suffix == ".ogg" and p.stat().st_size > 5000)
    data = path.read_bytes()
    expected = audio.read_info(str(path))
    assert audio.read_info(memoryview(data)) == audio.read_info(bytearray(data)) == expected
    assert audio.read_info({"bytes": data, "path": "x.ogg"}) == expected
    assert probe(io.BytesIO(data).getvalue(), None) is not None


def test_read_infos_same_results_with_prefetch_and_threads(files, tmp_path):
    sources = [str(p) for p in files["complete"][::4]] + [str(p) for p in files["derived"][::9]]
    sources += [str(tmp_path / "gone.wav"), str(tmp_path), None, files["complete"][3].read_bytes()]
    plain = [audio.read_info(s) for s in sources]
    assert audio.read_infos(sources, prefetch=0) == plain
    assert audio.read_infos(sources) == plain
    assert audio.read_infos(sources, prefetch=1000) == plain
    assert audio.read_infos(sources, threads=4) == plain
    for nothing in (None, str(tmp_path / "gone.wav"), str(tmp_path), "bad\0name"):
        hint(nothing)  # a hint never raises


def test_probe_never_raises_on_random_bytes():
    rng = np.random.default_rng(0)
    for magic in (b"RIFF", b"fLaC", b"OggS", b"\xff\xfb", b"ID3\x03", b""):
        for size in (0, 3, 40, 300, 5000):
            blob = magic + rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            assert probe(blob, None) is None
