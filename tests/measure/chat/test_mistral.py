"""Conversations encoded by mistral-common (Voxtral's processor encodes with it): per row, the
tokens ``MistralTokenizer.encode_chat_completion`` gives with the clips themselves (decoded here,
base64, as a user's script passes them), the ``[AUDIO]`` tokens among them, and the trained tokens
as mistral-common's own ``encode_assistant_message`` writes each assistant turn (its EOS included).

The tokenizer is mistral-common's shipped tekken vocabulary (its wheel's ``tekken_240911.json``)
with Voxtral's special tokens and audio config (16 kHz, 12.5 tokens a second, 30-second chunks),
as Voxtral's ``tekken.json`` holds them; the clips are written by soundfile at several rates, one
just past a chunk by the ceiling but not by soxr's rounding."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import write_jsonl

pytest.importorskip("mistral_common")
pytest.importorskip("soxr")

#: Voxtral's control tokens below 36 (the rest are fillers, as tekken writes them)
CONTROL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
           "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
AUDIO = {"sampling_rate": 16000, "frame_rate": 12.5, "chunk_length_s": 30.0,
         "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400}}


def voxtral_dir(out: Path) -> Path:
    import mistral_common

    data = json.loads((Path(mistral_common.__file__).parent / "data" / "tekken_240911.json").read_text())
    names = CONTROL + [f"<SPECIAL_{i}>" for i in range(20, 24)] + ["[AUDIO]", "[BEGIN_AUDIO]"] + [
        f"<SPECIAL_{i}>" for i in range(26, 34)] + ["[TRANSCRIBE]"]
    data["config"]["version"] = "v7"
    data["special_tokens"] = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(names)]
    data["audio"] = AUDIO
    out.mkdir(parents=True, exist_ok=True)
    (out / "tekken.json").write_text(json.dumps(data))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "VoxtralProcessor",
        "feature_size": 128, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30, "n_fft": 400}))
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return voxtral_dir(tmp_path_factory.mktemp("voxtral"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    import soundfile as sf

    folder = tmp_path_factory.mktemp("voxtral-clips")
    made = {"a.wav": (16000, 16000 * 5), "b.flac": (44100, 44100 * 31), "c.wav": (22050, int(22050 * 65.3)),
            "d.ogg": (48000, 48000 * 30), "edge.wav": (44100, 1_323_001)}  # 480,000.36 samples at 16 kHz: 1 chunk
    for name, (rate, frames) in made.items():
        sf.write(folder / name, (np.sin(np.arange(frames) / 7) * 0.2).astype(np.float32), rate)
    return folder


def _clip(path: Path) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(path.read_bytes()).decode(),
                                                   "format": path.suffix[1:]}}


def _reference(model: Path, folder: Path, row: dict) -> tuple[int, int, int]:
    """(tokens, [AUDIO] tokens, trained tokens) as mistral-common encodes the row with its clips."""
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(model / "tekken.json"), mode=ValidationMode.finetuning)
    clips = iter(row.get("audios") or ())
    messages = []
    for m in row["messages"]:
        content = m["content"]
        if isinstance(content, list):
            content = [_clip(folder / next(clips)) if p["type"] == "audio" else p for p in content]
        messages.append({**m, "content": content})
    tokens = tokenizer.encode_chat_completion(ChatCompletionRequest.from_openai(messages)).tokens
    inst = tokenizer.instruct_tokenizer
    trained = sum(len(inst.encode_assistant_message(AssistantMessage(content=m["content"]), False))  # with its EOS
                  for m in row["messages"] if m["role"] == "assistant")
    return len(tokens), tokens.count(inst.tokenizer.get_special_token("[AUDIO]")), trained


@pytest.mark.slow  # about 10 s
def test_voxtral_rows_equal_mistral_commons_encoding(tmp_path, model, clips):
    rows = [
        {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is said?"}]},
                      {"role": "assistant", "content": "A tone, five seconds long."}], "audios": ["a.wav"]},
        {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "audio"},
                                                   {"type": "text", "text": "Compare them."}]},
                      {"role": "assistant", "content": "The second is longer."},
                      {"role": "user", "content": [{"type": "text", "text": "And this one?"}, {"type": "audio"}]},
                      {"role": "assistant", "content": "Exactly thirty seconds."}],
         "audios": ["b.flac", "c.wav", "d.ogg"]},
        {"messages": [{"role": "user", "content": [{"type": "audio"}]},
                      {"role": "assistant", "content": "Just past a chunk by the ceiling, not by the rounding."}],
         "audios": ["edge.wav"]},
        {"messages": [{"role": "user", "content": "No audio here."}, {"role": "assistant", "content": "Fine."}],
         "audios": []},
    ]
    src = write_jsonl(clips / "rows.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--messages", "messages",
                 "--audios", "audios", "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows):
        tokens, audio, trained = _reference(model, clips, row)
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["audio_tokens"][i], table["completion_tokens"][i]) == \
            (tokens, audio, trained), i
        assert table["prompt_tokens"][i] == tokens - trained
        assert table["ends_with_eot"][i] and not table["audio_truncated"][i]
    assert table["audio_tokens"][2] == 375  # one chunk: soxr rounds 480,000.36 samples down
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["template"]["origin"].startswith("mistral-common tekken.json")
    assert report["chat"]["audios"]["tokens_per_chunk"] == 375


@pytest.mark.slow  # about 10 s
def test_text_conversations_with_a_tekken_tokenizer_and_no_template(tmp_path, model):
    """A tokenizer that is mistral-common's own file, without a chat template: its conversations
    are encoded by mistral-common (system prompt, several turns), not refused."""
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
                          {"role": "assistant", "content": "Goodbye, then."}]},
            {"messages": [{"role": "user", "content": "Only a question"}]}]
    src = write_jsonl(tmp_path / "text.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--messages", "messages", "--full", "--quiet",
                 "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    tokens, _, trained = _reference(model, tmp_path, rows[0])
    assert (table["sequence_tokens"][0], table["completion_tokens"][0]) == (tokens, trained)
    assert table["sequence_tokens"][1] is None and "mistral-common refuses" in table["chat_error"][1]
    assert main(["clean", str(src), "--tokenizer", str(model), "--messages", "messages", "--tokenize", "--quiet",
                 "--no-cache", "--out", str(tmp_path / "clean")]) == 0
    from datasets import load_from_disk
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    kept = load_from_disk(str(tmp_path / "clean" / "dataset"))
    ids = MistralTokenizer.from_file(str(model / "tekken.json"), mode=ValidationMode.finetuning).encode_chat_completion(
        ChatCompletionRequest.from_openai(rows[0]["messages"])).tokens
    assert len(kept) == 1 and kept[0]["input_ids"] == ids
    assert sum(1 for t in kept[0]["labels"] if t != -100) == trained and kept[0]["labels"][-1] == ids[-1]


@pytest.mark.slow  # about 10 s
def test_a_refused_prefix_keeps_the_row_and_unmeasured_metrics_are_refused(tmp_path, model, capsys):
    """With --train-on last, [user, assistant, assistant]'s prompt [user, assistant] is refused by
    mistral-common: the row keeps its length, without a completion count, and says why."""
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                          {"role": "assistant", "content": "Anything else?"}]}]
    src = write_jsonl(tmp_path / "last.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--messages", "messages", "--train-on", "last",
                 "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    tokens, _, _ = _reference(model, tmp_path, rows[0])
    assert table["sequence_tokens"] == [tokens] and table["completion_tokens"] == [None]
    assert "no completion count" in table["chat_error"][0]
    assert main(["clean", str(src), "--tokenizer", str(model), "--messages", "messages", "--limit",
                 "longest_message_tokens<=100", "--quiet", "--out", str(tmp_path / "c")]) == 2
    assert "not measured for conversations mistral-common encodes" in capsys.readouterr().err


def test_a_chat_template_with_voxtral_exits_2(tmp_path, model, clips, capsys):
    src = write_jsonl(tmp_path / "one.jsonl", [{"messages": [{"role": "user", "content": [{"type": "audio"}]}],
                                                "audios": [str(clips / "a.wav")]}])
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--messages", "messages",
                 "--audios", "audios", "--chat-template", str(template), "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "encodes conversations with mistral-common" in capsys.readouterr().err
