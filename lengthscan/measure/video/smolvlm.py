"""SmolVLM2: a video's text and tokens from its frame count, frame rate and duration.

* **Frames kept**, as ``SmolVLMVideoProcessor.sample_frames``: ``min(round(fps x duration),
  num_frames)`` (at least 1), spread by ``linspace`` between the first and last frame, or between
  ``skip_secs`` (1 s) after the start and before the end when the video is longer than
  ``2 x skip_secs + num_frames x fps`` seconds; repeated indices count once. ``fps`` and
  ``num_frames`` are the video processor's (``video_sampling`` of the released configs: 1 frame a
  second, at most 64), which the processor's ``apply_chat_template`` passes at every call, so frames
  are sampled; without either, every frame is kept;
* **The text** (``SmolVLMProcessor.replace_video_token``): "You are provided the following series of
  {frames in words} frames from a {H:MM:SS} [H:MM:SS] video.", then per frame "Frame from MM:SS:"
  (the frame's index over the video's frame rate) and the frame as one global image (a fake token,
  ``<global-img>``, ``image_seq_len`` image tokens, a fake token), then a blank line. The words come
  from ``num2words``, which the processor requires too;
* **Tokens**: ``image_seq_len`` (64 in SmolVLM2's released config) image tokens a frame.

A list of frame images has no frame rate: the processor assumes 24 frames a second for the times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from lengthscan.measure.video.info import VideoInfo, minutes_seconds
from lengthscan.measure.video.qwen import VideoCount, VideoRefused

INTRO = "You are provided the following series of {frame_count} frames from a {video_duration} [H:MM:SS] video.\n"
FRAME = "\nFrame from {timestamp}:"
OUTRO = "\n\n"


@dataclass(frozen=True)
class SmolVideo:
    image_seq_len: int
    do_sample_frames: bool
    fps: float | None
    num_frames: int | None
    skip_secs: float = 1
    family: str = "smolvlm"

    @classmethod
    def from_config(cls, video: dict, processor: dict, *, fps=None, num_frames=None, max_frames=None) -> SmolVideo:
        sampling = video.get("video_sampling") or {}
        fps = fps if fps is not None else sampling.get("fps", video.get("fps"))
        frames = num_frames or max_frames or sampling.get("max_frames", video.get("num_frames"))
        return cls(int(processor.get("image_seq_len") or 169), fps is not None or frames is not None,
                   fps, frames)

    def indices(self, info: VideoInfo) -> list[int]:
        """The frames sampled, as ``SmolVLMVideoProcessor.sample_frames`` picks them."""
        total = info.frames or 0
        if not self.do_sample_frames:
            return list(range(total))
        if self.fps is None or self.num_frames is None:
            raise VideoRefused("SmolVLM samples frames by both fps and num_frames: give --fps and --num-frames")
        if not info.fps:
            raise VideoRefused("SmolVLM samples frames by the video's frame rate, which its container lacks")
        duration = info.duration
        desired = max(1, min(int(round(self.fps * duration)), self.num_frames))
        start, end = 0, total - 1
        if self.skip_secs > 0 and duration - 2 * self.skip_secs > self.num_frames * self.fps:
            start, end = int(self.skip_secs * info.fps), int(total - self.skip_secs * info.fps)
        start, end = max(0, start), min(end, total - 1)
        if start >= end:
            start, end = 0, total - 1
        return np.unique(np.linspace(start, end, desired, dtype=int)).tolist()

    def count(self, info: VideoInfo, tokens: dict) -> VideoCount:
        """The video's count and text; ``tokens``: the processor's ``fake_image_token``,
        ``image_token`` and ``global_image_token``."""
        if not info.frames:
            raise VideoRefused("the video has no frames")
        indices = self.indices(info)
        rate = info.fps or 24  # the processor's own fallback for frames without a rate
        times = [i / rate for i in indices]
        duration = int(info.duration) if info.fps else int(times[-1])
        from num2words import num2words

        text = INTRO.format(frame_count=num2words(len(indices)), video_duration=str(timedelta(seconds=duration)))
        image = (tokens["fake_image_token"] + tokens["global_image_token"]
                 + tokens["image_token"] * self.image_seq_len + tokens["fake_image_token"])
        for t in times:
            text += FRAME.format(timestamp=minutes_seconds(t)) + image
        bound = "all frames" if not self.do_sample_frames else (
            "num_frames" if len(indices) >= self.num_frames else "fps")
        return VideoCount(len(indices), (len(indices), 1, 1), len(indices) * self.image_seq_len, 0, 0, bound,
                          text=text + OUTRO)
