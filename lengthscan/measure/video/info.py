"""What a video's container says of it, as a decoder reports it before decoding: the record the
header readers return, and their error.

The figures are those PyAV (FFmpeg) gives on opening the file, which is what transformers' video
loaders read (``VideoMetadata``: ``total_num_frames``, ``fps``, ``duration``, ``width``,
``height``) and what the processors sample frames from:

* ``frames``: the video stream's frame count as the container declares it (MP4: the sample table;
  Matroska: none is declared, so None; AVI: the stream header's length);
* ``fps``: the stream's average frame rate (frames over the stream's duration, as FFmpeg's
  ``avg_frame_rate``), or the declared rate where frames are not counted;
* ``duration``: the video stream's duration in seconds;
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


__all__ = ["CutShort", "OverBudget", "VideoError", "VideoInfo"]
