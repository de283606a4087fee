"""Video tokens as a model's processor expands them, from a video's container metadata alone.

``VideoCounter`` reads the model's video processor options where transformers loads them from
(``processor_config.json``'s ``video_processor``, else ``video_preprocessor_config.json``, else the
image processor's ``preprocessor_config.json``, whose ``min_pixels``/``max_pixels`` then apply to
every frame), tells the family by its ``video_processor_type`` (or the processor class), and counts
with ``qwen.count_video``, ``llava.py``, ``smolvlm.py``, ``gemma4.py`` or ``glm.py`` (the processors' video classes need
torchvision; their rules are reproduced there and checked against the processors' own code). Options given to the run
(``--fps``, ``--num-frames``, ``--max-frames``, ``--max-pixels``) count as if the processor's config
said them (``fps`` or ``num_frames`` turn frame sampling on, as ``apply_chat_template`` does). The
Omni processors (Qwen2.5-Omni, Qwen3-Omni) pass their own per-frame pixel bounds at every call,
which win over the checkpoint's (``FORCED_PIXELS``).

The text: the processor writes its video token (the tokenizer's ``video_token``, else
``<|video_pad|>``) once per video token; Qwen3-VL writes each temporal patch's timestamp and its
vision start and end tokens, in place of the template's ``<|vision_start|><|video_pad|><|vision_end|>``.
"""

from __future__ import annotations

import json

from lengthscan.measure.model_files import config_files
from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.qwen import VideoCount, VideoOptions, VideoRefused, count_video
from lengthscan.measure.video.refs import FRAMES

#: video processor classes (and processor classes) -> the family that counts them (``qwen.py``, ``llava.py``)
FAMILIES = {"Qwen2VLVideoProcessor": "qwen2", "Qwen3VLVideoProcessor": "qwen3",
            "Qwen2VLProcessor": "qwen2", "Qwen2_5_VLProcessor": "qwen2", "Qwen2_5OmniProcessor": "qwen2",
            "Qwen3VLProcessor": "qwen3", "Qwen3OmniMoeProcessor": "qwen2",
            "LlavaNextVideoVideoProcessor": "llava_next_video", "LlavaNextVideoProcessor": "llava_next_video",
            "LlavaOnevisionVideoProcessor": "llava_onevision", "LlavaOnevisionProcessor": "llava_onevision",
            "SmolVLMVideoProcessor": "smolvlm", "SmolVLMProcessor": "smolvlm",
            "Gemma4VideoProcessor": "gemma4", "Gemma4Processor": "gemma4",
            "Glm4vVideoProcessor": "glm4v", "Glm4vProcessor": "glm4v",
            "Glm46VVideoProcessor": "glm46v", "Glm46VProcessor": "glm46v"}
#: the per-frame pixel bounds the Omni processors pass their video processor at every call (their
#: ``videos_kwargs``), which override the config's
FORCED_PIXELS = {"Qwen2_5OmniProcessor": (128 * 28 * 28, 768 * 28 * 28),
                 "Qwen3OmniMoeProcessor": (128 * 32 * 32, 768 * 32 * 32)}
#: the video token a family's processor writes where the tokenizer names none
VIDEO_TOKENS = {"qwen2": "<|video_pad|>", "qwen3": "<|video_pad|>", "llava_next_video": "<video>",
                "llava_onevision": "<video>", "smolvlm": "<video>", "gemma4": "<|video|>", "glm4v": "<|video|>",
                "glm46v": "<|video|>"}
#: SmolVLM2's frame tokens, as its processor reads them off the tokenizer (with these defaults)
SMOLVLM_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                  "global_image_token": "<global-img>"}
#: the config files a video processor is read from, in transformers' order
CONFIG_FILES = ("processor_config.json", "video_preprocessor_config.json", "preprocessor_config.json")


class VideoConfigError(ValueError):
    """The model's video processor is missing or not one lengthscan counts (exit 2)."""


