"""Gemma 4 videos: per row, the sequence ``Gemma4Processor`` makes: each video placeholder replaced
by ``replace_video_token`` (run on the processor itself) with the frames transformers'
``default_sample_indices_fn`` samples (the processor's ``num_frames``, 32) and each frame's soft
tokens from the processor module's own resize rule, on the clips' frame counts, spans and sizes as
PyAV's demuxing and decoding find them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import write_jsonl
from tests.support.video import decoded, make_clip
from tests.support.vision import reference_processor, template_of, vision_dir

pytest.importorskip("av")


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-clips")
    return folder, [make_clip(folder / "a.mp4", rate=30, frames=45, size=(320, 240)),
                    make_clip(folder / "b.webm", codec="libvpx-vp9", rate=24, frames=100, size=(96, 400)),
                    make_clip(folder / "c.mov", codec="mpeg4", rate=25, frames=80, size=(176, 144), rotation=90),
                    make_clip(folder / "short.mkv", rate=15, frames=20, size=(64, 48))]  # under 32 frames: refused


def _expected(processor, text: str, names: list, folder) -> list:
    from transformers.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    for name in names:
        d = decoded(folder / name)
        width, height = (d["height"], d["width"]) if d["rotation"] in (90, 270) else (d["width"], d["height"])
        meta = VideoMetadata(total_num_frames=d["frames"], fps=d["frames"] / d["duration"], duration=d["duration"])
        meta.frames_indices = list(default_sample_indices_fn(meta, num_frames=32))
        h, w = get_aspect_ratio_preserving_size(height=height, width=width, patch_size=16, max_patches=70 * 9,
                                                pooling_kernel_size=3)
        soft = (h // 16) * (w // 16) // 9
        replacement = processor.replace_video_token({"num_soft_tokens_per_video": [soft], "video_metadata": [meta]}, 0)
        text = text.replace(processor.video_token, replacement, 1)
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_gemma4_rows_equal_the_processors_text(tmp_path, train_texts, docs, clips):
    folder, paths = clips
    model = vision_dir(tmp_path / "gemma4", "gemma4", train_texts[:400])
    (model / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "Gemma4VideoProcessor", "num_frames": 32, "do_sample_frames": True,
        "patch_size": 16, "max_soft_tokens": 70, "pooling_kernel_size": 3}))
    template = tmp_path / "gemma4-video.jinja"
    template.write_text(template_of("gemma4").read_text().replace("{% elif p.type == 'text' %}",
                                                                  "{% elif p.type == 'video' %}<|video|>"
                                                                  "{% elif p.type == 'text' %}"))
    names = [p.name for p in paths]
    rows = [{"messages": [{"role": "user", "content": [*({"type": "video"} for _ in vids),
                                                       {"type": "text", "text": docs[i][:100] or "What?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "Moving colours."}]}],
             "videos": vids} for i, vids in enumerate([[names[0]], [names[1], names[2]], [], [names[2]], [names[3]]])]
    src = write_jsonl(folder / "rows.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--videos", "videos", "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(model, "gemma4")
    from transformers.processing_utils import ProcessorMixin

    for i, row in enumerate(rows[:4]):
        text = ProcessorMixin.apply_chat_template(processor, row["messages"], chat_template=template.read_text(),
                                                  tokenize=False)
        ids = _expected(processor, text, row["videos"], folder)
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["video_tokens"][i]) == \
            (len(ids), ids.count(processor.video_token_id)), i
    assert table["sequence_tokens"][4] is None and "32 frames asked of a video of 20" in table["chat_error"][4]
    assert json.loads((out / "report.json").read_text())["chat"]["videos"]["video_processor"] == "Gemma4VideoProcessor"


def test_a_tokenizer_without_the_video_token_exits_2(tmp_path, train_texts, clips, capsys):
    """Gemma 4's processor adds ``<|video|>`` to its own tokenizer at load; a tokenizer that does not
    hold it as one token would count every video token as several: said before any row is read."""
    folder, paths = clips
    model = vision_dir(tmp_path / "no-video", "gemma3", train_texts[:300])
    (model / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type": "Gemma4VideoProcessor"}))
    src = write_jsonl(folder / "one.jsonl", [{"messages": [{"role": "user", "content": [{"type": "video"}]}],
                                              "videos": [paths[0].name]}])
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template_of("gemma3")), "--messages", "messages", "--videos", "videos", "--quiet", "--no-cache",
                 "--out", str(tmp_path / "o")]) == 2
    assert "does not hold '<|video|>' as one token" in capsys.readouterr().err
