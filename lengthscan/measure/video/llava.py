"""LLaVA-NeXT-Video and LLaVA-OneVision: a video's tokens from its frame count alone (their video
processors resize every frame to one size, so the size never changes the count).

* **Frames kept**: every frame unless ``do_sample_frames`` (off by default); sampled, transformers'
  ``default_sample_indices_fn``: ``num_frames`` exactly, or ``max(1, int(T / fps_video x fps))``
  (more frames than the file holds: refused, as the processor refuses them);
* **LLaVA-NeXT-Video**: ``(crop_height // patch) x (crop_width // patch) // 4`` tokens a frame (the
  processor's average pooling), the frames center-cropped to ``crop_size`` (224 by default; the
  released 7B configs crop 336: 144 a frame);
* **LLaVA-OneVision**: ``frames x ceil(sqrt(num_image_tokens) / 2)^2 + 1`` (the pooled patches of
  each frame, and one newline token a video; 196 a frame with 729 image tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.qwen import VideoCount, VideoRefused


@dataclass(frozen=True)
class LlavaVideo:
    family: str                  # "llava_next_video" or "llava_onevision"
    per_frame: int               # tokens a frame
    extra: int                   # tokens a video besides its frames'
    do_sample_frames: bool = False
    fps: float | None = None
    num_frames: int | None = None

    @classmethod
    def from_config(cls, family: str, video: dict, processor: dict, **overrides) -> LlavaVideo:
        """From the video processor's config and the processor's (``processor_config.json``)."""
        if family == "llava_onevision":
            side = math.ceil(int(math.sqrt(int(processor.get("num_image_tokens") or 729))) / 2)
            per_frame, extra = side * side, 1
        else:
            if video.get("do_center_crop") is False:
                raise VideoRefused("LLaVA-NeXT-Video without a center crop: the frames' size (and count) follow each "
                                   "video's aspect ratio, which lengthscan does not count yet")
            crop = video.get("crop_size") or {"height": 224, "width": 224}
            patch = int(processor.get("patch_size") or 14)
            per_frame, extra = (int(crop["height"]) // patch) * (int(crop["width"]) // patch) // 4, 0
        wanted = {k: v for k, v in overrides.items() if v is not None}
        sample = bool(video.get("do_sample_frames", False))
        if "fps" in wanted or "num_frames" in wanted:
            sample = True
        return cls(family, per_frame, extra, sample, wanted.get("fps", video.get("fps")),
                   wanted.get("num_frames", video.get("num_frames")))

    def count(self, info: VideoInfo) -> VideoCount:
        total = info.frames or 0
        if not total:
            raise VideoRefused("the video has no frames")
        frames, bound = total, "all frames"
        if self.do_sample_frames:
            if self.fps is not None and self.num_frames is not None:
                raise VideoRefused("num_frames and fps are mutually exclusive (the processor refuses both)")
            if self.num_frames is not None:
                frames, bound = self.num_frames, "num_frames"
            elif self.fps is not None:
                if not info.fps:
                    raise VideoRefused("sampling by fps needs the video's frame rate, which its container lacks")
                frames, bound = max(1, int(total / info.fps * self.fps)), "fps"
            if frames > total:
                raise VideoRefused(f"{frames} frames asked of a video of {total}")
        return VideoCount(frames, (frames, 1, 1), frames * self.per_frame + self.extra, 0, 0, bound)
