"""Model limits from configs saved locally, each rule shown from the transformers source it rests on.

Configs, feature extractors and tokenizers are built here and saved with ``save_pretrained`` so
``load_model_context`` reads real directories. Where a rule rests on model code, a test reads that
code (no torch needed); where torch is importable, tiny models also run at the limit and one past it.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import transformers as tf

from lengthscan.policy.model_limits import (
    DECODER_ONLY,
    ENCODER_DECODER,
    ENCODER_ONLY,
    SPEECH_ENCODER,
    SPEECH_SEQ2SEQ,
    ModelContext,
    ModelError,
    load_model_context,
    model_limits,
)

MODELS = Path(importlib.util.find_spec("transformers").submodule_search_locations[0]) / "models"


def _source(module: str) -> str:
    """The text of ``transformers/models/<module>.py``, read without importing it (no torch needed)."""
    return (MODELS / f"{module}.py").read_text()


def _class_source(module: str, name: str) -> str:
    text = _source(module)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)
    return ast.get_source_segment(text, node)


def _save(tmp_path: Path, config, *parts) -> Path:
    out = tmp_path / config.model_type
    for part in (config, *parts):
        part.save_pretrained(out)
    return out


def _limits(tmp_path, config, *parts):
    return model_limits(load_model_context(str(_save(tmp_path, config, *parts))))


def _word_tokenizer(model_max_length: int):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    backend = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", model_max_length=model_max_length)


def _whisper_tokenizer():
    """A real WhisperTokenizer over the byte alphabet plus the special tokens its prefix uses."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    for token in ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                  "<|notimestamps|>"):
        vocab[token] = len(vocab)
    return tf.WhisperTokenizer(vocab=vocab, merges=[])


# -- rules, on saved directories ------------------------------------------------------------------

CASES = [
    # (config, family, {measurement: value}, fragments expected in the notes)
    (tf.BertConfig(), ENCODER_ONLY, {"input_tokens": 512}, []),
    (tf.RobertaConfig(max_position_embeddings=514), ENCODER_ONLY, {"input_tokens": 512}, []),
    (tf.RobertaConfig(), ENCODER_ONLY, {"input_tokens": 510}, []),  # the class default is 512, not roberta-base's 514
    (tf.XLMRobertaConfig(max_position_embeddings=514), ENCODER_ONLY, {"input_tokens": 512}, []),
    (tf.CamembertConfig(max_position_embeddings=514), ENCODER_ONLY, {"input_tokens": 512}, []),
    (tf.LongformerConfig(max_position_embeddings=4098), ENCODER_ONLY, {"input_tokens": 4096}, []),
    (tf.DebertaV2Config(position_biased_input=False), ENCODER_ONLY, {}, ["relative position buckets"]),
    (tf.BartConfig(max_position_embeddings=1024), ENCODER_DECODER, {"input_tokens": 1024, "target_tokens": 1024}, []),
    (tf.MBartConfig(), ENCODER_DECODER, {"input_tokens": 1024, "target_tokens": 1024}, []),
    (tf.PegasusConfig(max_position_embeddings=512), ENCODER_DECODER, {"input_tokens": 512, "target_tokens": 512}, []),
    (tf.MarianConfig(max_position_embeddings=512), ENCODER_DECODER, {"input_tokens": 512, "target_tokens": 512}, []),
    (tf.LEDConfig(), ENCODER_DECODER, {"input_tokens": 16384, "target_tokens": 1024}, []),
    (tf.M2M100Config(), ENCODER_DECODER, {"input_tokens": 1024, "target_tokens": 1024}, []),
    (tf.T5Config(), ENCODER_DECODER, {}, ["no input position limit", "no target position limit"]),
    (tf.MT5Config(), ENCODER_DECODER, {}, ["relative position buckets"]),
    (tf.GPT2Config(n_positions=2048), DECODER_ONLY, {"input_tokens": 2048}, ["sum must fit"]),
    (tf.OPTConfig(), DECODER_ONLY, {"input_tokens": 2048}, []),
    (tf.GPTJConfig(), DECODER_ONLY, {"input_tokens": 2048}, []),
    (tf.BloomConfig(), DECODER_ONLY, {}, ["ALiBi"]),
    (tf.LlamaConfig(max_position_embeddings=4096), DECODER_ONLY, {"input_tokens": 4096}, []),
    (tf.MistralConfig(max_position_embeddings=32768), DECODER_ONLY, {"input_tokens": 32768}, []),
    (tf.Qwen2Config(), DECODER_ONLY, {"input_tokens": 32768}, []),  # no rule of its own: found as RoPE
    (tf.Wav2Vec2Config(), SPEECH_ENCODER, {}, ["convolutional position embeddings"]),
]


