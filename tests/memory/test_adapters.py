"""The run people launch: LoRA/DoRA adapters (peft), 4-bit and LLM.int8 bases (bitsandbytes), bf16
weights and the Trainer's optimizers, against peft and bitsandbytes themselves (their parameter
counts, their optimizer state) and against the measured CPU peak of one training step."""

from __future__ import annotations

import json
import os
from importlib.util import find_spec

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers as tr

from lengthscan.cli.main import main
from lengthscan.memory import MemoryOptions, Shape, estimate
from lengthscan.memory.adapters import AdapterError, Lora, lora_from_dict, read_adapter_config
from lengthscan.memory.quant import Quantization, QuantizationError, read_quantization_config

#: peft and bitsandbytes take seconds to import: asked for here, imported by the tests that use them
#: (not by every worker's collection)
pytestmark = pytest.mark.skipif(any(find_spec(m) is None for m in ("torch", "peft", "bitsandbytes")),
                                reason="the adapter tests need torch, peft and bitsandbytes")


def _llama(**kw):
    base = dict(vocab_size=1000, hidden_size=256, intermediate_size=640, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)
    return tr.LlamaConfig(**(base | kw))


QV = ("q_proj", "v_proj")
ALL = ("all-linear",)
NF4 = Quantization("nf4", True, "bf16")
INT8 = Quantization("int8", compute_dtype=None)


def _measure(config, shape, options):
    from lengthscan.memory.cpu_peak import build_model, make_batch, measure_step

    model = build_model(config, options)
    return model, measure_step(model, make_batch(config, shape, options), options)


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _total(model) -> int:  # peft's count: a 4-bit weight holds two values a byte
    return sum(p.numel() * (2 if type(p).__name__ == "Params4bit" else 1) for p in model.parameters())


@pytest.mark.parametrize("lora", [
    Lora(r=8, alpha=16, targets=QV),
    Lora(r=4, alpha=8, targets=ALL, bias="all"),
    Lora(r=4, alpha=8, targets=("o_proj", "down_proj"), bias="lora_only", modules_to_save=("lm_head",)),
    Lora(r=4, alpha=8, targets=(r".*\.layers\.1\..*(q|k)_proj",), regex=True),
    Lora(r=4, alpha=8, targets=("q_proj", "v_proj"), layers_to_transform=(0,)),
    Lora(r=4, alpha=8, targets=ALL, use_dora=True),
], ids=["qv", "all-linear-bias-all", "lora-only-bias-saved-head", "regex", "layer-0", "dora"])
def test_parameter_counts_equal_peft(lora):
    config = _llama()
    options = MemoryOptions(precision="bf16", torch_dtype="bf16", adapter=lora)
    from lengthscan.memory.cpu_peak import build_model

    model = build_model(config, options)
    est = estimate(config, Shape(1, 16), options)
    assert est.trainable_params == _trainable(model)
    assert est.params == _total(model)


@pytest.mark.slow  # builds and steps a quantized model per case
@pytest.mark.parametrize("quant", [NF4, Quantization("fp4", False, "bf16"), INT8], ids=["nf4-dq", "fp4", "int8"])
def test_quantized_weights_are_the_bytes_bitsandbytes_stores(quant):
    config = _llama()
    options = MemoryOptions(precision="bf16", torch_dtype="bf16", adapter=Lora(r=8, alpha=16, targets=ALL),
                            quantization=quant)
    model, measured = _measure(config, Shape(2, 64), options)
    est = estimate(config, Shape(2, 64), options)
    assert est.params == _total(model)
    assert est.trainable_params == _trainable(model)
    before = sum(v for k, v in est.terms.items() if k in ("weights", "optimizer_state", "batch", "buffers"))
    assert abs(before - measured.live_before) <= 0.002 * measured.live_before  # weights, state, batch: exact


CASES = [  # (id, options, gradient checkpointing): measured steps, slow but one
    ("lora-bf16-qv", dict(adapter=Lora(r=8, alpha=16, targets=QV)), False),
    ("lora-bf16-all-dropout", dict(adapter=Lora(r=16, alpha=32, dropout=0.1, targets=ALL)), False),
    ("lora-bf16-all-ckpt", dict(adapter=Lora(r=16, alpha=32, targets=ALL)), True),
    ("qlora-nf4-all", dict(adapter=Lora(r=16, alpha=32, dropout=0.05, targets=ALL), quantization=NF4), False),
    ("qlora-nf4-qv-ckpt", dict(adapter=Lora(r=8, alpha=16, targets=QV), quantization=NF4), True),
    ("int8-lora-all", dict(adapter=Lora(r=8, alpha=16, dropout=0.05, targets=ALL), quantization=INT8), False),
    ("full-bf16-weights", {}, False),
    ("dora-bf16-all", dict(adapter=Lora(r=16, alpha=32, targets=ALL, use_dora=True)), False),
    ("dora-bf16-all-dropout-ckpt", dict(adapter=Lora(r=16, alpha=32, dropout=0.05, targets=ALL, use_dora=True)), True),
    # bf16 weights trained without autocast (bf16=False): the hidden states stay bf16, RoPE's cos/sin follow them
    ("lora-bf16-weights-no-autocast", dict(precision="fp32", adapter=Lora(r=16, alpha=32, dropout=0.05, targets=ALL)),
     False),
    ("full-bf16-weights-no-autocast", dict(precision="fp32"), False),
]


