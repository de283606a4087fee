"""What a video's container says of it, as a decoder reports it before decoding: the record the
header readers return, and their error.

The figures are those transformers' processors sample frames from: they decode with torchcodec,
whose exact scan of the packets gives ``VideoMetadata`` (``total_num_frames``, ``fps``,
``duration``, ``width``, ``height``):

* ``frames``: the video stream's frames, as a demuxer reads its packets (MP4: the sample table and
  fragments; Matroska: its Blocks, one a lace; AVI: the stream's chunks that hold data, from its
  index or its ``movi`` list);
* ``duration``: the span of the frames' presentation times, the latest end less the earliest
  start (what torchcodec's exact scan measures), in seconds;
* ``fps``: frames over that duration (torchcodec's ``average_fps``);
* ``width``, ``height``: the coded size as stored; ``rotation``: the display rotation in degrees
  (0, 90, 180, 270) a player applies (and FFmpeg's ``autorotate``), which swaps width and height
  for 90 and 270.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.images.reader import CutShort, ImageError, OverBudget


class VideoError(ImageError):
    """Not a video container lengthscan can read (the message says why)."""


@dataclass(frozen=True)
class VideoInfo:
    duration: float
    frames: int | None
    fps: float | None
    width: int
    height: int
    rotation: int = 0
    container: str = ""

    def oriented(self) -> tuple[int, int]:
        """(width, height) as displayed: swapped for a rotation of 90 or 270 degrees."""
        return (self.height, self.width) if self.rotation in (90, 270) else (self.width, self.height)


def minutes_seconds(seconds: float) -> str:
    """``MM:SS`` of a frame's time, as the processors that write frame times (SmolVLM2, Gemma 4) write it."""
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


__all__ = ["CutShort", "OverBudget", "VideoError", "VideoInfo", "minutes_seconds"]