@pytest.mark.parametrize("config,family,expected,notes", CASES, ids=lambda v: getattr(v, "model_type", None))
def test_rules(tmp_path, config, family, expected, notes):
    result = _limits(tmp_path, config)
    assert result.model_type == config.model_type
    assert result.family == family
    assert {x.name: x.value for x in result.limits} == expected
    for fragment in notes:
        assert any(fragment in note for note in result.notes), (fragment, result.notes)
    assert result.to_dict()["limits"] == [{"name": x.name, "value": x.value, "origin": x.origin} for x in result.limits]


def test_origins_say_how(tmp_path):
    roberta = _limits(tmp_path, tf.RobertaConfig(max_position_embeddings=514)).get("input_tokens")
    assert roberta.origin.startswith("config.max_position_embeddings 514 - 2") and "padding_idx 1" in roberta.origin
    assert "n_positions 1024" in _limits(tmp_path, tf.GPT2Config()).get("input_tokens").origin
    llama = _limits(tmp_path, tf.LlamaConfig(max_position_embeddings=4096)).get("input_tokens")
    assert "RoPE" in llama.origin and "not a hard limit" in llama.origin
    assert "+ 2 rows" in _limits(tmp_path, tf.BartConfig()).get("input_tokens").origin
    assert "grows" in _limits(tmp_path, tf.M2M100Config()).get("input_tokens").origin


def test_rope_scaling_is_noted(tmp_path):
    config = tf.LlamaConfig(max_position_embeddings=32768, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192})
    result = _limits(tmp_path, config)
    assert result.get("input_tokens").value == 32768
    assert any("yarn" in n and "original_max_position_embeddings=8192" in n for n in result.notes)


def test_falcon_alibi_switch(tmp_path):
    assert _limits(tmp_path, tf.FalconConfig(alibi=False)).get("input_tokens").value == 2048
    alibi = _limits(tmp_path, tf.FalconConfig(alibi=True))
    assert alibi.limits == () and any("ALiBi" in n for n in alibi.notes)


def test_multimodal_reads_its_text_config(tmp_path):
    result = _limits(tmp_path, tf.Gemma3Config())
    assert result.get("input_tokens").value == 131072
    assert result.notes[0] == "limits from the text config (gemma3_text)"


def test_unknown_family_uses_generic_fields(tmp_path):
    generic = model_limits(ModelContext("x", tf.PretrainedConfig(max_seq_len=777), None, None))
    assert generic.get("input_tokens").value == 777 and "generic" in generic.get("input_tokens").origin
    empty = model_limits(ModelContext("x", tf.PretrainedConfig(), None, None))
    assert empty.limits == () and "no input limit found" in empty.notes[0]


# -- Whisper and speech encoders ------------------------------------------------------------------

def test_whisper_limits(tmp_path):
    tokenizer = _whisper_tokenizer()
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    config = tf.WhisperConfig(decoder_start_token_id=start)
    result = _limits(tmp_path, config, tf.WhisperFeatureExtractor(), tokenizer)
    assert result.family == SPEECH_SEQ2SEQ and result.sampling_rate == 16000
    assert {x.name: x.value for x in result.limits} == {"input_frames": 3000, "input_seconds": 30, "target_tokens": 449}
    # the measured target length counts <|startoftranscript|>, which the collator strips from labels
    assert tokenizer(text_target="hi")["input_ids"][0] == start
    assert "448 + 1" in result.get("target_tokens").origin


