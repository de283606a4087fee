"""Gemma 2/3 (soft-capping, sliding windows) and the MoE decoders (Mixtral, Qwen2-MoE, Qwen3-MoE)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers as tr

from lengthscan.memory import MemoryOptions, Shape, estimate


def _gemma2(**kw):
    base = dict(vocab_size=2000, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, sliding_window=64, max_position_embeddings=1024)
    return tr.Gemma2Config(**(base | kw))


def _gemma3(**kw):
    base = dict(vocab_size=2000, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, sliding_window=64, max_position_embeddings=1024,
                layer_types=["sliding_attention", "full_attention"])
    return tr.Gemma3TextConfig(**(base | kw))


def _mixtral(**kw):
    base = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=1024)
    return tr.MixtralConfig(**(base | kw))


def _peak(config, shape, **options) -> int:
    return estimate(config, shape, MemoryOptions(**options)).peak_bytes


# -- without torch ---------------------------------------------------------------------------------


def test_soft_capping_costs_memory():
    shape = Shape(2, 128)
    # the capped scores (eager: three more quadratic tensors, tanh's kept) and the capped logits
    assert _peak(_gemma2(), shape) > _peak(_gemma2(attn_logit_softcapping=None), shape)
    assert _peak(_gemma2(), shape) > _peak(_gemma2(final_logit_softcapping=None), shape)
    assert _peak(_gemma3(final_logit_softcapping=30.0), shape) > _peak(_gemma3(), shape)
    # Gemma 3 never caps its scores: the setting changes nothing
    assert _peak(_gemma3(attn_logit_softcapping=50.0), shape) == _peak(_gemma3(), shape)


def test_gemma2_runs_eager_attention_whatever_sdpa_says():
    est = estimate(_gemma2(), Shape(2, 128))
    assert est.peak_bytes == _peak(_gemma2(), Shape(2, 128), attention="eager")
    assert any("eager" in note for note in est.notes)
    assert _peak(_gemma2(), Shape(2, 128), attention="flash") < est.peak_bytes  # no quadratic softmax


def test_sliding_window_masks_once_the_sequence_reaches_the_window():
    # SDPA: no mask below the window (is_causal), a bool mask and its float copy per sliding layer from it
    below, at = _gemma3(sliding_window=200), _gemma3(sliding_window=128)
    assert _peak(at, Shape(4, 128)) > _peak(below, Shape(4, 128))
    assert _peak(at, Shape(4, 100)) == _peak(below, Shape(4, 100))
    for config in (below, at, _gemma2()):
        peaks = [_peak(config, Shape(2, n)) for n in (32, 64, 65, 128, 256)]
        assert peaks == sorted(peaks)


def test_moe_peak_grows_with_the_routing_width_and_the_experts():
    shape = Shape(2, 128)
    assert _peak(_mixtral(num_experts_per_tok=4), shape) > _peak(_mixtral(), shape)  # tokens x top_k rows
    assert _peak(_mixtral(num_local_experts=16), shape) > _peak(_mixtral(), shape)  # weights and state
    est = estimate(_mixtral(), shape)
    assert any("worst routing" in note for note in est.notes)
    assert est.to_dict()["notes"] == list(est.notes)


def test_unmodelled_variants_are_refused_clearly():
    full = tr.Gemma3Config(text_config=dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16))
    with pytest.raises(ValueError, match="text_config"):
        estimate(full, Shape(1, 8))
    assert estimate(full.text_config, Shape(1, 8)).model_type == "gemma3_text"
    with pytest.raises(ValueError, match="experts_implementation"):
        estimate(_mixtral(experts_implementation="eager"), Shape(1, 8))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        estimate(_mixtral(num_experts_per_tok=9), Shape(1, 8))


# -- against a real training step (torch) ----------------------------------------------------------


def _measure(config, shape, options, router_patch=None):
    pytest.importorskip("torch", reason="torch not installed: the CPU peak of a real training step is measured")
    from lengthscan.memory.cpu_peak import build_model, make_batch, measure_step

    model = build_model(config, options)
    if router_patch is not None:
        for module in model.modules():
            if type(module).__name__.endswith("TopKRouter"):
                router_patch(module)
    return measure_step(model, make_batch(config, shape, options), options).peak_bytes


@pytest.mark.parametrize("options", [MemoryOptions(), MemoryOptions(precision="bf16", gradient_checkpointing=True)],
                         ids=["fp32", "bf16-checkpointing"])
def test_gemma2_within_five_percent_of_the_measured_peak(options):
    config, shape = _gemma2(), Shape(2, 128)
    measured = _measure(config, shape, options)
    assert abs(estimate(config, shape, options).peak_bytes / measured - 1) <= 0.05


def test_moe_bound_holds_for_random_and_for_the_most_unbalanced_routing():
    import torch

    config, shape, options = _mixtral(vocab_size=500, num_local_experts=8, num_experts_per_tok=2), Shape(2, 256), \
        MemoryOptions()

    def all_on_the_first_experts(router):  # every token's top_k picks: experts 0 .. top_k - 1
        forward = router.forward

        def skewed(hidden_states):
            logits, scores, index = forward(hidden_states)
            return logits, scores, torch.arange(index.shape[1]).expand_as(index).contiguous()
        router.forward = skewed

    bound = estimate(config, shape, options).peak_bytes
    for patch in (None, all_on_the_first_experts):
        measured = _measure(config, shape, options, patch)
        assert measured <= bound * 1.001  # the bound holds (to the profiler's few bytes)
        assert bound / measured - 1 <= 0.05
