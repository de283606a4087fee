"""Gemma 4: a video's text and tokens from its frame count, frame rate and size.

* **Frames kept**, as ``Gemma4VideoProcessor`` samples them (``do_sample_frames`` on by default):
  transformers' ``default_sample_indices_fn`` with the processor's ``num_frames`` (32), which it
  fills in even where ``fps`` is given, so ``fps`` counts only where ``num_frames`` is unset;
  indices ``arange(n) x total // n``; more frames than the video holds is refused, as the
  processor refuses it;
* **Tokens a frame**: the frame resized with the aspect ratio kept within ``max_soft_tokens`` (70)
  pooled patches (transformers' ``get_aspect_ratio_preserving_size``, called as the processor calls
  it), ``(height / patch) x (width / patch) / pooling^2``;
* **The text** (``Gemma4Processor.replace_video_token``): per frame its time ``MM:SS`` (the frame's
  index over the video's frame rate), a space, the begin-of-image token, the video token once per
  soft token, the end-of-image token; frames joined by spaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.video.info import VideoInfo, minutes_seconds
from lengthscan.measure.video.qwen import VideoCount, VideoRefused


@dataclass(frozen=True)
class Gemma4Video:
    do_sample_frames: bool
    num_frames: int | None
    fps: float | None
    patch_size: int
    max_soft_tokens: int
    pooling_kernel_size: int
    family: str = "gemma4"

    @classmethod
    def from_config(cls, video: dict, *, fps=None, num_frames=None, max_frames=None) -> Gemma4Video:
        """From the video processor's config (its class defaults where it says nothing); ``fps`` or
        ``num_frames`` given count as a call passing them."""
        frames = num_frames or max_frames or video.get("num_frames", 32)
        return cls(bool(video.get("do_sample_frames", True)) or bool(fps or num_frames), frames,
                   fps if fps is not None else video.get("fps"), int(video.get("patch_size") or 16),
                   int(video.get("max_soft_tokens") or 70), int(video.get("pooling_kernel_size") or 3))

    def indices(self, info: VideoInfo) -> list[int]:
        total = info.frames or 0
        if not self.do_sample_frames:
            return list(range(total))
        n = self.num_frames
        if n is None:
            if self.fps is None:
                return list(range(total))
            if not info.fps:
                raise VideoRefused("sampling by fps needs the video's frame rate, which its container lacks")
            n = max(1, int(total / info.fps * self.fps))
        if n > total:
            raise VideoRefused(f"{n} frames asked of a video of {total}")
        return [k * total // n for k in range(n)]

    def count(self, info: VideoInfo, tokens: dict) -> VideoCount:
        """The video's count and text; ``tokens``: the processor's ``boi_token``, ``eoi_token`` and
        ``video_token``."""
        from transformers.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size

        if not info.frames:
            raise VideoRefused("the video has no frames")
        indices = self.indices(info)
        width, height = info.oriented()
        try:
            h, w = get_aspect_ratio_preserving_size(height=height, width=width, patch_size=self.patch_size,
                                                    max_patches=self.max_soft_tokens * self.pooling_kernel_size ** 2,
                                                    pooling_kernel_size=self.pooling_kernel_size)
        except ValueError as exc:
            raise VideoRefused(str(exc)) from None
        per_frame = (h // self.patch_size) * (w // self.patch_size) // self.pooling_kernel_size ** 2
        rate = info.fps or 24  # the processor's own fallback for frames without a rate
        frame = f"{tokens['boi_token']}{tokens['video_token'] * per_frame}{tokens['eoi_token']}"
        text = " ".join(f"{minutes_seconds(i / rate)} {frame}" for i in indices)
        bound = "num_frames" if self.do_sample_frames and self.num_frames else (
            "fps" if self.do_sample_frames and self.fps else "all frames")
        return VideoCount(len(indices), (len(indices), h // self.patch_size, w // self.patch_size),
                          len(indices) * per_frame, h, w, bound, text=text)
