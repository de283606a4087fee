"""GLM-4.1V and GLM-4.6V: a video's text and tokens from its frame count, frame rate, duration and size.

* **Frames kept** (``do_sample_frames`` on by default), as each video processor's ``sample_frames``:
  GLM-4.1V (``Glm4vVideoProcessor``) takes ``floor(duration x fps)`` frames at ``ceil(i x rate /
  fps)`` (``fps`` 2), or for a video over ``max_duration`` (300 s) ``max_duration x fps`` frames
  spread by ``linspace`` over the duration; GLM-4.6V (``Glm46VVideoProcessor``) picks its own rate
  by the duration (3 a second up to 30 s, 1 up to 300 s, 0.5 beyond, twice that in frames, at most
  640) and walks the frames' times, filling by ``linspace`` where too few; ``fps`` does not count.
  Both drop repeated indices and repeat the last where their number is odd;
* **Per-frame size** (``smart_resize`` of the video module, over all the frames: the frame count
  times the frame's pixels bounded by ``size.longest_edge``, at least ``size.shortest_edge``), each
  side a multiple of the patch times the merge; sides under that factor scaled up first, an aspect
  ratio over 200 refused;
* **Grid and tokens**: ``frames / temporal_patch_size`` temporal patches of ``(h / patch) x (w /
  patch) / merge^2`` tokens each;
* **The text** (``replace_video_token``): per temporal patch ``<|begin_of_image|>``, the image token
  once per token, ``<|end_of_image|>`` and the time of the patch's first frame, written ``int(t)``
  (GLM-4.1V) or ``{t:.1f} seconds`` (GLM-4.6V), in place of the template's ``<|video|>``.

A list of frame images has no frame rate: the processors assume 24 frames a second for the times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.qwen import VideoCount, VideoRefused, frames_resize

#: the processors' sampling constants (``Glm46VVideoProcessor.sample_frames``)
DYNAMIC_FPS = ((30, 3), (300, 1), (2400, 0.5))
MAX_DYNAMIC_FRAMES = 640


@dataclass(frozen=True)
class GlmVideo:
    family: str                  # "glm4v" (GLM-4.1V, GLM-4.5V) or "glm46v" (GLM-4.6V)
    do_sample_frames: bool
    fps: float
    max_duration: float
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    num_frames: None = None      # the processors read no frame count

    @classmethod
    def from_config(cls, family: str, video: dict, *, fps=None, num_frames=None, max_frames=None) -> GlmVideo:
        """From the video processor's config (its class defaults where it says nothing); ``fps``
        given counts as a call passing it (GLM-4.1V only: GLM-4.6V picks its own rate)."""
        if num_frames or max_frames:
            raise VideoRefused("GLM-4V's video processors sample by the video's duration (their sample_frames "
                               "takes no frame count): --num-frames and --max-frames do not apply; "
                               + ("GLM-4.6V picks its own rate" if family == "glm46v" else "give --fps"))
        if fps is not None and family == "glm46v":
            raise VideoRefused("GLM-4.6V's video processor picks its frame rate by the video's duration (its "
                               "sample_frames reads no fps): --fps does not apply")
        size = video.get("size") or {}
        return cls(family, bool(video.get("do_sample_frames", True)) or fps is not None,
                   float(fps if fps is not None else video.get("fps") or 2), float(video.get("max_duration") or 300),
                   int(size.get("shortest_edge") or 112 * 112), int(size.get("longest_edge") or 28 * 28 * 2 * 30000),
                   int(video.get("patch_size") or 14), int(video.get("temporal_patch_size") or 2),
                   int(video.get("merge_size") or 2))

    def indices(self, info: VideoInfo) -> list[int]:
        """The frames the video processor samples (all of them without sampling)."""
        total = info.frames or 0
        if not self.do_sample_frames:
            return list(range(total))
        if not info.fps:
            raise VideoRefused("GLM-4V samples frames by the video's frame rate, which its container lacks")
        last = total - 1
        duration = info.duration or round(last / info.fps) + 1
        picked = self._dynamic(total, info.fps, duration) if self.family == "glm46v" else \
            self._by_fps(total, info.fps, duration)
        unique = list(dict.fromkeys(picked))
        if len(unique) & 1:
            unique.append(unique[-1])
        return unique

    def _by_fps(self, total: int, rate: float, duration: float) -> list[int]:
        last = total - 1
        if duration <= self.max_duration:
            n = max(int(math.floor(duration * self.fps)), 1)
            return [min(last, int(math.ceil(i * rate / self.fps))) for i in range(n)]
        n = int(self.max_duration * self.fps)
        if n >= total:
            return list(range(total))
        return [min(last, int(math.ceil(t * rate))) for t in np.linspace(0, duration, n, endpoint=True)]

    def _dynamic(self, total: int, rate: float, duration: float) -> list[int]:
        effective = min(duration, DYNAMIC_FPS[-1][0])
        target = next(f for bound, f in DYNAMIC_FPS if effective <= bound)
        wanted = min(int(effective * target * self.temporal_patch_size), MAX_DYNAMIC_FRAMES)
        if total < wanted:
            picked = np.linspace(0, total - 1, wanted, dtype=int).tolist()
        else:
            picked, current, step, top = [], 0, 1 / (self.temporal_patch_size * target), int(duration)
            for index in range(total):
                if index * (1 / rate) >= current:
                    current += step
                    picked.append(index)
                    if current >= top:
                        break
        if len(picked) < wanted:
            start, end = (picked[0], picked[-1]) if picked else (0, max(total - 1, 0))
            picked = np.linspace(start, end, wanted, dtype=int).tolist()
        elif len(picked) > wanted:
            picked = np.linspace(0, total - 1, wanted, dtype=int).tolist()
        return picked

    def resize(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The video module's ``smart_resize`` over ``frames`` frames of ``height`` x ``width``."""
        return frames_resize(frames, height, width, self.patch_size * self.merge_size, self.temporal_patch_size,
                             self.min_pixels, self.max_pixels)

    def count(self, info: VideoInfo, tokens: dict) -> VideoCount:
        """The video's count and text; ``tokens``: the processor's ``image_token``."""
        if not info.frames:
            raise VideoRefused("the video has no frames")
        indices = self.indices(info)
        if not indices:
            raise VideoRefused(f"its sampling keeps no frame of a clip of {info.duration:.2f} s (the processor fails)")
        width, height = info.oriented()
        h, w = self.resize(len(indices), height, width)
        t = self.temporal_patch_size
        grid = ((len(indices) + -len(indices) % t) // t, h // self.patch_size, w // self.patch_size)
        per_patch = grid[1] * grid[2] // self.merge_size ** 2
        rate = info.fps or 24  # the processors' own fallback for frames without a rate
        times = [i / rate for i in indices[::2]][:grid[0]]
        times += [times[-1] if times else 0] * (grid[0] - len(times))
        body = f"<|begin_of_image|>{tokens['image_token'] * per_patch}<|end_of_image|>"
        text = "".join(body + (f"{s:.1f} seconds" if self.family == "glm46v" else str(int(s))) for s in times)
        bound = "fps" if self.do_sample_frames and self.family == "glm4v" else (
            "duration" if self.do_sample_frames else "all frames")
        return VideoCount(len(indices), grid, grid[0] * per_patch, h, w, bound, text=text)
