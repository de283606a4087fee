"""Real video files made offline with PyAV (FFmpeg's encoders and muxers, from its PyPI wheel), and
what PyAV reports of them on decoding: the reference the header readers are checked against."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest


def make_clip(path: Path, *, codec: str = "libx264", rate=30, frames: int = 30, size=(160, 96),
              rotation: int | None = None, options: dict | None = None, pts_ms: list[int] | None = None) -> Path:
    """Encode ``frames`` frames (a gradient that changes each frame) to ``path`` (the container
    from its suffix); ``pts_ms``: each frame's time in milliseconds (a variable frame rate)."""
    av = pytest.importorskip("av")
    width, height = size
    with av.open(str(path), "w", options=options or {}) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if pts_ms is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        ramp = np.linspace(0, 255, width, dtype=np.uint8)[None, :, None]
        for i in range(frames):
            image = np.broadcast_to(((ramp.astype(np.int64) + 7 * i) % 256).astype(np.uint8), (height, width, 3)).copy()
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            if pts_ms is not None:
                frame.pts, frame.time_base = pts_ms[i], Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


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
