"""Real video files made offline with PyAV (FFmpeg's encoders and muxers, from its PyPI wheel), and
what PyAV reports of them on decoding: the reference the header readers are checked against."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest


def frame_image(i: int, width: int, height: int) -> np.ndarray:
    """A moving gradient: frame ``i`` of a clip."""
    ramp = np.linspace(0, 255, width)[None, :, None].astype(np.int64)
    return np.broadcast_to(((ramp + 7 * i) % 256).astype(np.uint8), (height, width, 3)).copy()


def make_clip(path: Path, codec: str = "libx264", rate=30, frames: int = 30, size=(160, 96), *,
              rotation: int | None = None, pts_ms: list[int] | None = None, audio_seconds: float = 0,
              options: dict | None = None) -> Path:
    """Encode ``frames`` frames of a moving gradient to ``path`` (the container from its suffix);
    ``pts_ms``: each frame's time in ms, each packet lasting to the next (a variable frame rate);
    ``audio_seconds``: an audio track of that length too."""
    av = pytest.importorskip("av")
    width, height = size
    with av.open(str(path), "w", options=options or {}) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if pts_ms is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
            ends = dict(zip(pts_ms, pts_ms[1:] + [pts_ms[-1] + 40]))
        if rotation is not None:
            stream.set_display_rotation(rotation)
        sound = out.add_stream("mp2" if path.suffix == ".avi" else "aac", rate=48000) if audio_seconds else None

        def mux(packets):
            for packet in packets:
                if pts_ms is not None:
                    packet.duration = ends[packet.pts] - packet.pts
                out.mux(packet)

        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_image(i, width, height), format="rgb24")
            if pts_ms is not None:
                frame.pts, frame.time_base = pts_ms[i], Fraction(1, 1000)
            mux(stream.encode(frame))
        mux(stream.encode())
        if not frames:
            out.start_encoding()  # the header, with the track, and nothing after it
        if sound is not None:
            audio_track(out, sound, audio_seconds)
    return path


def audio_track(out, stream, seconds: float) -> None:
    """``seconds`` of a tone on the audio ``stream`` of ``out``."""
    import av

    samples = int(48000 * seconds)
    tone = (np.sin(np.arange(samples) / 10) * 8000).astype(np.int16)
    frame_size = stream.codec_context.frame_size or 1152
    for start in range(0, samples, frame_size):
        chunk = tone[start:start + frame_size]
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48000, start
        out.mux(stream.encode(frame))
    out.mux(stream.encode())


def decoded(path: Path) -> dict:
    """What PyAV finds by demuxing and decoding: frames, the coded size, the display rotation, and
    the span of the packets' presentation times (the latest end less the earliest start, seconds:
    what torchcodec's exact scan measures a stream's duration by, and its average fps from)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.duration or 0) for p in container.demux(video=0) if p.size and p.pts is not None]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(video=0))
        span = (max(a + d for a, d in packets) - min(a for a, _ in packets)) * stream.time_base if packets else 0
        return {"frames": len(frames), "width": stream.codec_context.width, "height": stream.codec_context.height,
                "rotation": frames[0].rotation % 360 if frames else 0, "duration": float(span)}
