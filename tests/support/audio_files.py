"""Factories that write real audio files (and realistically broken ones) into a directory.

Plain functions, no pytest: tests/measure/audio/test_durations.py wraps them in fixtures. Everything is written
with soundfile/libsndfile, espeak-ng (real speech) or by cutting real files' bytes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

#: (format, subtype, extension, extra SoundFile arguments) of every format the tests write.
FORMATS = (
    ("WAV", "PCM_16", "wav", {}),
    ("WAV", "FLOAT", "wav", {}),
    ("FLAC", "PCM_16", "flac", {}),
    ("OGG", "VORBIS", "ogg", {}),
    ("MP3", "MPEG_LAYER_III", "mp3", {}),
    ("MP3", "MPEG_LAYER_III", "mp3", {"compression_level": 0.5, "bitrate_mode": "CONSTANT"}),
    ("MP3", "MPEG_LAYER_III", "mp3", {"compression_level": 0.5, "bitrate_mode": "VARIABLE"}),
    ("AIFF", "PCM_16", "aiff", {}),
)

RATES = (8000, 16000, 22050, 44100, 48000)

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Out of memory errors in fine tuning are very often a handful of over long samples.",
)


def signal(frames: int, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A chirp plus a little noise: audible content, so lossy encoders keep every frame busy."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames) / rate
    chirp = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)
    y = chirp[:, None] + 0.02 * rng.standard_normal((frames, channels))
    return y.astype(np.float32)


def write_audio(path, frames: int, rate: int, channels: int = 1, *, format="WAV", subtype="PCM_16", **kwargs) -> Path:
    """Write ``frames`` frames of ``signal`` with soundfile; returns the path."""
    import soundfile

    path = Path(path)
    with soundfile.SoundFile(path, "w", rate, channels, subtype, format=format, **kwargs) as f:
        f.write(signal(frames, rate, channels, seed=frames + rate))
    return path


def write_format_matrix(directory) -> list[Path]:
    """Every format of FORMATS at every rate of RATES, mono and stereo, odd lengths."""
    directory = Path(directory)
    out = []
    for i, (fmt, subtype, ext, kwargs) in enumerate(FORMATS):
        for rate in RATES:
            for channels in (1, 2):
                frames = rate + 37 * i + 1000 * channels + 1
                mode = kwargs.get("bitrate_mode", "default").lower()
                name = f"{fmt}-{subtype}-{mode}-{rate}-{channels}ch.{ext}"
                out.append(write_audio(directory / name, frames, rate, channels, format=fmt, subtype=subtype, **kwargs))
    return out


def truncate(src, dst, fraction: float = 0.5) -> Path:
    """The first ``fraction`` of ``src``'s bytes: a download or copy cut short."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def random_bytes(path, size: int = 4096, seed: int = 0) -> Path:
    """Random bytes under an audio name: a corrupt file."""
    Path(path).write_bytes(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes())
    return Path(path)


def empty_wav(path, rate: int = 16000) -> Path:
    """A valid WAV header with zero frames."""
    return write_audio(path, 0, rate)


def raw_pcm(path, frames: int = 16000) -> Path:
    """Headerless 16-bit PCM, as some corpora ship it (.raw/.pcm)."""
    Path(path).write_bytes((signal(frames, 16000)[:, 0] * 32767).astype("<i2").tobytes())
    return Path(path)


def midi_file(path) -> Path:
    """A real, tiny Standard MIDI File: a format libsndfile does not read."""
    track = bytes.fromhex("00903c40" "8360803c40" "00ff2f00")  # note on, 480 ticks, note off, end
    data = b"MThd" + (6).to_bytes(4, "big") + bytes.fromhex("000000010060")
    data += b"MTrk" + len(track).to_bytes(4, "big") + track
    Path(path).write_bytes(data)
    return Path(path)


def strip_mp3_tag(src, dst) -> Path:
    """``src`` without its first MPEG frame (libsndfile/LAME's Xing or Info tag frame).

    Many encoders and stream rippers write no such tag; this makes one from a real MP3.
    """
    from lengthscan.measure.audio.mpeg import mpeg_frame, mpeg_start

    data = Path(src).read_bytes()
    start = mpeg_start(data)
    size, _ = mpeg_frame(int.from_bytes(data[start : start + 4], "big"))
    tag = data[start : start + size]
    assert b"Xing" in tag or b"Info" in tag, "expected a tag frame first"
    Path(dst).write_bytes(data[:start] + data[start + size :])
    return Path(dst)


def espeak_wav(path, text: str, *, speed: int = 160) -> Path | None:
    """Real synthetic speech (22050 Hz mono PCM_16) from Debian's espeak-ng; None if it is absent."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        return None
    subprocess.run([binary, "-s", str(speed), "-w", str(path), text], check=True, capture_output=True)
    return Path(path)


def scipy_test_wavs() -> list[Path]:
    """scipy's own odd WAV test files (24/36/64-bit, RF64, early EOF, inconsistent headers ...)."""
    import scipy.io

    return sorted((Path(scipy.io.__file__).parent / "tests" / "data").glob("*.wav"))