class VideoCounter:
    """Counts videos for one model's video processor and tokenizer; picklable."""

    def __init__(self, source: str, tokenizer=None, *, fps: float | None = None, num_frames: int | None = None,
                 max_frames: int | None = None, max_pixels: int | None = None):
        self.source = str(source)
        configs = config_files(self.source, (*CONFIG_FILES, "config.json"), VideoConfigError)
        config, self.config_file = _video_config(configs, self.source)
        named = config.get("video_processor_type") or _processor_class(configs)
        self.processor_type = named
        self.family = FAMILIES.get(named or "")
        if self.family is None:
            raise VideoConfigError(f"{self.source}: {named or 'no video processor named'}: lengthscan counts the "
                                   f"video tokens of {', '.join(sorted(n for n in FAMILIES if 'Video' in n))}")
        if self.family.startswith("glm"):
            from lengthscan.measure.video.glm import GlmVideo

            try:
                self.options = GlmVideo.from_config(self.family, config, fps=fps, num_frames=num_frames,
                                                    max_frames=max_frames)
            except VideoRefused as exc:
                raise VideoConfigError(f"{self.source}: {exc}") from None
        elif self.family == "gemma4":
            from lengthscan.measure.video.gemma4 import Gemma4Video

            self.options = Gemma4Video.from_config(config, fps=fps, num_frames=num_frames, max_frames=max_frames)
        elif self.family == "smolvlm":
            from lengthscan.measure.video.smolvlm import SmolVideo

            self.options = SmolVideo.from_config(config, configs.get("processor_config.json") or {}, fps=fps,
                                                 num_frames=num_frames, max_frames=max_frames)
        elif self.family.startswith("llava"):
            from lengthscan.measure.video.llava import LlavaVideo

            try:
                self.options = LlavaVideo.from_config(self.family, config, configs.get("processor_config.json") or {},
                                                      fps=fps, num_frames=num_frames)
            except VideoRefused as exc:
                raise VideoConfigError(f"{self.source}: {exc}") from None
        else:
            forced = FORCED_PIXELS.get(_processor_class(configs) or "")
            if forced is not None:  # the processor's own videos_kwargs win over the config's
                config = {**config, "size": {"shortest_edge": forced[0], "longest_edge": forced[1]},
                          "min_pixels": None, "max_pixels": None}
            self.options = VideoOptions.from_config(self.family, config, fps=fps, num_frames=num_frames,
                                                    max_frames=max_frames, max_pixels=max_pixels)
        self._cache: dict = {}
        self.bind(tokenizer)

    def bind(self, tokenizer) -> None:
        """The tokens the processor writes, as it reads them off ``tokenizer`` (its defaults without one)."""
        self.video_token = getattr(tokenizer, "video_token", None) or VIDEO_TOKENS[self.family]
        if self.family == "gemma4":  # its processor writes "<|video|>" whatever the tokenizer says
            self.video_token = VIDEO_TOKENS["gemma4"]
        self.start = getattr(tokenizer, "vision_start_token", None) or "<|vision_start|>"
        self.end = getattr(tokenizer, "vision_end_token", None) or "<|vision_end|>"
        defaults = {**SMOLVLM_TOKENS, "image_token": "<|image|>"} if self.family.startswith("glm") else SMOLVLM_TOKENS
        self.frame_tokens = {k: getattr(tokenizer, k, None) or v for k, v in defaults.items()}
        self.frame_tokens.update(video_token=self.video_token, boi_token=getattr(tokenizer, "boi_token", None),
                                 eoi_token=getattr(tokenizer, "eoi_token", None))

    def check(self, tokenizer) -> None:
        """Fail now (exit 2) where the tokenizer does not hold the video token the processor writes
        as one token: Gemma 4's processor adds ``<|video|>`` to its own tokenizer at load."""
        if self.family != "gemma4":
            return
        ids = tokenizer(self.video_token * 2, add_special_tokens=False)["input_ids"]
        if len(ids) != 2 or ids[0] != ids[1]:
            raise VideoConfigError(f"the tokenizer does not hold {self.video_token!r} as one token, which "
                                   f"{self.processor_type} writes once per video token (its processor adds it to "
                                   "its own tokenizer at load): give the processor's tokenizer, saved after loading")

    @property
    def wrapper(self) -> str | None:
        """What the processor collapses to its video token before expanding (Qwen3-VL), or None."""
        return self.start + self.video_token + self.end if self.family == "qwen3" else None

    @property
    def repeats(self) -> bool:
        """Whether the processor writes its video token repeated and nothing else (not Qwen3-VL's
        timestamps, nor SmolVLM2's frame lines)."""
        return self.family not in ("qwen3", "smolvlm", "gemma4", "glm4v", "glm46v")

    def count(self, info: VideoInfo) -> VideoCount:
        """The processor's count for one video (``VideoRefused`` where it would refuse it)."""
        key = (info.frames, info.fps, info.duration, info.width, info.height, info.rotation, info.container)
        hit = self._cache.get(key)
        if hit is None:
            if info.container == FRAMES and self.options.do_sample_frames:
                raise VideoRefused("the processor does not sample frames from a list of images (do_sample_frames is "
                                   "on): give a video file, or turn sampling off")
            if self.family in ("smolvlm", "gemma4", "glm4v", "glm46v"):
                hit = self._cache[key] = self.options.count(info, self.frame_tokens)
            elif self.family.startswith("llava"):
                hit = self._cache[key] = self.options.count(info)
            else:
                hit = self._cache[key] = count_video(info, self.options)
        return hit

    def replacement(self, count: VideoCount) -> str:
        return count.replacement(self.video_token, self.start, self.end)

    def to_dict(self) -> dict:
        o = self.options
        options = {"do_sample_frames": o.do_sample_frames, "fps": o.fps, "num_frames": o.num_frames}
        if self.family == "smolvlm":
            options.update(tokens_per_frame=o.image_seq_len, image_seq_len=o.image_seq_len, skip_secs=o.skip_secs)
        elif self.family == "gemma4":
            options.update(max_soft_tokens=o.max_soft_tokens, patch_size=o.patch_size,
                           pooling_kernel_size=o.pooling_kernel_size)
        elif self.family.startswith("llava"):
            options.update(tokens_per_frame=o.per_frame, tokens_per_video=o.extra)
        elif self.family.startswith("glm"):
            options.update(max_duration=o.max_duration, min_pixels=o.min_pixels, max_pixels=o.max_pixels,
                           patch_size=o.patch_size, temporal_patch_size=o.temporal_patch_size, merge_size=o.merge_size)
        else:
            options.update(min_frames=o.min_frames, max_frames=o.max_frames, min_pixels=o.min_pixels,
                           max_pixels=o.max_pixels, patch_size=o.patch_size, temporal_patch_size=o.temporal_patch_size,
                           merge_size=o.merge_size)
        return {"source": self.source, "video_processor": self.processor_type, "config_file": self.config_file,
                "video_token": self.video_token, "options": options}

    def signature(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _video_config(configs: dict, source: str) -> tuple[dict, str]:
    nested = (configs.get("processor_config.json") or {}).get("video_processor")
    if isinstance(nested, dict):
        return nested, "processor_config.json (video_processor)"
    for name in CONFIG_FILES[1:]:
        if name in configs:
            return configs[name], name
    raise VideoConfigError(f"{source}: no video_preprocessor_config.json or preprocessor_config.json (give the "
                           "model's processor directory or hub name with --processor)")


def _processor_class(configs: dict) -> str | None:
    for name in CONFIG_FILES:
        named = (configs.get(name) or {}).get("processor_class")
        if named:
            return named
    return None


__all__ = ["VideoConfigError", "VideoCounter", "VideoRefused"]
