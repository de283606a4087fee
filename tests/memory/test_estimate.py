"""The peak-memory model (lengthscan.memory): pure checks, and against real models when torch is installed."""

from __future__ import annotations

import json
import os
import time

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers as tr

from lengthscan.memory import (
    MemoryEstimate,
    MemoryOptions,
    Shape,
    estimate,
    families,
    load_config,
)

ENC_DEC = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
WHISPER = dict(pad_token_id=1, bos_token_id=3, eos_token_id=3, decoder_start_token_id=2, suppress_tokens=None,
               begin_suppress_tokens=None)


def _bart(**kw):
    base = dict(vocab_size=600, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=96, max_position_embeddings=128,
                **ENC_DEC)
    return base | kw


def _text(**kw):
    base = dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    return base | kw


def _w2v(**kw):
    base = dict(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    return base | kw


#: Several configs per family, for the exact parameter counts (name, config, options).
PARAM_CASES = [
    ("bart", tr.BartConfig(**_bart()), MemoryOptions()),
    ("bart-untied", tr.BartConfig(**_bart(tie_word_embeddings=False)), MemoryOptions()),
    ("mbart", tr.MBartConfig(**_bart()), MemoryOptions()),
    ("plbart", tr.PLBartConfig(**_bart()), MemoryOptions()),
    ("pegasus", tr.PegasusConfig(**_bart()), MemoryOptions()),
    ("marian", tr.MarianConfig(**_bart()), MemoryOptions()),
    ("marian-two-vocabularies",
     tr.MarianConfig(**_bart(share_encoder_decoder_embeddings=False, decoder_vocab_size=500)), MemoryOptions()),
    ("blenderbot", tr.BlenderbotConfig(**_bart()), MemoryOptions()),
    ("blenderbot-small", tr.BlenderbotSmallConfig(**_bart()), MemoryOptions()),
    ("t5", tr.T5Config(vocab_size=600, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=3,
                       num_heads=4, decoder_start_token_id=0), MemoryOptions()),
    ("t5-gated", tr.T5Config(vocab_size=600, d_model=64, d_kv=8, d_ff=96, num_layers=2, num_heads=6,
                             feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0),
     MemoryOptions()),
    ("mt5", tr.MT5Config(vocab_size=600, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                         decoder_start_token_id=0), MemoryOptions()),
    ("llama-gqa", tr.LlamaConfig(**_text(num_key_value_heads=2)), MemoryOptions()),
    ("llama-bias-tied", tr.LlamaConfig(**_text(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
     MemoryOptions()),
    ("mistral", tr.MistralConfig(**_text(num_key_value_heads=1)), MemoryOptions()),
    ("qwen2", tr.Qwen2Config(**_text(num_key_value_heads=2)), MemoryOptions()),
    ("qwen3", tr.Qwen3Config(**_text(num_key_value_heads=2, head_dim=32)), MemoryOptions()),
    ("gemma", tr.GemmaConfig(**_text(num_key_value_heads=1, head_dim=32)), MemoryOptions()),
    ("gemma-untied", tr.GemmaConfig(**_text(tie_word_embeddings=False)), MemoryOptions()),
    ("phi3", tr.Phi3Config(**_text(num_key_value_heads=2, pad_token_id=0)), MemoryOptions()),
    ("gpt-neox", tr.GPTNeoXConfig(**_text()), MemoryOptions()),
    ("gpt-neox-sequential-tied", tr.GPTNeoXConfig(**_text(use_parallel_residual=False, tie_word_embeddings=True,
                                                          attention_bias=False)), MemoryOptions()),
    ("gpt2", tr.GPT2Config(vocab_size=600, n_embd=64, n_layer=2, n_head=4, n_positions=128), MemoryOptions()),
    ("opt", tr.OPTConfig(vocab_size=600, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                         word_embed_proj_dim=32), MemoryOptions()),
    ("opt-post-ln", tr.OPTConfig(vocab_size=600, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                                 num_attention_heads=4, do_layer_norm_before=False, enable_bias=False,
                                 layer_norm_elementwise_affine=False), MemoryOptions()),
    ("gpt2-untied", tr.GPT2Config(vocab_size=600, n_embd=64, n_layer=1, n_head=4, n_inner=96,
                                  tie_word_embeddings=False), MemoryOptions()),
    ("bert-cls", tr.BertConfig(**_text(num_labels=5)), MemoryOptions()),
    ("bert-mlm", tr.BertConfig(**_text(architectures=["BertForMaskedLM"])), MemoryOptions()),
    ("roberta-cls", tr.RobertaConfig(**_text()), MemoryOptions()),
    ("roberta-mlm", tr.RobertaConfig(**_text()), MemoryOptions(head="masked_lm")),
    ("bert-mlm-untied", tr.BertConfig(**_text(tie_word_embeddings=False)), MemoryOptions(head="masked_lm")),
    ("xlm-roberta", tr.XLMRobertaConfig(**_text()), MemoryOptions()),
    ("electra-cls", tr.ElectraConfig(**_text(embedding_size=32)), MemoryOptions()),
    ("electra-mlm", tr.ElectraConfig(**_text(embedding_size=32)), MemoryOptions(head="masked_lm")),
    ("electra-discriminator", tr.ElectraConfig(**_text(architectures=["ElectraForPreTraining"])), MemoryOptions()),
    ("distilbert-cls", tr.DistilBertConfig(vocab_size=600, dim=64, n_layers=2, n_heads=4, hidden_dim=96),
     MemoryOptions()),
    ("distilbert-mlm", tr.DistilBertConfig(vocab_size=600, dim=64, n_layers=2, n_heads=4, hidden_dim=96,
                                           sinusoidal_pos_embds=True), MemoryOptions(head="masked_lm")),
    ("wav2vec2-group", tr.Wav2Vec2Config(**_w2v()), MemoryOptions()),
    ("wav2vec2-frozen", tr.Wav2Vec2Config(**_w2v()), MemoryOptions(freeze_feature_encoder=True)),
    ("wav2vec2-layer", tr.Wav2Vec2Config(**_w2v(feat_extract_norm="layer", do_stable_layer_norm=True,
                                                conv_bias=True)), MemoryOptions()),
    ("hubert", tr.HubertConfig(**_w2v()), MemoryOptions()),
    ("wavlm", tr.WavLMConfig(**_w2v()), MemoryOptions()),
    ("data2vec-audio", tr.Data2VecAudioConfig(**_w2v(num_conv_pos_embeddings=3, conv_pos_kernel_size=5)),
     MemoryOptions()),
    ("whisper", tr.WhisperConfig(vocab_size=600, d_model=64, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                 decoder_ffn_dim=128, max_source_positions=100, max_target_positions=64, **WHISPER),
     MemoryOptions()),
    ("gemma2", tr.Gemma2Config(**_text(num_key_value_heads=2, head_dim=32, sliding_window=16)), MemoryOptions()),
    ("gemma2-untied-bias", tr.Gemma2Config(**_text(tie_word_embeddings=False, attention_bias=True)), MemoryOptions()),
    ("gemma3-text", tr.Gemma3TextConfig(**_text(num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
                                                layer_types=["sliding_attention", "full_attention",
                                                             "sliding_attention"])), MemoryOptions()),
    ("mixtral", tr.MixtralConfig(**_text(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
     MemoryOptions()),
    ("qwen2-moe-sparse-step", tr.Qwen2MoeConfig(**_text(num_hidden_layers=3, moe_intermediate_size=48,
                                                        shared_expert_intermediate_size=80, num_experts=4,
                                                        num_experts_per_tok=2, decoder_sparse_step=2)),
     MemoryOptions()),
    ("qwen3-moe-mlp-only", tr.Qwen3MoeConfig(**_text(num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
                                                     moe_intermediate_size=48, num_experts=6, num_experts_per_tok=3,
                                                     mlp_only_layers=[0], attention_bias=True)), MemoryOptions()),
]

#: One tiny configuration per family, measured on CPU (name, config, shape).
MEASURED_CASES = [
    ("bart", tr.BartConfig(**_bart(vocab_size=2000, d_model=128, encoder_ffn_dim=512, decoder_ffn_dim=512)),
     Shape(4, 128, 32)),
    ("llama", tr.LlamaConfig(**_text(vocab_size=2000, hidden_size=128, intermediate_size=344,
                                     num_key_value_heads=2)), Shape(4, 128)),
    ("bert", tr.BertConfig(**_text(vocab_size=2000, hidden_size=128, intermediate_size=512)), Shape(8, 128)),
    ("gemma", tr.GemmaConfig(**_text(vocab_size=2000, hidden_size=128, intermediate_size=344, num_key_value_heads=1,
                                     head_dim=32)), Shape(4, 128)),
    ("phi3", tr.Phi3Config(**_text(vocab_size=2000, hidden_size=128, intermediate_size=344, num_key_value_heads=2,
                                   pad_token_id=0)), Shape(4, 128)),
    ("electra", tr.ElectraConfig(**_text(vocab_size=2000, embedding_size=64, hidden_size=128,
                                         intermediate_size=512)), Shape(8, 128)),
    ("gpt-neox", tr.GPTNeoXConfig(**_text(vocab_size=2000, hidden_size=128, intermediate_size=512)), Shape(4, 128)),
    ("wav2vec2", tr.Wav2Vec2Config(**_w2v(hidden_size=128, intermediate_size=512, conv_dim=(64,) * 7)),
     Shape(2, 16000, 20)),
    ("wavlm", tr.WavLMConfig(**_w2v(hidden_size=128, intermediate_size=512, conv_dim=(32,) * 7,
                                    num_attention_heads=8)), Shape(2, 48000, 20)),
    ("whisper", tr.WhisperConfig(vocab_size=2000, d_model=128, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512,
                                 decoder_ffn_dim=512, max_source_positions=200, max_target_positions=64, **WHISPER),
     Shape(2, None, 32)),
]


def _by_name(cases):
    return pytest.mark.parametrize("name,config,extra", cases, ids=[c[0] for c in cases])


# -- without torch ---------------------------------------------------------------------------------


def test_families_cover_the_issue():
    supported = families()
    for model_type in ("bart", "pegasus", "t5", "marian", "llama", "mistral", "gpt2", "bert", "roberta",
                       "wav2vec2", "whisper"):
        assert model_type in supported


def test_estimate_is_a_documented_record():
    est = estimate(tr.BartConfig(**_bart()), Shape(2, 64, 16))
    assert isinstance(est, MemoryEstimate)
    assert est.phase in ("forward_end", "backward", "optimizer_step")
    assert sum(est.terms.values()) == est.peak_bytes
    assert est.peak_bytes == max(est.phase_peaks.values()) == est.phase_peaks[est.phase]
    assert {"weights", "optimizer_state"} <= set(est.terms)
    json.dumps(est.to_dict())
    assert (est.family, est.head) == ("encoder-decoder", "seq2seq")


def test_known_parameter_counts_without_torch():
    # the released models' counts (checked against the modules when torch is installed, below)
    assert estimate(tr.BartConfig(), Shape(1, 8, 8)).params == 406_291_456  # facebook/bart-large
    assert estimate(tr.BertConfig(), Shape(1, 8)).params == 109_483_778  # bert-base, 2 labels
    assert estimate(tr.GPT2Config(), Shape(1, 8)).params == 124_439_808  # gpt2


def test_state_terms_follow_the_optimizer_and_precision():
    config, shape = tr.LlamaConfig(**_text(num_key_value_heads=2)), Shape(2, 32)
    adamw = estimate(config, shape)
    params = adamw.params
    assert adamw.phase_peaks["optimizer_step"] >= 16 * params  # weights, gradients, two moments
    sgd = estimate(config, shape, MemoryOptions(optimizer="sgd"))
    assert "optimizer_state" not in sgd.terms
    foreach = estimate(config, shape, MemoryOptions(optimizer="adamw_foreach"))
    assert foreach.phase_peaks["optimizer_step"] == adamw.phase_peaks["optimizer_step"] + 4 * params
    bf16 = estimate(config, Shape(8, 512), MemoryOptions(precision="bf16"))
    assert bf16.terms.get("weight_copies", 0) > 0  # autocast's bf16 copies of the weights
    accumulating = estimate(config, shape, MemoryOptions(gradient_accumulation_steps=4))
    assert accumulating.phase_peaks["forward_end"] >= adamw.phase_peaks["forward_end"] + 4 * params


def test_peak_grows_with_the_batch_and_lengths():
    config = tr.BartConfig(**_bart())
    peaks = [estimate(config, s).peak_bytes for s in (Shape(2, 64, 16), Shape(4, 64, 16), Shape(4, 128, 16),
                                                       Shape(4, 128, 64))]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4


def test_options_that_save_memory_on_long_batches():
    config = tr.LlamaConfig(**_text(num_hidden_layers=8, num_key_value_heads=2))
    shape = Shape(8, 1024)
    base = estimate(config, shape).peak_bytes
    assert estimate(config, shape, MemoryOptions(gradient_checkpointing=True)).peak_bytes < 0.7 * base
    eager = estimate(config, shape, MemoryOptions(attention="eager"))
    assert eager.peak_bytes > base and eager.terms["activations_attention"] > 0
    w2v, audio = tr.Wav2Vec2Config(**_w2v()), Shape(4, 160000, 50)
    frozen = estimate(w2v, audio, MemoryOptions(freeze_feature_encoder=True))
    assert frozen.peak_bytes < estimate(w2v, audio).peak_bytes
    assert frozen.trainable_params < frozen.params


def test_padding_materialises_masks():
    config = tr.BertConfig(**_text())
    plain, padded = estimate(config, Shape(8, 256)), estimate(config, Shape(8, 256, padding=True))
    assert padded.peak_bytes > plain.peak_bytes


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="precision"):
        MemoryOptions(precision="fp8")
    with pytest.raises(ValueError, match="batch_size"):
        Shape(0, 10)
    with pytest.raises(ValueError, match="input_len"):
        estimate(tr.BertConfig(**_text()), Shape(2))
    with pytest.raises(ValueError, match="not modelled"):
        estimate(tr.ViTConfig(), Shape(1, 10))
    with pytest.raises(ValueError, match="mel frames"):
        estimate(tr.WhisperConfig(**WHISPER), Shape(1, 2999, 8))
    with pytest.raises(ValueError, match="head"):
        estimate(tr.BertConfig(**_text()), Shape(1, 10), MemoryOptions(head="ctc"))


def test_load_config_from_a_file_and_a_directory(tmp_path):
    config = tr.LlamaConfig(**_text(num_key_value_heads=2))
    config.save_pretrained(tmp_path)
    from_dir = load_config(str(tmp_path))
    from_file = load_config(str(tmp_path / "config.json"))
    shape = Shape(2, 64)
    assert estimate(from_dir, shape) == estimate(from_file, shape) == estimate(config, shape)


def test_a_large_model_is_estimated_quickly():
    start = time.perf_counter()
    config = tr.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=8, vocab_size=128256)
    est = estimate(config, Shape(4, 4096), MemoryOptions(precision="bf16", gradient_checkpointing=True))
    assert time.perf_counter() - start < 10
    assert est.params == 8_030_261_248  # Llama-3-8B


# -- against real models (torch) -------------------------------------------------------------------


@_by_name(PARAM_CASES)
def test_parameter_counts_are_exact(name, config, extra):
    torch = pytest.importorskip("torch", reason="torch not installed: parameter counts are checked against modules")
    from lengthscan.memory.cpu_peak import build_model

    with torch.device("meta"):
        model = build_model(config, extra)
    length = {"wav2vec2": 16000, "hubert": 16000, "whisper": None}.get(config.model_type, 8)
    est = estimate(config, Shape(1, length, 4), extra)
    assert est.params == sum(p.numel() for p in model.parameters())
    assert est.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow  # a real training step of each model, its CPU peak measured
@_by_name(MEASURED_CASES)
def test_estimate_within_ten_percent_of_the_measured_cpu_peak(name, config, extra):
    pytest.importorskip("torch", reason="torch not installed: the CPU peak of a real training step is measured")
    from lengthscan.memory.cpu_peak import build_model, make_batch, measure_step

    options = MemoryOptions()
    model = build_model(config, options)
    measured = measure_step(model, make_batch(config, extra, options), options)
    predicted = estimate(config, extra, options)
    assert predicted.params == sum(p.numel() for p in model.parameters())
    assert abs(predicted.peak_bytes / measured.peak_bytes - 1) <= 0.10, (predicted.to_dict(), measured.to_dict())


def test_largest_fitting_finds_the_boundary():
    from lengthscan.memory import largest_fitting

    config, options = tr.BartConfig(**_bart()), MemoryOptions(precision="bf16")
    budget = estimate(config, Shape(4, 100, 16, padding=True), options).peak_bytes
    best = largest_fitting(config, budget, lambda n: Shape(4, n, 16, padding=True), 2000, options=options, margin=0)
    assert best is not None and best >= 100
    assert estimate(config, Shape(4, best, 16, padding=True), options).peak_bytes <= budget
    assert estimate(config, Shape(4, best + 1, 16, padding=True), options).peak_bytes > budget
    assert largest_fitting(config, 1000, lambda n: Shape(4, n, 16), 2000) is None  # not even one token
