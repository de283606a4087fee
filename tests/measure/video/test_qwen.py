"""Qwen2-VL/2.5-VL and Qwen3-VL video counts (``measure/video/qwen.py``) against the processors'
own code, over many videos and options:

* Qwen3-VL: ``Qwen3VLVideoProcessor`` itself (it builds without torchvision): ``sample_frames``
  on the metadata, ``get_num_of_video_patches``, and ``Qwen3VLProcessor.replace_video_token``'s
  text with its ``_calculate_timestamps``;
* Qwen2-VL: its video processor module imports torchvision, which is not installed, so its own
  ``sample_frames`` and ``smart_resize`` are read from the installed source file and run as they
  are (``torch.arange``'s float step included) on the same metadata.
"""

from __future__ import annotations

import ast
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.qwen import DEFAULTS, VideoOptions, VideoRefused, count_video

torch = pytest.importorskip("torch")


def _videos(seed: int, n: int) -> list[VideoInfo]:
    rng = random.Random(seed)
    rates = [24, 25, 30, 30000 / 1001, 60, 12.5, 7.3]
    sizes = [(1280, 720), (1920, 1080), (720, 1280), (322, 182), (640, 360), (100, 50), (3840, 2160), (17, 900)]
    out = []
    for _ in range(n):
        fps = rng.choice(rates)
        frames = rng.choice([rng.randint(1, 40), rng.randint(40, 3000)])
        width, height = rng.choice(sizes)
        out.append(VideoInfo(frames / fps, frames, fps, width, height, rng.choice([0, 0, 90, 180, 270])))
    return out


# -- Qwen3-VL: the processor itself ---------------------------------------------------------------

QWEN3_CONFIGS = [
    {},  # the class defaults
    {"size": {"longest_edge": 25165824, "shortest_edge": 4096}},  # the released Qwen3-VL video config
    {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 1, "max_frames": 64},
    {"size": {"longest_edge": 2_000_000, "shortest_edge": 4096}, "cap_pixels_per_frame": True},
]


@pytest.mark.parametrize("config", QWEN3_CONFIGS, ids=["defaults", "released", "fps1-max64", "capped"])
def test_qwen3_equals_its_processor(config):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    proc = Qwen3VLVideoProcessor(**config)
    options = VideoOptions.from_config("qwen3", config)
    checked = 0
    for info in _videos(3, 300):
        height, width = (info.width, info.height) if info.rotation in (90, 270) else (info.height, info.width)
        metadata = VideoMetadata(total_num_frames=info.frames, fps=info.fps, width=width, height=height)
        try:
            indices = proc.sample_frames(metadata)
            patches = proc.get_num_of_video_patches(len(indices), height, width)
        except ValueError:
            with pytest.raises(VideoRefused):
                count_video(info, options)
            continue
        got = count_video(info, options)
        assert got.frames == len(indices)
        assert got.grid[0] * got.grid[1] * got.grid[2] == patches
        assert got.tokens == patches // proc.merge_size ** 2
        video_inputs = {"video_grid_thw": torch.tensor([list(got.grid)]),
                        "video_metadata": [VideoMetadata(total_num_frames=info.frames, fps=info.fps,
                                                         frames_indices=list(indices))]}
        host = SimpleNamespace(video_processor=proc, vision_start_token="<|vision_start|>",
                               vision_end_token="<|vision_end|>", video_token="<|video_pad|>")
        host._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(host, *a)
        theirs = Qwen3VLProcessor.replace_video_token(host, video_inputs, 0)
        assert got.replacement("<|video_pad|>", "<|vision_start|>", "<|vision_end|>") == theirs
        checked += 1
    assert checked > 200


def test_qwen3_num_frames_replaces_the_default_fps():
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    proc = Qwen3VLVideoProcessor()
    info = VideoInfo(10.0, 300, 30.0, 640, 360)
    ours = count_video(info, VideoOptions.from_config("qwen3", {}, num_frames=16))
    assert ours.frames == len(proc.sample_frames(VideoMetadata(total_num_frames=300, fps=30.0), num_frames=16,
                                                 fps=None)) == 16
    assert ours.bound == "num_frames"


# -- Qwen2-VL: its own functions, read from the installed source ----------------------------------

