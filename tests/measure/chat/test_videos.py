"""Videos in conversations (``--videos``, video parts): per row, the videos' tokens and the sequence
the processor makes: the rendering, each video placeholder replaced as the processor replaces it
(Qwen2.5-VL: the video token repeated; Qwen3-VL: timestamped temporal patches in place of the
template's wrapper), tokenized. Real clips of several containers (PyAV encodes them); the reference
reads each clip's metadata by demuxing and decoding it with PyAV, never from lengthscan's headers."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.measure.video.info import VideoInfo
from lengthscan.measure.video.qwen import VideoOptions, count_video
from tests.support.chat import write_jsonl
from tests.support.video import decoded, make_clip
from tests.support.vision import template_of, vision_dir

pytest.importorskip("av")

#: Qwen3-VL's released video_preprocessor_config.json values
QWEN3_VIDEO = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
               "merge_size": 2, "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
               "video_processor_type": "Qwen3VLVideoProcessor"}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return folder, [
        make_clip(folder / "a.mp4", rate=30, frames=45, size=(320, 240)),
        make_clip(folder / "b.webm", codec="libvpx-vp9", rate=24, frames=30, size=(160, 90)),
        make_clip(folder / "c.mov", codec="mpeg4", rate=25, frames=50, size=(176, 144), rotation=90),
        make_clip(folder / "d.avi", codec="mjpeg", rate=10, frames=12, size=(96, 64)),
        make_clip(folder / "e.mkv", rate=15, frames=33, size=(322, 182)),
    ]


def _rows(docs, names, n=14, seed=4):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        k = [0, 1, 1, 2][i % 4]
        videos = [rng.choice(names) for _ in range(k)]
        parts = [{"type": "video"} for _ in videos] + [{"type": "text", "text": docs[i][:200] or "What happens?"}]
        rows.append({"messages": [{"role": "user", "content": parts},
                                  {"role": "assistant", "content": [{"type": "text", "text": docs[i + 1][:150]
                                                                     or "A clip."}]}],
                     "videos": videos})
    return rows


def _metadata(path) -> VideoInfo:
    """The clip as torchcodec's exact scan describes it, here from PyAV's demuxing and decoding."""
    d = decoded(path)
    return VideoInfo(d["duration"], d["frames"], d["frames"] / d["duration"], d["width"], d["height"], d["rotation"])


def _expected(tok, template, row, folder, options, family):
    """(sequence tokens, video tokens) as the processor makes them."""
    text = tok.apply_chat_template(row["messages"], chat_template=template, tokenize=False)
    counts = [count_video(_metadata(folder / name), options) for name in row["videos"]]
    wrapper = "<|vision_start|><|video_pad|><|vision_end|>"
    if family == "qwen3_vl" and counts:
        text = text.replace(wrapper, "<|video_pad|>")
    pieces = text.split("<|video_pad|>")
    assert len(pieces) == len(counts) + 1
    out = pieces[0]
    for c, piece in zip(counts, pieces[1:]):
        out += c.replacement("<|video_pad|>", "<|vision_start|>", "<|vision_end|>") + piece
    return len(tok(out, add_special_tokens=False)["input_ids"]), sum(c.tokens for c in counts)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_rows_with_videos_equal_the_processors_input_ids(tmp_path, train_texts, docs, clips, family):
    from transformers import AutoTokenizer

    folder, paths = clips
    model = vision_dir(tmp_path / family, family, train_texts[:400])
    config = json.loads((model / "preprocessor_config.json").read_text())
    if family == "qwen3_vl":
        (model / "video_preprocessor_config.json").write_text(json.dumps(QWEN3_VIDEO))
        config = QWEN3_VIDEO
    rows = _rows(docs, [p.name for p in paths])
    src = write_jsonl(folder / f"{family}.jsonl", rows)
    template = template_of(family)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--videos", "videos", "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    tok = AutoTokenizer.from_pretrained(model)
    options = VideoOptions.from_config("qwen3" if family == "qwen3_vl" else "qwen2", config)
    rendered_with = template.read_text()
    with_videos = 0
    for i, row in enumerate(rows):
        seq, video_tokens = _expected(tok, rendered_with, row, folder, options, family)
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert table["video_tokens"][i] == video_tokens, (family, i)
        assert table["sequence_tokens"][i] == seq, (family, i)
        assert table["videos"][i] == len(row["videos"])
        assert table["video_seconds"][i] == pytest.approx(sum(_metadata(folder / n).duration for n in row["videos"]))
        assert table["prompt_tokens"][i] + table["completion_tokens"][i] == seq  # videos are on the prompt side
        with_videos += bool(row["videos"])
    assert with_videos >= 8
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["videos"]["video_processor"] == ("Qwen3VLVideoProcessor" if family == "qwen3_vl"
                                                           else "Qwen2_5_VLProcessor")
    vd = report["splits"][0]["chat"]["videos"]
    assert vd["video_tokens"] == sum(table["video_tokens"]) and vd["videos"] == sum(table["videos"])
    assert vd["video_frames"] == sum(table["video_frames"])
    assert vd["costliest"][0]["video_tokens"] == max(t for t in table["max_video_tokens"] if t is not None)
    html = (out / "report.html").read_text()
    assert "Videos</h3>" in html and f"{vd['video_tokens']:,}" in html


def test_bad_videos_are_reasons_naming_them(tmp_path, train_texts, clips, capsys):
    folder, paths = clips
    model = vision_dir(tmp_path / "qwen2_5_vl", "qwen2_5_vl", train_texts[:400])
    (folder / "cut.mp4").write_bytes(paths[0].read_bytes()[:2000])
    (folder / "noise.mp4").write_bytes(bytes(range(256)) * 20)
    user = [{"type": "video"}, {"type": "text", "text": "What is it?"}]
    rows = [{"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "A clip."}],
             "videos": [name]} for name in ("missing.mp4", "cut.mp4", "noise.mp4", paths[1].name)]
    rows.append({"messages": [{"role": "user", "content": user * 2}, {"role": "assistant", "content": "Two."}],
                 "videos": [paths[1].name]})
    src = write_jsonl(folder / "bad.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template_of("qwen2_5_vl")), "--messages", "messages", "--videos", "videos", "--full",
                 "--no-cache", "--out", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # the terminal's report: the video processor, the videos
    assert "videos Qwen2_5_VLProcessor from" in said and "every frame (do_sample_frames off)" in said
    assert "1 videos in 1 rows" in said
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    assert table["chat_flag"][:3] == ["missing_file", "unreadable", "unreadable"]
    assert "missing.mp4" in table["chat_error"][0] and "cut.mp4" in table["chat_error"][1]
    assert "noise.mp4" in table["chat_error"][2]
    assert table["chat_flag"][3] is None and table["video_tokens"][3] > 0
    assert table["chat_flag"][4] == "invalid_conversation" and "more video parts" in table["chat_error"][4]


def test_a_video_part_without_a_video_processor_is_unsupported(tmp_path, chat_tok_dir):
    rows = [{"messages": [{"role": "user", "content": [{"type": "video", "video": "a.mp4"},
                                                       {"type": "text", "text": "What is it?"}]},
                          {"role": "assistant", "content": "A clip."}]},
            {"messages": [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi."}]}]
    src = write_jsonl(tmp_path / "v.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", "qwen3",
                 "--messages", "messages", "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    assert table["chat_flag"] == ["unsupported_content", None] and "--processor" in table["chat_error"][0]


def test_clean_drops_rows_by_their_videos_and_refuses_to_cut_them(tmp_path, train_texts, docs, clips, capsys):
    import datasets

    folder, paths = clips
    model = vision_dir(tmp_path / "qwen2_5_vl", "qwen2_5_vl", train_texts[:400])
    rows = _rows(docs, [p.name for p in paths], n=12, seed=9)
    src = write_jsonl(folder / "clean.jsonl", rows)
    common = ["--tokenizer", str(model), "--processor", str(model), "--chat-template", str(template_of("qwen2_5_vl")),
              "--messages", "messages", "--videos", "videos", "--quiet", "--no-cache"]
    audit = tmp_path / "audit"
    assert main(["audit", str(src), *common, "--full", "--out", str(audit)]) == 0
    tokens = pq.read_table(audit / "lengths.parquet")["video_tokens"].to_pylist()
    cap = sorted(t for t in tokens if t)[len([t for t in tokens if t]) // 2]
    out = tmp_path / "clean"
    assert main(["clean", str(src), *common, "--limit", f"video_tokens<={cap}", "--out", str(out)]) == 0
    kept = datasets.load_from_disk(str(out / "dataset"))
    assert len(kept) == sum(t <= cap for t in tokens) and len(kept) < len(rows)
    for flag, message in ((["--action", "truncate", "--limit", "sequence_tokens<=64"], "dropped whole"),
                          (["--limit", "sequence_tokens<=100000", "--tokenize"], "--tokenize writes")):
        assert main(["clean", str(src), *common, *flag, "--out", str(tmp_path / "refused")]) == 2
        assert message in capsys.readouterr().err


def test_the_fps_the_report_proposes_makes_the_longest_rows_fit(tmp_path, train_texts, docs, clips):
    """A long clip over a sequence limit: the finding's --fps, audited again, brings every one of the
    longest rows under the limit (end to end, as the image cap is checked)."""
    from lengthscan.report.findings import findings

    folder, _ = clips
    long_clip = make_clip(folder / "long.mp4", rate=30, frames=300, size=(320, 240))
    model = vision_dir(tmp_path / "qwen2_5_vl", "qwen2_5_vl", train_texts[:400])
    user = [{"type": "video"}, {"type": "text", "text": "What happens?"}]
    rows = [{"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": docs[i][:80] or "A."}],
             "videos": [long_clip.name]} for i in range(3)]
    src = write_jsonl(folder / "long.jsonl", rows)
    common = ["--tokenizer", str(model), "--processor", str(model), "--chat-template", str(template_of("qwen2_5_vl")),
              "--messages", "messages", "--videos", "videos", "--full", "--quiet", "--no-cache",
              "--limit", "sequence_tokens<=4000"]
    assert main(["audit", str(src), *common, "--out", str(tmp_path / "a")]) == 0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert min(pq.read_table(tmp_path / "a" / "lengths.parquet")["sequence_tokens"].to_pylist()) > 4000
    said = [f for f in findings(report) if "--fps" in f]
    assert said, findings(report)
    fps = said[0].split("--fps ")[1].split(";")[0].split(")")[0]
    assert main(["audit", str(src), *common, "--fps", fps, "--out", str(tmp_path / "b")]) == 0
    seq = pq.read_table(tmp_path / "b" / "lengths.parquet")["sequence_tokens"].to_pylist()
    assert max(seq) <= 4000, (fps, seq)
    html = (tmp_path / "a" / "report.html").read_text()
    assert f"--fps {fps}" in html  # the finding, where the user reads it