@pytest.mark.parametrize("options, checkpointing", [
    pytest.param(*c[1:], id=c[0], marks=pytest.mark.slow) for c in CASES])  # 8-17 s each
def test_peak_is_within_5_percent_of_the_measured_step(options, checkpointing):
    config = _llama()
    shape = Shape(2, 512, padding=True)
    opts = MemoryOptions(**({"precision": "bf16", "torch_dtype": "bf16", "gradient_checkpointing": checkpointing}
                            | options))
    _, measured = _measure(config, shape, opts)
    est = estimate(config, shape, opts)
    assert abs(est.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes, (est.peak_bytes, measured)


@pytest.mark.parametrize("optimizer", ["adamw_bnb_8bit", *(pytest.param(o, marks=pytest.mark.slow) for o in (
    "adamw_torch_fused", "paged_adamw_32bit", "adafactor", "sgd"))])
def test_optimizer_state_equals_what_the_optimizer_allocates(optimizer):
    import torch

    from lengthscan.memory.cpu_peak import _optimizer, make_batch

    config = _llama()
    options = MemoryOptions(torch_dtype="bf16", optimizer=optimizer)
    from lengthscan.memory.cpu_peak import build_model

    model = build_model(config, options)
    opt = _optimizer(model, options)
    model(**make_batch(config, Shape(1, 16), options)).loss.backward()
    opt.step()
    seen, state = set(), 0
    for per_param in opt.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                state += value.untyped_storage().nbytes()
    est = estimate(config, Shape(1, 16), options)
    shared = 2 * 256 * 4 if "8bit" in optimizer else 0  # bitsandbytes' two 256-entry quantization maps, shared
    assert est.terms.get("optimizer_state", 0) + shared == state


def test_optimizer_aliases_and_names():
    assert MemoryOptions(optimizer="adamw").optimizer == "adamw_torch_fused"
    assert MemoryOptions(optimizer="adamw_8bit").optimizer == "adamw_bnb_8bit"
    with pytest.raises(ValueError, match="optimizer must be one of"):
        MemoryOptions(optimizer="lion_8bit")


def test_configs_written_by_peft_and_transformers(tmp_path):
    import peft
    import torch

    peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                    modules_to_save=["lm_head"], task_type="CAUSAL_LM").save_pretrained(tmp_path / "lora")
    lora = read_adapter_config(str(tmp_path / "lora"))
    assert (lora.r, lora.alpha, lora.dropout, lora.targets, lora.modules_to_save) == \
        (16, 32.0, 0.05, ("q_proj", "v_proj"), ("lm_head",))
    bnb = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.bfloat16)
    (tmp_path / "q.json").write_text(json.dumps(bnb.to_dict()))
    assert read_quantization_config(str(tmp_path / "q.json")) == Quantization("nf4", True, "bf16",
                                                                             source=str(tmp_path / "q.json"))
    config = _llama()
    config.quantization_config = tr.BitsAndBytesConfig(load_in_8bit=True).to_dict()
    config.save_pretrained(tmp_path / "model")
    assert read_quantization_config(str(tmp_path / "model")).method == "int8"


def test_bad_adapter_and_quantization_configs_are_refused():
    with pytest.raises(AdapterError, match="peft_type IA3"):
        lora_from_dict({"peft_type": "IA3", "target_modules": ["k_proj"]})
    with pytest.raises(AdapterError, match="target_modules is not set"):
        lora_from_dict({"peft_type": "LORA", "r": 8})
    with pytest.raises(AdapterError, match="match no linear layer"):
        estimate(_llama(), Shape(1, 8), MemoryOptions(adapter=Lora(targets=("qproj",))))
    with pytest.raises(ValueError, match="trains only through adapters"):
        MemoryOptions(quantization=NF4)
    from lengthscan.memory.quant import quantization_from_dict

    with pytest.raises(QuantizationError, match="quant_method 'gptq'"):
        quantization_from_dict({"quant_method": "gptq", "bits": 4})
    with pytest.raises(QuantizationError, match="exactly one"):
        quantization_from_dict({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True})


