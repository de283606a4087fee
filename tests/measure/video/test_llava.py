"""LLaVA-NeXT-Video and LLaVA-OneVision video counts (``measure/video/llava.py``) against their
processors' own code: transformers' ``default_sample_indices_fn`` for the frames kept, and the
processors' ``replace_video_token`` (NeXT-Video: on arrays of the processed frames' shape) and
``_get_num_multimodal_tokens`` (OneVision) for the tokens."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.llava import LlavaVideo
from lengthscan.measure.video.qwen import VideoRefused


def _videos(n: int, seed: int) -> list[VideoInfo]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fps = rng.choice([24, 25, 30, 30000 / 1001, 60, 7.5])
        frames = rng.randint(1, 900)
        out.append(VideoInfo(frames / fps, frames, fps, rng.choice([320, 1280, 99]), rng.choice([240, 720, 77])))
    return out


def _kept(info: VideoInfo, sample: bool, call: dict) -> int:
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    if not sample:
        return info.frames
    return len(default_sample_indices_fn(VideoMetadata(total_num_frames=info.frames, fps=info.fps), **call))


def _kept_or_refused(options: LlavaVideo, infos: list, call: dict):
    """Each video the processor keeps frames of, with their number; the ones it refuses (asked for
    more frames than it has) must be refused by ``options`` too."""
    for info in infos:
        try:
            kept = _kept(info, bool(call), call)
        except ValueError:
            with pytest.raises(VideoRefused):
                options.count(info)
            continue
        yield info, kept


@pytest.mark.parametrize("call", [{}, {"fps": 1}, {"num_frames": 8}, {"fps": 0.5}])
@pytest.mark.parametrize("crop,patch", [(224, 14), (336, 14), (336, 16)])
def test_llava_next_video_equals_its_processor(call, crop, patch):
    from transformers.models.llava_next_video.processing_llava_next_video import LlavaNextVideoProcessor

    options = LlavaVideo.from_config("llava_next_video", {"crop_size": {"height": crop, "width": crop}},
                                     {"patch_size": patch}, **call)
    host = SimpleNamespace(patch_size=patch, video_token="<video>")
    for info, kept in _kept_or_refused(options, _videos(60, crop + patch), call):
        frames = np.zeros((kept, 3, crop, crop), np.float32)  # the processed frames' shape: center-cropped
        theirs = LlavaNextVideoProcessor.replace_video_token(host, {"pixel_values_videos": [frames]}, 0)
        got = options.count(info)
        assert got.frames == kept and got.tokens == theirs.count("<video>"), info


@pytest.mark.parametrize("call", [{}, {"fps": 2}, {"num_frames": 32}])
@pytest.mark.parametrize("image_tokens", [729, 576, 196])
def test_llava_onevision_equals_its_processor(call, image_tokens):
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    options = LlavaVideo.from_config("llava_onevision", {}, {"num_image_tokens": image_tokens}, **call)
    host = SimpleNamespace(num_image_tokens=image_tokens, video_token="<video>")
    for info, kept in _kept_or_refused(options, _videos(60, image_tokens), call):
        theirs = LlavaOnevisionProcessor.replace_video_token(host, {"pixel_values_videos": [[0] * kept]}, 0)
        got = options.count(info)
        assert got.frames == kept and got.tokens == theirs.count("<video>"), info


def test_the_counter_reads_the_family_and_its_options_from_the_folder(tmp_path):
    import json

    from lengthscan.measure.video.counter import VideoCounter

    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "LlavaOnevisionVideoProcessor", "size": {"height": 384, "width": 384}}))
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": 729}))
    counter = VideoCounter(str(tmp_path), fps=1)
    info = VideoInfo(10.0, 300, 30.0, 640, 360)
    got = counter.count(info)
    assert (counter.family, counter.video_token, got.frames, got.tokens) == ("llava_onevision", "<video>", 10,
                                                                              10 * 196 + 1)
    assert counter.to_dict()["options"]["tokens_per_frame"] == 196
