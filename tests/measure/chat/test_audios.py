"""Audio in conversations (``--audios``, audio parts): per row, the clips' tokens and the sequence
Qwen2-Audio's own processor makes of the rendering and the decoded clips (soundfile and soxr, as
transformers' ``load_audio`` reads them), from clips of several rates, channel counts and formats,
one longer than the 30 seconds the processor keeps; the other families' counts against their own
functions and the Whisper feature extractor's mask."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.measure.audio.parts import AudioPartsCounter
from tests.support.chat import chat_bpe, write_jsonl

sf = pytest.importorskip("soundfile")

QWEN2_AUDIO = {"feature_extractor_type": "WhisperFeatureExtractor", "chunk_length": 30, "feature_size": 128,
               "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
               "padding_value": 0.0, "processor_class": "Qwen2AudioProcessor", "return_attention_mask": True,
               "sampling_rate": 16000}
TOKENS = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]


@pytest.fixture(scope="module")
def model(tmp_path_factory, train_texts):
    from tokenizers import AddedToken
    from transformers import Qwen2AudioProcessor

    out = tmp_path_factory.mktemp("qwen2_audio")
    tok = chat_bpe(train_texts[:400], 2000)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in TOKENS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    (out / "preprocessor_config.json").write_text(json.dumps(QWEN2_AUDIO))
    (out / "chat_template.jinja").write_text(Qwen2AudioProcessor.default_chat_template.fget(None))
    return out


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(0)
    made = []
    for name, rate, seconds, channels in (("a.wav", 16000, 2.0, 1), ("b.wav", 22050, 5.3, 2), ("c.flac", 44100, 1.3, 1),
                                          ("long.wav", 8000, 40.2, 1), ("e.flac", 48000, 3.7, 2)):
        frames = int(rate * seconds) + 7  # not a whole number of samples at 16 kHz
        data = (rng.standard_normal((frames, channels)) * 0.1).astype(np.float32)
        sf.write(folder / name, data, rate)
        made.append(folder / name)
    return folder, made


def test_rows_with_audio_equal_the_processors_input_ids(tmp_path, model, clips, docs):
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor
    from transformers.audio_utils import load_audio

    folder, paths = clips
    names = [p.name for p in paths]
    rows = []
    for i in range(12):
        k = [0, 1, 1, 2][i % 4]
        chosen = [names[(i + j) % len(names)] for j in range(k)]
        parts = [{"type": "audio"} for _ in chosen] + [{"type": "text", "text": docs[i][:120] or "Listen."}]
        rows.append({"messages": [{"role": "user", "content": parts},
                                  {"role": "assistant", "content": docs[i + 2][:100] or "Noise."}], "audios": chosen})
    src = write_jsonl(folder / "chat.jsonl", rows)
    template = model / "chat_template.jinja"
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--audios", "audios", "--train-on", "all", "--full",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    tok = AutoTokenizer.from_pretrained(model)
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(**QWEN2_AUDIO), tokenizer=tok,
                                    chat_template=template.read_text())
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    truncated = 0
    for i, row in enumerate(rows):
        text = tok.apply_chat_template(row["messages"], chat_template=template.read_text(), tokenize=False)
        audio = [load_audio(str(folder / n), sampling_rate=16000, backend="soundfile") for n in row["audios"]]
        got = processor(text=[text], audio=audio or None)
        ids = list(got["input_ids"][0])
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert table["sequence_tokens"][i] == len(ids), i
        assert table["audio_tokens"][i] == ids.count(audio_id), i
        assert table["audios"][i] == len(row["audios"])
        assert table["audio_seconds"][i] == pytest.approx(sum(len(a) for a in audio) / 16000)
        lost = sum(max(0, len(a) - 480000) for a in audio)
        assert table["audio_truncated"][i] == (lost > 0)
        assert table["audio_lost_ms"][i] == round(lost * 1000 / 16000)
        truncated += lost > 0
    assert truncated >= 2
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["audios"]["processor"] == "Qwen2AudioProcessor"
    assert report["chat"]["audios"]["max_seconds"] == 30
    au = report["splits"][0]["chat"]["audios"]
    assert au["audio_tokens"] == sum(table["audio_tokens"]) and au["rows_truncated"] == truncated
    assert au["seconds_lost"] == pytest.approx(sum(table["audio_lost_ms"]) / 1000)
    from lengthscan.report.findings import findings

    assert any("cuts off silently" in f for f in findings(report)), findings(report)
    html = (out / "report.html").read_text()
    assert "cuts off silently" in html  # the finding, where the user reads it
    assert "Audio</h3>" in html and f"{truncated} rows lose" in html


@pytest.mark.parametrize("processor_class,chunk", [pytest.param("Qwen2_5OmniProcessor", 300, marks=pytest.mark.slow),
                                                   ("Qwen3OmniMoeProcessor", 30),
                                                   ("Phi4MultimodalProcessor", 30)])
def test_other_families_equal_their_functions(tmp_path, processor_class, chunk):
    """Per clip length (and the other clips of its conversation), the tokens the family's own
    functions give from the Whisper feature extractor's mask (Phi-4: from its own formula's source)."""
    from transformers import WhisperFeatureExtractor

    folder = tmp_path / processor_class
    folder.mkdir()
    config = {**QWEN2_AUDIO, "chunk_length": chunk, "n_samples": chunk * 16000, "processor_class": processor_class}
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    counter = AudioPartsCounter(str(folder))
    fe = WhisperFeatureExtractor(**config)
    rng = np.random.default_rng(1)
    for _ in range(25):
        lengths = [int(x) for x in rng.integers(500, 16000 * (chunk + 20), size=int(rng.integers(1, 4)))]
        ours = counter.count([(n, 16000) for n in lengths])
        if processor_class == "Qwen2_5OmniProcessor":
            from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

            mask = fe([np.zeros(n, np.float32) for n in lengths], sampling_rate=16000, padding="max_length",
                      return_attention_mask=True)["attention_mask"]
            theirs = [int(t) for t in _get_feat_extract_output_lengths(np.asarray(mask).sum(-1))]
        elif processor_class == "Qwen3OmniMoeProcessor":
            from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

            mask = fe([np.zeros(n, np.float32) for n in lengths], sampling_rate=16000, padding=True,
                      truncation=False, return_attention_mask=True)["attention_mask"]
            theirs = [int(t) for t in _get_feat_extract_output_lengths(np.asarray(mask).sum(-1))]
        else:
            from transformers.models.phi4_multimodal.feature_extraction_phi4_multimodal import (
                Phi4MultimodalFeatureExtractor,
            )

            phi = Phi4MultimodalFeatureExtractor()
            import torch

            theirs = [int(phi._compute_audio_embed_size(torch.tensor((n - 400) // 160 + 1))) for n in lengths]
        assert [c.tokens for c in ours] == theirs, lengths


def test_samples_are_what_load_audio_returns(tmp_path, model, clips):
    """``ceil(frames x 16000 / rate)``: the length transformers' ``load_audio`` pads or trims to."""
    from transformers.audio_utils import load_audio

    counter = AudioPartsCounter(str(model))
    for path in clips[1]:
        info = sf.info(str(path))
        assert counter.samples(info.frames, info.samplerate) == len(load_audio(str(path), sampling_rate=16000,
                                                                                backend="soundfile")), path.name