def test_whisper_tokenizer_without_start_token_gives_448(tmp_path):
    config = tf.WhisperConfig()  # decoder_start_token_id 50257: not what this tokenizer starts targets with
    result = _limits(tmp_path, config, tf.WhisperFeatureExtractor(), _whisper_tokenizer())
    assert result.get("target_tokens").value == 448


def test_whisper_without_feature_extractor(tmp_path):
    result = _limits(tmp_path, tf.WhisperConfig())
    assert result.get("input_seconds") is None and result.get("input_frames").value == 3000
    assert result.sampling_rate is None and any("input_seconds limit is unknown" in n for n in result.notes)


def test_wav2vec2_sampling_rate(tmp_path):
    result = _limits(tmp_path, tf.Wav2Vec2Config(), tf.Wav2Vec2FeatureExtractor(sampling_rate=8000))
    assert result.limits == () and result.sampling_rate == 8000


def test_whisper_source():
    text = _source("whisper/modeling_whisper")
    assert "if labels.shape[1] > self.max_target_positions:" in text  # strictly greater raises
    assert "nn.Conv1d(embed_dim, embed_dim, kernel_size=3, stride=2, padding=1)" in text
    assert "self.config.max_source_positions * self.conv1.stride[0] * self.conv2.stride[0]" in text
    fe = tf.WhisperFeatureExtractor()
    assert fe.nb_max_frames == tf.WhisperConfig().max_source_positions * 2 == 3000


@pytest.mark.parametrize("module", ["wav2vec2", "hubert", "wavlm", "data2vec/modeling_data2vec_audio"])
def test_speech_encoders_have_conv_positions(module):
    text = _source(module if "/" in module else f"{module}/modeling_{module}")
    assert "PositionalConvEmbedding(nn.Module)" in text
    assert not re.search(r"nn\.Embedding\(\s*config\.max_(position_embeddings|source_positions)", text)


# -- the source behind the text rules ---------------------------------------------------------------

PADDED = ["roberta", "xlm_roberta", "camembert", "longformer", "data2vec/modeling_data2vec_text", "mpnet"]


@pytest.mark.parametrize("module", PADDED)
def test_padding_offset_source(module):
    text = _source(module if "/" in module else f"{module}/modeling_{module}")
    table = r"nn\.Embedding\(\s*config\.max_position_embeddings, config\.\w+, padding_idx=self\.padding_idx"
    assert re.search(table, text)
    assert "create_position_ids_from_input_ids(input_ids, self.padding_idx" in text


class _Tensor(np.ndarray):
    """The few torch.Tensor methods create_position_ids_from_input_ids calls, over numpy."""

    def ne(self, value):
        return (np.asarray(self) != value).view(_Tensor)

    def int(self):
        return self.astype(np.int32)

    def long(self):
        return self.astype(np.int64)

    def type_as(self, other):
        return self.astype(other.dtype)


def test_roberta_position_ids_run_from_source():
    """Run RoBERTa's own create_position_ids_from_input_ids (taken from its source) on numpy."""
    text = _source("roberta/modeling_roberta")
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "RobertaEmbeddings")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "create_position_ids_from_input_ids")
    fn.decorator_list = []
    scope = {"torch": SimpleNamespace(cumsum=lambda x, dim: np.cumsum(np.asarray(x), axis=dim).view(_Tensor))}
    exec(compile(ast.Module([fn], []), "modeling_roberta", "exec"), scope)
    ids = np.array([[0] + [5] * 510 + [2], [0, 5, 2] + [1] * 509]).view(_Tensor)  # 512 tokens; a padded row
    positions = np.asarray(scope["create_position_ids_from_input_ids"](ids, 1))
    assert positions[0, 0] == 2 and positions[0].max() == 513  # 512 tokens need rows 2..513: a 514-row table
    assert list(positions[1, :4]) == [2, 3, 4, 1]  # padding keeps padding_idx