def _qwen2_source() -> dict:
    """``smart_resize`` and ``Qwen2VLVideoProcessor.sample_frames`` / ``resize``'s pixel budget,
    compiled from the installed file (its module imports torchvision, which is not installed)."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / "qwen2_vl" / "video_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    wanted = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "smart_resize":
            wanted.append(node)
        if isinstance(node, ast.ClassDef) and node.name == "Qwen2VLVideoProcessor":
            wanted += [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames"]
    assert len(wanted) == 2
    namespace = {"math": math, "torch": torch, "VideoMetadata": object, "__name__": "qwen2_source"}
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), str(path), "exec"), namespace)  # noqa: S102 - the installed source
    return namespace


QWEN2_CONFIGS = [
    ({}, {}),
    ({"min_pixels": 3136, "max_pixels": 12845056}, {}),  # Qwen2.5-VL's preprocessor_config.json
    ({"min_pixels": 3136, "max_pixels": 12845056}, {"fps": 2}),
    ({}, {"num_frames": 15}),
    ({"max_frames": 32}, {"fps": 4}),
]


@pytest.mark.parametrize("config,call", QWEN2_CONFIGS, ids=["defaults", "qwen2.5", "fps2", "num15", "max32-fps4"])
def test_qwen2_equals_its_processor(config, call):
    source = _qwen2_source()
    options = VideoOptions.from_config("qwen2", config, **call)
    proc = SimpleNamespace(**{k: getattr(options, k) for k in ("temporal_patch_size", "min_frames", "max_frames",
                                                                "num_frames", "fps")})
    proc.num_frames, proc.fps = DEFAULTS["qwen2"]["num_frames"], DEFAULTS["qwen2"]["fps"]
    checked = 0
    for info in _videos(5, 300):
        height, width = (info.width, info.height) if info.rotation in (90, 270) else (info.height, info.width)
        try:
            if options.do_sample_frames:
                indices = source["sample_frames"](proc, SimpleNamespace(total_num_frames=info.frames, fps=info.fps),
                                                  **{k: getattr(options, k) for k in ("num_frames", "fps")})
                kept = len(indices)
            else:
                kept = info.frames
            factor = options.patch_size * options.merge_size
            h, w = source["smart_resize"](height, width, factor, options.min_pixels, options.max_pixels)
        except (ValueError, ZeroDivisionError):
            with pytest.raises(VideoRefused):
                count_video(info, options)
            continue
        got = count_video(info, options)
        t = options.temporal_patch_size
        grid = ((kept + -kept % t) // t, h // options.patch_size, w // options.patch_size)
        assert (got.frames, got.grid, got.height, got.width) == (kept, grid, h, w), info
        assert got.tokens == grid[0] * grid[1] * grid[2] // 4
        assert got.replacement("<|video_pad|>", "<|vision_start|>", "<|vision_end|>") == "<|video_pad|>" * got.tokens
        checked += 1
    assert checked > 150


def test_the_float_step_keeps_one_frame_more():
    """17 frames sampled to 14 keep 15 (``torch.arange(0, 17, 17 / 14)``): 8 temporal patches, not 7."""
    info = VideoInfo(17 / 30, 17, 30.0, 640, 360)
    got = count_video(info, VideoOptions.from_config("qwen2", {}, num_frames=14))
    assert got.frames == len(torch.arange(0, 17, 17 / 14)) == 15
    assert got.grid[0] == 8


@pytest.mark.parametrize("processor_class,patch,pixels", [
    ("Qwen2_5OmniProcessor", 14, (128 * 28 * 28, 768 * 28 * 28)),
    ("Qwen3OmniMoeProcessor", 16, (128 * 32 * 32, 768 * 32 * 32))])
def test_the_omni_processors_bound_frames_by_their_own_sizes(tmp_path, processor_class, patch, pixels):
    """The Omni processors pass their video processor per-frame bounds at every call (``videos_kwargs``),
    which win over the checkpoint's min/max_pixels: counted as they say."""
    import json

    from transformers import Qwen2_5OmniProcessor, Qwen3OmniMoeProcessor

    from lengthscan.measure.video.counter import VideoCounter

    theirs = {"Qwen2_5OmniProcessor": Qwen2_5OmniProcessor, "Qwen3OmniMoeProcessor": Qwen3OmniMoeProcessor}
    size = theirs[processor_class].videos_kwargs["size"]
    assert (size["shortest_edge"], size["longest_edge"]) == pixels
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2,
         "processor_class": processor_class}))
    counter = VideoCounter(str(tmp_path))
    o = counter.options
    assert (counter.family, o.patch_size, o.min_pixels, o.max_pixels) == ("qwen2", patch, *pixels)
    got = counter.count(VideoInfo(2.0, 60, 30.0, 1280, 720))
    source = _qwen2_source()
    h, w = source["smart_resize"](720, 1280, patch * 2, *pixels)
    assert (got.height, got.width, got.tokens) == (h, w, 30 * (h // patch) * (w // patch) // 4)