def _audio_rows(docs: list, names: list, counts: list) -> list:
    """Conversations whose first message has ``counts[i]`` audio parts (the names in turn)."""
    return [{"messages": [{"role": "user", "content": [*({"type": "audio"} for _ in range(k)),
                                                       {"type": "text", "text": docs[i][:100] or "Hm?"}]},
                          {"role": "assistant", "content": docs[i + 1][:80] or "Noise."}],
             "audios": [names[(i + j) % len(names)] for j in range(k)]} for i, k in enumerate(counts)]


def _audited(src, model, template, out) -> dict:
    assert main(["audit", str(src), "--tokenizer", str(model), "--processor", str(model), "--chat-template",
                 str(template), "--messages", "messages", "--audios", "audios", "--train-on", "all", "--full",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    return pq.read_table(out / "lengths.parquet").to_pydict()


GEMMA3N_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
                    "{% if c['type'] == 'audio' %}<audio_soft_token>{% elif c['type'] == 'text' %}{{ c['text'] }}"
                    "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}")
GEMMA3N_TOKENS = {"boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>",
                  "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


def test_gemma3n_rows_equal_its_processor(tmp_path, train_texts, clips, docs):
    """Gemma 3n: 188 tokens a clip between its audio marks, blank lines tokenized with the text
    around them, 30 s kept: against ``Gemma3nProcessor`` itself on the decoded clips."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, Gemma3nProcessor
    from transformers.audio_utils import load_audio
    from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    model = tmp_path / "gemma3n"
    model.mkdir()
    tok = chat_bpe(train_texts[:400], 2000)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in [*GEMMA3N_TOKENS.values(), "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]])
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                             "bos_token": "<bos>", "eos_token": "<eos>",
                                                             "extra_special_tokens": GEMMA3N_TOKENS}))
    (model / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "Gemma3nAudioFeatureExtractor", "processor_class": "Gemma3nProcessor",
        "sampling_rate": 16000}))
    template = tmp_path / "gemma3n.jinja"
    template.write_text(GEMMA3N_TEMPLATE)
    folder, paths = clips
    rows = _audio_rows(docs, [p.name for p in paths], [1, 2, 0, 1, 1])
    table = _audited(write_jsonl(folder / "gemma3n.jsonl", rows), model, template, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(model)
    processor = Gemma3nProcessor(feature_extractor=Gemma3nAudioFeatureExtractor(),
                                 image_processor=SiglipImageProcessorPil(), tokenizer=tok)
    for i, row in enumerate(rows):
        text = tok.apply_chat_template(row["messages"], chat_template=GEMMA3N_TEMPLATE, tokenize=False)
        audio = [load_audio(str(folder / n), sampling_rate=16000, backend="soundfile") for n in row["audios"]]
        ids = list(processor(text=[text], audio=audio or None)["input_ids"][0])
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert table["sequence_tokens"][i] == len(ids), i
        assert table["audio_tokens"][i] == ids.count(tok.convert_tokens_to_ids("<audio_soft_token>")), i
        assert table["audio_truncated"][i] == any(len(a) > 480000 for a in audio)


OMNI_TOKENS = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
               "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
               "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
OMNI_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
                 "{% else %}{% for p in m.content %}{% if p.type == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
                 "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}")


def test_qwen2_5_omni_rows_equal_its_processor(tmp_path, train_texts, clips, docs):
    """Qwen2.5-Omni: Whisper frames of up to 300 s (its released feature extractor), two stride-2
    steps: against ``Qwen2_5OmniProcessor`` itself on the decoded clips (built without its video
    processor, which needs torchvision), a clip over 300 s among them."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, Qwen2_5OmniProcessor, WhisperFeatureExtractor
    from transformers.audio_utils import load_audio
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = tmp_path / "omni"
    model.mkdir()
    tok = chat_bpe(train_texts[:400], 2000)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in OMNI_TOKENS.values()])
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "extra_special_tokens": OMNI_TOKENS}))
    config = {**QWEN2_AUDIO, "chunk_length": 300, "n_samples": 4800000, "nb_max_frames": 30000,
              "processor_class": "Qwen2_5OmniProcessor"}
    (model / "preprocessor_config.json").write_text(json.dumps(config))
    template = tmp_path / "omni.jinja"
    template.write_text(OMNI_TEMPLATE)
    folder, paths = clips
    sf.write(folder / "lecture.wav", np.zeros(8000 * 301 + 3, np.int16), 8000, subtype="PCM_16")  # over 300 s
    names = [p.name for p in paths] + ["lecture.wav"]
    rows = _audio_rows(docs, names, [1, 2, 0, 1, 1, 2, 1])
    table = _audited(write_jsonl(folder / "omni.jsonl", rows), model, template, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(model)

    class AudioOnly(Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, name, argument):  # no video processor
            return None if argument is None else super().check_argument_for_proper_class(name, argument)

    fe = WhisperFeatureExtractor(**{k: v for k, v in config.items() if k != "processor_class"})
    processor = AudioOnly(image_processor=Qwen2VLImageProcessorPil(), video_processor=None, feature_extractor=fe,
                          tokenizer=tok, chat_template=OMNI_TEMPLATE)
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    for i, row in enumerate(rows):
        text = tok.apply_chat_template(row["messages"], chat_template=OMNI_TEMPLATE, tokenize=False)
        audio = [load_audio(str(folder / n), sampling_rate=16000, backend="soundfile") for n in row["audios"]]
        ids = list(processor(text=[text], audio=audio or None)["input_ids"][0])
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["audio_tokens"][i]) == (len(ids), ids.count(audio_id)), i
        assert table["audio_truncated"][i] == any(len(a) > 4800000 for a in audio), i
    assert any(table["audio_truncated"]) and max(table["audio_tokens"]) >= 7500