def test_roberta_position_ids_with_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: the real call is shown by the source test")
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids = torch.full((1, 512), 5)
    assert RobertaEmbeddings.create_position_ids_from_input_ids(ids, 1).max().item() == 513


@pytest.mark.parametrize("module,cls", [("bart/modeling_bart", "BartLearnedPositionalEmbedding"),
                                        ("mbart/modeling_mbart", "MBartLearnedPositionalEmbedding"),
                                        ("opt/modeling_opt", "OPTLearnedPositionalEmbedding")])
def test_shift2_tables_have_the_extra_rows(module, cls):
    text = _class_source(module, cls)
    assert "super().__init__(num_embeddings + self.offset, embedding_dim)" in text and "self.offset = 2" in text
    assert "+ self.offset)" in text
    assert re.search(rf"{cls}\(\s*config\.max_position_embeddings", _source(module))


def test_t5_family_has_no_position_table():
    for name in ("t5", "mt5", "longt5", "umt5"):
        text = _source(f"{name}/modeling_{name}")
        assert "relative_attention_bias = nn.Embedding(self.relative_attention_num_buckets" in text
        assert "max_position_embeddings" not in text and "embed_positions" not in text


def test_rope_is_computed_but_gptj_indexes_a_table():
    llama = _class_source("llama/modeling_llama", "LlamaRotaryEmbedding")
    assert "position_ids[..., None].float() * self.inv_freq" in llama
    gptj = _class_source("gptj/modeling_gptj", "GPTJRotaryEmbedding")
    assert "self.embed_positions[position_ids]" in gptj and "config.max_position_embeddings" in gptj


def test_m2m100_table_grows():
    text = _class_source("m2m_100/modeling_m2m_100", "M2M100SinusoidalPositionalEmbedding")
    assert "if not (is_torchdynamo_compiling() and torch.is_tensor(max_pos)) and max_pos > self.weights.size(0)" in text


# -- the limits hold in running models (torch only) -------------------------------------------------

