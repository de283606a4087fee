"""SmolVLM2 videos: per row, the sequence ``SmolVLMProcessor`` makes: its own video template, each
``<video>`` replaced by ``replace_video_token`` (run on the processor itself) with the metadata of
the frames ``SmolVLMVideoProcessor.sample_frames`` picks (compiled from the installed file: its
module imports torchvision), the clips' frame counts and spans from PyAV's demuxing and decoding."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import write_jsonl
from tests.support.video import decoded, make_clip
from tests.support.vision import reference_processor, vision_dir

pytest.importorskip("av")
pytest.importorskip("num2words")

#: SmolVLM2's released video sampling (its preprocessor_config.json's ``video_sampling``)
SAMPLING = {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 1536}}


def _sample_frames():
    """``SmolVLMVideoProcessor.sample_frames`` from the installed source."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / "smolvlm" / "video_processing_smolvlm.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SmolVLMVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames")
    namespace = {"np": np, "VideoMetadata": object, "__name__": "smolvlm_source"}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), str(path), "exec"), namespace)  # noqa: S102
    return namespace["sample_frames"]


@pytest.fixture(scope="module")
def model(tmp_path_factory, train_texts):
    folder = vision_dir(tmp_path_factory.mktemp("smolvlm2"), "smolvlm", train_texts[:400])
    config = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**config, "video_sampling": SAMPLING}))
    return folder


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smol-clips")
    return folder, [make_clip(folder / "short.mp4", rate=30, frames=45, size=(96, 64)),
                    make_clip(folder / "long.mp4", rate=5, frames=360, size=(64, 48)),   # 72 s: skips 1 s each end
                    make_clip(folder / "mid.webm", codec="libvpx-vp9", rate=10, frames=125, size=(64, 48)),
                    make_clip(folder / "odd.mkv", rate=24, frames=7, size=(50, 30))]


def _expected(processor, template: str, row: dict, folder: Path, num_frames: int, fps: float) -> list:
    from transformers.video_utils import VideoMetadata

    sample = _sample_frames()
    text = processor.tokenizer.apply_chat_template(row["messages"], chat_template=template, tokenize=False)
    for name in row["videos"]:
        d = decoded(folder / name)
        meta = VideoMetadata(total_num_frames=d["frames"], fps=d["frames"] / d["duration"], duration=d["duration"])
        holder = type("Holder", (), {"num_frames": num_frames, "fps": fps})()
        meta.frames_indices = list(sample(holder, meta, num_frames=num_frames, fps=fps))
        text = text.replace("<video>", processor.replace_video_token({"video_metadata": [meta]}, 0), 1)
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("extra,num_frames,fps", [([], 64, 1), pytest.param(["--num-frames", "8", "--fps", "2"], 8, 2,
                                                                            marks=pytest.mark.slow)])
def test_smolvlm2_rows_equal_the_processors_text(tmp_path, model, clips, docs, extra, num_frames, fps):
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    folder, paths = clips
    names = [p.name for p in paths]
    rows = []
    for i in range(8):
        videos = [names[(i + j) % len(names)] for j in range([0, 1, 1, 2][i % 4])]
        parts = [{"type": "video"} for _ in videos] + [{"type": "text", "text": docs[i][:120] or "What happens?"}]
        rows.append({"messages": [{"role": "user", "content": parts},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A gradient."}]}],
                     "videos": videos})
    template = tmp_path / "smolvlm_video.jinja"
    template.write_text(DEFAULT_CHAT_TEMPLATE)
    src = write_jsonl(folder / f"rows{len(extra)}.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--videos", "videos", "--full", "--quiet", "--no-cache",
                 "--out", str(out), *extra]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(model, "smolvlm")
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    for i, row in enumerate(rows):
        ids = _expected(processor, DEFAULT_CHAT_TEMPLATE, row, folder, num_frames, fps)
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["video_tokens"][i]) == (len(ids), ids.count(image)), (i, extra)
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["videos"]["options"]["image_seq_len"] == 64
    assert max(table["max_video_frames"][i] or 0 for i in range(len(rows))) == (64 if not extra else 8)