@pytest.mark.slow
def test_gemma4_rows_equal_its_processor(tmp_path, train_texts, clips, docs):
    """Gemma 4: the mel frames whose window is all real audio, halved twice, at most 750 (30 s):
    against ``Gemma4Processor`` itself (its image processor and audio feature extractor) on the
    decoded clips, a clip over 30 s and one of a few milliseconds among them."""
    from transformers.audio_utils import load_audio
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    from tests.support.vision import reference_processor, vision_dir

    model = vision_dir(tmp_path / "gemma4", "gemma4", train_texts[:400])
    template = tmp_path / "gemma4.jinja"
    template.write_text(OMNI_TEMPLATE.replace("<|audio_bos|><|AUDIO|><|audio_eos|>", "<audio_soft_token>"))
    folder, paths = clips
    sf.write(folder / "blip.wav", np.zeros(150, np.int16), 16000, subtype="PCM_16")  # under one frame: 0 tokens
    rows = _audio_rows(docs, [p.name for p in paths] + ["blip.wav"], [1, 2, 0, 1, 1, 2, 1, 1])
    table = _audited(write_jsonl(folder / "gemma4.jsonl", rows), model, template, tmp_path / "out")
    processor = reference_processor(model, "gemma4")
    processor.feature_extractor = Gemma4AudioFeatureExtractor()
    token = processor.audio_token_id
    for i, row in enumerate(rows):
        text = processor.tokenizer.apply_chat_template(row["messages"], chat_template=template.read_text(),
                                                        tokenize=False)
        audio = [load_audio(str(folder / n), sampling_rate=16000, backend="soundfile") for n in row["audios"]]
        ids = list(processor(text=[text], audio=audio or None)["input_ids"][0])
        assert table["chat_error"][i] is None, table["chat_error"][i]
        assert (table["sequence_tokens"][i], table["audio_tokens"][i]) == (len(ids), ids.count(token)), i
        assert table["audio_truncated"][i] == any(len(a) > 480000 for a in audio), i
    assert any(table["audio_truncated"]) and 750 in table["max_audio_tokens"]