TINY = dict(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
TINY_SEQ2SEQ = dict(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                    decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8)


def _runs(model, length: int, key: str = "input_ids", **extra) -> bool:
    import torch

    ids = torch.full((1, length), 5)
    try:
        with torch.no_grad():
            model(**{key: ids}, **extra)
    except (IndexError, RuntimeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", ["roberta", "bart", "marian", "gpt2", "opt", "llama", "t5"])
def test_tiny_models_run_to_the_limit(name):
    torch = pytest.importorskip("torch", reason="torch not installed: the limits are shown from source instead")
    configs = {
        "roberta": (tf.RobertaConfig(max_position_embeddings=18, pad_token_id=1, **TINY), tf.RobertaModel),
        "bart": (tf.BartConfig(max_position_embeddings=16, **TINY_SEQ2SEQ), tf.BartForConditionalGeneration),
        "marian": (tf.MarianConfig(max_position_embeddings=16, pad_token_id=0, decoder_start_token_id=0,
                                   **TINY_SEQ2SEQ), tf.MarianMTModel),
        "gpt2": (tf.GPT2Config(n_positions=16, n_embd=8, n_layer=1, n_head=2, vocab_size=16), tf.GPT2LMHeadModel),
        "opt": (tf.OPTConfig(max_position_embeddings=16, ffn_dim=8, word_embed_proj_dim=8, **TINY), tf.OPTModel),
        "llama": (tf.LlamaConfig(max_position_embeddings=16, **TINY), tf.LlamaModel),
        "t5": (tf.T5Config(vocab_size=16, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2), tf.T5EncoderModel),
    }
    config, cls = configs[name]
    torch.manual_seed(0)
    model = cls(config).eval()
    limits = model_limits(ModelContext(name, config, None, None))
    limit = limits.get("input_tokens")
    if limit is None or "not a hard limit" in limit.origin:  # computed positions: runs past the config value
        assert _runs(model, 40)
        return
    decoder = {"decoder_input_ids": torch.full((1, 2), 5)} if config.is_encoder_decoder else {}
    assert _runs(model, limit.value, **decoder) and not _runs(model, limit.value + 1, **decoder)
    target = limits.get("target_tokens")
    if target is not None:
        short = {"input_ids": torch.full((1, 4), 5)}
        assert _runs(model, target.value, key="labels", **short)
        assert not _runs(model, target.value + 1, key="labels", **short)


def test_tiny_whisper_labels():
    torch = pytest.importorskip("torch", reason="torch not installed: the labels check is shown from source instead")
    config = tf.WhisperConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8, num_mel_bins=4,
                              max_source_positions=4, max_target_positions=8, pad_token_id=0,
                              decoder_start_token_id=1)
    model = tf.WhisperForConditionalGeneration(config).eval()
    frames = model_limits(ModelContext("w", config, None, None)).get("input_frames").value
    features = torch.zeros((1, 4, frames))
    assert _runs(model, 8, key="labels", input_features=features)
    assert not _runs(model, 9, key="labels", input_features=features)
    assert not _runs(model, 8, key="labels", input_features=torch.zeros((1, 4, frames + 1)))


# -- loading ------------------------------------------------------------------------------------

def test_config_file_path(tmp_path):
    directory = _save(tmp_path, tf.WhisperConfig(), tf.WhisperFeatureExtractor())
    ctx = load_model_context(str(directory / "config.json"))
    assert ctx.config.model_type == "whisper" and ctx.feature_extractor is not None  # found beside config.json
    other = tmp_path / "bert.json"
    other.write_text(tf.BertConfig().to_json_string())
    ctx = load_model_context(str(other))
    assert ctx.config.model_type == "bert" and ctx.feature_extractor is None and ctx.tokenizer is None


def test_text_model_has_no_feature_extractor_nor_phantom_tokenizer(tmp_path):
    # AutoTokenizer makes an empty tokenizer from a config-only directory; it must not count as one
    ctx = load_model_context(str(_save(tmp_path, tf.BertConfig())))
    assert ctx.feature_extractor is None and ctx.tokenizer is None


def test_tokenizer_max_length(tmp_path):
    t5 = model_limits(load_model_context(str(_save(tmp_path, tf.T5Config(), _word_tokenizer(512)))))
    assert t5.get("input_tokens").value == 512 and "tokenizer.model_max_length" in t5.get("input_tokens").origin
    bert = model_limits(load_model_context(str(_save(tmp_path, tf.BertConfig())), tokenizer=_word_tokenizer(256)))
    assert bert.get("input_tokens").value == 512 and any("256 differs" in n for n in bert.notes)
    placeholder = load_model_context(str(_save(tmp_path, tf.T5Config())), tokenizer=_word_tokenizer(int(1e30)))
    assert model_limits(placeholder).get("input_tokens") is None


def test_tokenizer_given_as_directory(tmp_path):
    tokenizer_dir = tmp_path / "tok"
    _word_tokenizer(128).save_pretrained(tokenizer_dir)
    ctx = load_model_context(str(_save(tmp_path, tf.T5Config())), tokenizer=str(tokenizer_dir))
    assert ctx.tokenizer.model_max_length == 128 and model_limits(ctx).get("input_tokens").value == 128


def test_errors_name_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="'no-such-org/no-such-model'.*offline mode is on"):
        load_model_context("no-such-org/no-such-model")
    with pytest.raises(ModelError, match="no such directory or config file"):
        load_model_context(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="empty"):
        load_model_context(str(tmp_path / "empty"))
    assert issubclass(ModelError, ValueError)