def test_cli_exit_codes(tmp_path, capsys):
    _llama().save_pretrained(tmp_path / "llama")
    (tmp_path / "gptq.json").write_text(json.dumps({"quant_method": "gptq", "bits": 4}))
    (tmp_path / "ia3.json").write_text(json.dumps({"peft_type": "IA3", "target_modules": ["k_proj"]}))
    base = ["memory", "--model", str(tmp_path / "llama"), "--batch-size", "2", "--input-len", "64"]
    assert main([*base, "--lora-r", "8", "--quantization-config", str(tmp_path / "gptq.json")]) == 2
    assert main([*base, "--adapter-config", str(tmp_path / "ia3.json")]) == 2
    assert main([*base, "--lora-r", "8", "--lora-targets", "q_projj"]) == 2
    assert main([*base, "--lora-targets", "q_proj"]) == 2
    err = capsys.readouterr().err
    assert "gptq" in err and "IA3" in err and "q_proj, up_proj" in err and "need --lora-r" in err
    assert main([*base, "--precision", "bf16", "--torch-dtype", "bf16", "--lora-r", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["memory"]
    assert data["run"]["adapted_modules"] == 14 and data["run"]["torch_dtype"] == "bf16"
    assert data["trainable_params"] < data["params"] / 10


def test_over_budget_names_the_cheapest_change_that_fits(tmp_path, capsys):
    from lengthscan.memory.alternatives import alternatives

    config = _llama()
    shape = Shape(8, 1024, padding=True)
    options = MemoryOptions(precision="bf16")
    peak = estimate(config, shape, options).peak_bytes
    found = alternatives(config, shape, options, int(peak * 0.9))
    priced = {r["change"]: r["peak_bytes"] for r in found["options"]}
    assert priced["gradient checkpointing"] == estimate(
        config, shape, MemoryOptions(precision="bf16", gradient_checkpointing=True)).peak_bytes
    assert priced["gradient checkpointing"] < peak and priced["bf16 weights"] < peak
    assert found["cheapest"] == next(r["change"] for r in found["options"] if r["fits"])
    config.save_pretrained(tmp_path / "llama")
    budget = str(int(peak * 0.95))  # fits nothing as is (10% margin)
    argv = ["memory", "--model", str(tmp_path / "llama"), "--batch-size", "8", "--input-len", "1024",
            "--precision", "bf16", "--budget", budget]
    assert main(argv) == 1
    assert "cheapest change that fits: " in capsys.readouterr().out
    assert main([*argv, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)["memory"]
    assert data["alternatives"]["cheapest"] and data["alternatives"]["usable_bytes"] == int(int(budget) * 0.9)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [None, Lora(r=16, alpha=32, dropout=0.05, targets=ALL, task_type="SEQ_2_SEQ_LM")],
                         ids=["full", "lora-all-linear"])
def test_t5_on_bf16_weights_without_autocast(adapter):
    """T5's SDPA math path returns its input's dtype and its cross-attention bias is the query's: bf16 weights
    trained with bf16=False stay bf16 (the model had them in fp32 from the first attention on: 40% over)."""
    config = tr.T5Config(decoder_start_token_id=0, vocab_size=3000, d_model=256, d_kv=64, d_ff=512, num_layers=2,
                         num_heads=4)
    shape = Shape(2, 384, 96)
    opts = MemoryOptions(precision="fp32", torch_dtype="bf16", adapter=adapter)
    _, measured = _measure(config, shape, opts)
    est = estimate(config, shape, opts)
    assert abs(est.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes, (est.peak_bytes, measured)


def test_adapters_reaching_moe_experts_are_refused_and_attention_adapters_counted_as_peft(tmp_path, capsys):
    """peft 0.21's all-linear wraps a Mixtral layer's 3-D experts and router (ParamWrapper): not modelled, so exit 2
    naming the fix; LoRA on the attention trains what peft trains."""
    from peft import LoraConfig, get_peft_model

    from lengthscan.cli.main import main

    config = tr.MixtralConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    qv = Lora(r=4, alpha=8, targets=QV)
    peft_model = get_peft_model(tr.MixtralForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=list(QV)))
    est = estimate(config, Shape(2, 64), MemoryOptions(precision="bf16", torch_dtype="bf16", adapter=qv))
    assert est.trainable_params == _trainable(peft_model)
    config.save_pretrained(tmp_path / "mixtral")
    assert main(["memory", "--model", str(tmp_path / "mixtral"), "--batch-size", "2", "--input-len", "64",
                 "--lora-r", "8", "--lora-targets", "all-linear"]) == 2
    err = capsys.readouterr().err
    assert "MoE experts" in err and "--lora-targets q_proj" in err and len(err.strip().splitlines()) == 1
