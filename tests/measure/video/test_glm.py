"""GLM-4.1V and GLM-4.6V videos: per row, the sequence the processor makes: each ``<|video|>``
replaced by ``replace_video_token`` (run on the processor itself) with the frames its video
processor's own ``sample_frames`` picks and the grid its module's ``smart_resize`` gives, from the
clips' frame counts, spans and sizes as PyAV's demuxing and decoding find them. The video modules
are compiled from the installed files (GLM-4.6V's imports torchvision, which is only named in
annotations)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import write_jsonl
from tests.support.video import decoded, make_clip
from tests.support.vision import reference_processor, template_of, vision_dir

pytest.importorskip("av")

MODULES = {"glm4v": ("glm4v", "Glm4vVideoProcessor"), "glm46v": ("glm46v", "Glm46VVideoProcessor")}


def _video_module(family: str):
    """The family's video processing module, compiled from the installed file without its
    torchvision import."""
    import transformers

    folder, _ = MODULES[family]
    path = Path(transformers.__file__).parent / "models" / folder / f"video_processing_{folder}.py"
    name = f"transformers.models.{folder}.video_processing_source"
    if name not in sys.modules:
        source = path.read_text().replace("from torchvision.transforms.v2 import functional as tvF", "tvF = None")
        module = types.ModuleType(name)
        module.__package__, module.__file__ = f"transformers.models.{folder}", str(path)
        sys.modules[name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the installed source
    return sys.modules[name]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm-clips")
    return folder, [make_clip(folder / "a.mp4", rate=30, frames=45, size=(320, 240)),
                    make_clip(folder / "b.webm", codec="libvpx-vp9", rate=24, frames=100, size=(96, 400)),
                    make_clip(folder / "c.mov", codec="mpeg4", rate=25, frames=80, size=(176, 144), rotation=90),
                    make_clip(folder / "tiny.mkv", rate=30, frames=5, size=(20, 300)),     # 1 frame, doubled
                    make_clip(folder / "mid.mp4", rate=2, frames=90, size=(64, 48)),        # 45 s
                    make_clip(folder / "long.mp4", rate=1, frames=320, size=(56, 56))]      # over 300 s


def _expected(processor, module, text: str, names: list, folder: Path) -> list:
    import torch
    from transformers.video_utils import VideoMetadata

    video = getattr(module, MODULES[processor.test_family][1])
    sampler = video.__new__(video)  # the class's own sampling options (fps 2, max_duration 300)
    processor.video_processor = sampler
    for name in names:
        d = decoded(folder / name)
        width, height = (d["height"], d["width"]) if d["rotation"] in (90, 270) else (d["width"], d["height"])
        meta = VideoMetadata(total_num_frames=d["frames"], fps=d["frames"] / d["duration"], duration=d["duration"])
        meta.frames_indices = list(sampler.sample_frames(meta, fps=sampler.fps))
        frames = len(meta.frames_indices)
        h, w = module.smart_resize(frames, height, width, temporal_factor=2, factor=28,
                                   min_pixels=112 * 112, max_pixels=28 * 28 * 2 * 30000)
        grid = torch.tensor([[(frames + frames % 2) // 2, h // 14, w // 14]])
        replacement = processor.replace_video_token({"video_grid_thw": grid, "video_metadata": [meta]}, 0)
        text = text.replace(processor.video_token, replacement, 1)
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", ["glm4v", "glm46v"])
def test_glm_rows_equal_the_processors_text(tmp_path, train_texts, docs, clips, family):
    folder, paths = clips
    model = vision_dir(tmp_path / family, family, train_texts[:400])
    processor_class = "Glm4vVideoProcessor" if family == "glm4v" else "Glm46VVideoProcessor"
    (model / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": processor_class, "fps": 2, "max_duration": 300, "do_sample_frames": True,
        "size": {"shortest_edge": 12544, "longest_edge": 47040000}, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2}))
    template = tmp_path / "glm-video.jinja"
    template.write_text(template_of(family).read_text().replace(
        "{% elif p.type == 'text' %}",
        "{% elif p.type == 'video' %}<|begin_of_video|><|video|><|end_of_video|>{% elif p.type == 'text' %}"))
    names = [p.name for p in paths]
    picks = [[names[0]], [names[1], names[2]], [], [names[3]], [names[4]], [names[5], names[0]]]
    rows = [{"messages": [{"role": "user", "content": [*({"type": "video"} for _ in vids),
                                                       {"type": "text", "text": docs[i][:100] or "What?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "Moving colours."}]}],
             "videos": vids} for i, vids in enumerate(picks)]
    src = write_jsonl(folder / f"rows-{family}.jsonl", rows)  # the videos' names are relative to the source
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--videos", "videos", "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(model, family)
    module = _video_module(family)
    from transformers.processing_utils import ProcessorMixin

    refused = []
    for i, row in enumerate(rows):
        text = ProcessorMixin.apply_chat_template(processor, row["messages"], chat_template=template.read_text(),
                                                  tokenize=False)
        try:
            ids = _expected(processor, module, text, row["videos"], folder)
        except ValueError as exc:  # GLM-4.6V keeps no frame of a clip under a sixth of a second
            assert table["sequence_tokens"][i] is None and "refuses it" in table["chat_error"][i], (exc, i)
            refused.append(i)
            continue
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["video_tokens"][i]) == \
            (len(ids), ids.count(processor.image_token_id)), (family, i)
    assert refused == ([] if family == "glm4v" else [3])
    assert json.loads((out / "report.json").read_text())["chat"]["videos"]["video_processor"] == processor_class


def test_options_the_processor_does_not_read_exit_2(tmp_path, train_texts, clips, capsys):
    """GLM-4V samples by the video's duration: a frame count (and GLM-4.6V an fps) would be read by
    nothing, so it is said, not silently dropped."""
    folder, paths = clips
    model = vision_dir(tmp_path / "glm46v", "glm46v", train_texts[:300])
    (model / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type": "Glm46VVideoProcessor"}))
    src = write_jsonl(tmp_path / "one.jsonl", [{"messages": [{"role": "user", "content": [{"type": "video"}]}],
                                                "videos": [str(paths[0])]}])
    base = ["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--messages", "messages",
            "--videos", "videos", "--quiet", "--no-cache", "--out", str(tmp_path / "o")]
    assert main([*base, "--num-frames", "8"]) == 2
    assert "--num-frames and --max-frames do not apply" in capsys.readouterr().err
    assert main([*base, "--fps", "1"]) == 2
    assert "--fps does not apply" in capsys.readouterr().err
