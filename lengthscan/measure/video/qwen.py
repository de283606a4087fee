"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: a video's tokens from its container's metadata, as their
video processors compute them on the decoded frames (transformers 5: ``Qwen2VLVideoProcessor``,
which Qwen2.5-VL and the Omni models use too, and ``Qwen3VLVideoProcessor``).

The processor decodes the file with torchcodec, whose exact scan gives ``total_num_frames`` (the
stream's packets) and ``fps`` (those frames over the span of their presentation times): what the
header readers give (``VideoInfo.frames``, ``VideoInfo.fps``). Its frames come rotated as displayed
(torchcodec 0.11 and later), so the resize starts from ``VideoInfo.oriented()``. Then:

* **Frames kept.** Qwen2: every frame unless ``do_sample_frames`` (off by default); sampled, the
  count is ``num_frames`` rounded half-to-even to the temporal patch, or ``fps`` frames a second
  clamped to ``min_frames``..``max_frames`` and the file's frames, floored to the temporal patch;
  the indices are ``torch.arange(0, T, T / n)``, a float step, which keeps ``ceil(T / (T / n))``
  frames: one more than asked for about 4% of (T, n). Qwen3: ``fps`` 2 by default, ``int(T / fps
  x 2)`` clamped to ``min_frames``..``max_frames`` and ``T``, indices ``linspace(0, T - 1, n)``
  rounded (they may repeat).
* **Per-frame size.** ``smart_resize``: each side rounded (half-to-even) to the patch times the
  merge, then scaled into ``[min_pixels, max_pixels]`` (Qwen2: per frame; Qwen3: over all frames,
  the frame count rounded to the temporal patch), with ``cap_pixels_per_frame``'s budget.
* **Grid and tokens.** The frames are padded to a multiple of the temporal patch by repeating the
  last; the grid is (frames / temporal patch, height / patch, width / patch), and the video becomes
  grid_t x grid_h x grid_w / merge^2 video tokens. Qwen3-VL writes each temporal patch as
  ``<{t:.1f} seconds><|vision_start|>`` + its tokens + ``<|vision_end|>`` (t: the mean time of its
  first and last frame), in place of the template's ``<|vision_start|><|video_pad|><|vision_end|>``.

Options are the video processor's as the model ships them (``VideoOptions.from_config``), which the
caller may override (``--fps``, ``--max-frames``...). A video a processor refuses (too few frames,
an aspect ratio over 200, ``num_frames`` over the file's frames) raises ``VideoRefused`` with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from lengthscan.measure.video.info import VideoInfo

#: the class defaults of each family's video processor (transformers 5.25)
DEFAULTS = {
    "qwen2": dict(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=128 * 28 * 28,
                  max_pixels=28 * 28 * 768, min_frames=4, max_frames=768, do_sample_frames=False, fps=None,
                  num_frames=None, cap_pixels_per_frame=False, max_video_tokens=128000),
    "qwen3": dict(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=128 * 32 * 32,
                  max_pixels=32 * 32 * 768, min_frames=4, max_frames=768, do_sample_frames=True, fps=2,
                  num_frames=None, cap_pixels_per_frame=False, max_video_tokens=768),
}


class VideoRefused(ValueError):
    """The processor would refuse this video (the message says why)."""


@dataclass(frozen=True)
class VideoOptions:
    family: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    min_frames: int
    max_frames: int
    do_sample_frames: bool
    fps: float | None
    num_frames: int | None
    cap_pixels_per_frame: bool
    max_video_tokens: int

    @classmethod
    def from_config(cls, family: str, config: dict | None = None, **overrides) -> VideoOptions:
        """The options of ``family``'s video processor loaded with ``config`` (its
        ``video_preprocessor_config.json``, or the image processor's file it falls back to), then
        ``overrides`` (call-time options; ``fps`` or ``num_frames`` turn sampling on, as
        ``apply_chat_template`` does)."""
        config = dict(config or {})
        values = dict(DEFAULTS[family])
        size = config.get("size") or {}
        if size.get("shortest_edge") is not None:
            values["min_pixels"] = size["shortest_edge"]
        if size.get("longest_edge") is not None:
            values["max_pixels"] = size["longest_edge"]
        if family == "qwen2":  # min_pixels/max_pixels keys win over size (Qwen2VLVideoProcessor.__init__)
            for key in ("min_pixels", "max_pixels"):
                if config.get(key) is not None:
                    values[key] = config[key]
        for f in fields(cls):
            if f.name not in ("family", "min_pixels", "max_pixels") and config.get(f.name) is not None:
                values[f.name] = config[f.name]
        values["cap_pixels_per_frame"] = bool(values["cap_pixels_per_frame"])
        options = cls(family=family, **values)
        wanted = {k: v for k, v in overrides.items() if v is not None}
        if ("fps" in wanted or "num_frames" in wanted) and "do_sample_frames" not in wanted:
            wanted["do_sample_frames"] = True
        if family == "qwen3" and "num_frames" in wanted and "fps" not in wanted:
            wanted["fps"] = None  # a frame count replaces the default 2 fps (both given: the processor refuses)
        return replace(options, **wanted)


@dataclass(frozen=True)
class VideoCount:
    """What the processor makes of one video."""

    frames: int                  # frames kept (before padding to the temporal patch)
    grid: tuple[int, int, int]   # (temporal, height, width) patches
    tokens: int                  # video tokens in ``input_ids``
    height: int                  # each frame's size after the resize
    width: int
    bound: str                   # what set the frames kept: all frames, fps, num_frames, min_frames, max_frames
    timestamps: tuple[float, ...] = ()  # Qwen3-VL: per temporal patch, the time it writes (seconds)
    text: str | None = None      # the whole replacement where the family writes its own (SmolVLM2)

    def replacement(self, video_token: str, start: str, end: str) -> str:
        """The text the processor writes for the video's placeholder (Qwen3-VL: for the template's
        ``start + video_token + end``, which it collapses first)."""
        if self.text is not None:
            return self.text
        if not self.timestamps:
            return video_token * self.tokens
        per_patch = self.tokens // self.grid[0]
        return "".join(f"<{t:.1f} seconds>{start}{video_token * per_patch}{end}" for t in self.timestamps)


def count_video(info: VideoInfo, options: VideoOptions) -> VideoCount:
    """The processor's count for a video of ``info`` (``VideoRefused`` where it would refuse it)."""
    total = info.frames
    if not total:
        raise VideoRefused("the video has no frames")
    height, width = _oriented(info)
    if options.family == "qwen3":
        indices, bound = _qwen3_indices(total, info.fps, options)
        frames = len(indices)
        h, w = _qwen3_resize(frames, height, width, options)
        timestamps = _timestamps(indices, info.fps or 24, options.temporal_patch_size)
    else:
        frames, bound = _qwen2_frames(total, info.fps, options)
        h, w = _qwen2_resize(frames, height, width, options)
        timestamps = ()
    t = options.temporal_patch_size
    grid = ((frames + -frames % t) // t, h // options.patch_size, w // options.patch_size)
    tokens = grid[0] * grid[1] * grid[2] // options.merge_size ** 2
    return VideoCount(frames, grid, tokens, h, w, bound, tuple(timestamps))


def _oriented(info: VideoInfo) -> tuple[int, int]:
    width, height = info.oriented()
    return height, width


def _qwen2_frames(total: int, vfps: float | None, o: VideoOptions) -> tuple[int, str]:
    """``Qwen2VLVideoProcessor.sample_frames``: how many frames its indices hold."""
    if not o.do_sample_frames:
        return total, "all frames"
    t = o.temporal_patch_size
    if o.fps is not None and o.num_frames is not None:
        raise VideoRefused("num_frames and fps are mutually exclusive (the processor refuses both)")
    if o.num_frames is not None:
        n, bound = round(o.num_frames / t) * t, "num_frames"
    elif o.fps is not None:
        if not vfps:
            raise VideoRefused("sampling by fps needs the video's frame rate, which its container does not give")
        top = math.floor(min(o.max_frames, total) / t) * t
        wanted = total / vfps * o.fps
        n = min(max(wanted, o.min_frames), top, total)
        bound = "fps" if n == wanted else "min_frames" if n == o.min_frames and wanted < n else (
            "max_frames" if n == top and top < total else "all frames")
        n = math.floor(n / t) * t
    else:
        return total, "all frames"
    if n > total:
        raise VideoRefused(f"num_frames={n} exceeds the video's {total} frames")
    if n <= 0:
        raise VideoRefused(f"{n} frames to sample (the processor divides by it)")
    return math.ceil(total / (total / n)), bound  # len(torch.arange(0, total, total / n))


def _qwen2_resize(frames: int, height: int, width: int, o: VideoOptions) -> tuple[int, int]:
    factor = o.patch_size * o.merge_size
    max_pixels = o.max_pixels
    if o.cap_pixels_per_frame:
        total_pixels = int(o.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, total_pixels * o.temporal_patch_size // frames), int(o.min_pixels * 1.05))
    return qwen2_smart_resize(height, width, factor, o.min_pixels, max_pixels)


def qwen2_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize`` (one frame)."""
    if max(height, width) / min(height, width) > 200:
        raise VideoRefused(f"an aspect ratio of {max(height, width) / min(height, width):.0f} (over 200)")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _qwen3_indices(total: int, vfps: float | None, o: VideoOptions) -> tuple[list[int], str]:
    """``Qwen3VLVideoProcessor.sample_frames`` (its ``min_frames``/``max_frames`` are the
    processor's own, not call-time ones)."""
    if not o.do_sample_frames:
        return list(range(total)), "all frames"
    if o.fps is not None and o.num_frames is not None:
        raise VideoRefused("num_frames and fps are mutually exclusive (the processor refuses both)")
    n, bound = o.num_frames, "num_frames"
    if n is None and o.fps is not None:
        wanted = int(total / (vfps or 24) * o.fps)
        n = min(max(wanted, o.min_frames), o.max_frames, total)
        bound = "fps" if n == wanted else "min_frames" if wanted < o.min_frames and n == o.min_frames else (
            "max_frames" if n == o.max_frames else "all frames")
    if n is None:
        n, bound = min(max(total, o.min_frames), o.max_frames), "all frames"
    return np.linspace(0, total - 1, n).round().astype(int).tolist(), bound


def _qwen3_resize(frames: int, height: int, width: int, o: VideoOptions) -> tuple[int, int]:
    factor = o.patch_size * o.merge_size
    max_pixels = o.max_pixels
    if o.cap_pixels_per_frame:
        per_frame = max(min(o.max_video_tokens * factor * factor, o.max_pixels // frames), int(o.min_pixels * 1.05))
        max_pixels = per_frame * frames
    return frames_resize(frames, height, width, factor, o.temporal_patch_size, o.min_pixels, max_pixels)


def frames_resize(frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: int,
                  max_pixels: int) -> tuple[int, int]:
    """The ``smart_resize`` of the video processors that bound all the frames' pixels together
    (Qwen3-VL, GLM-4V): each side a multiple of ``factor``, ``frames x height x width`` within
    ``[min_pixels, max_pixels]``; sides under ``factor`` scaled up first, fewer frames than the
    temporal patch or an aspect ratio over 200 refused."""
    if frames < temporal:
        raise VideoRefused(f"{frames} frame(s), fewer than the temporal patch of {temporal}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise VideoRefused(f"an aspect ratio of {max(height, width) / min(height, width):.0f} (over 200)")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """``Qwen3VLProcessor._calculate_timestamps``: per temporal patch, the mean time of its first
    and last frame (the indices padded by repeating the last)."""
    indices = list(indices)
    if len(indices) % temporal:
        indices.extend(indices[-1] for _ in range(temporal - len(indices) % temporal))
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]
