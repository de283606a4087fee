"""``lengthscan memory --packing``: packed batches priced as the trainers build them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthscan.memory.api import estimate
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.packed import packed_batches, price_packed
from lengthscan.pack.others import pack_knapsack
from lengthscan.pack.trl import pack_trl

pytestmark = pytest.mark.slow  # a training step measured on CPU and a memory command


@pytest.fixture(scope="module")
def config():
    from transformers import GPT2Config

    return GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=4096)


def test_a_padding_free_batch_is_one_row_of_its_packs_tokens(config):
    lengths = np.random.default_rng(0).integers(1, 300, 500)
    packs = pack_trl(lengths, 256, "bfd")
    members, shapes = packed_batches(packs, "bfd", 4, seed=42)
    sizes = packs.pack_lengths()
    assert [int(sizes[m].sum()) for m in members] == shapes[:, 1].tolist() and set(shapes[:, 0]) == {1}
    for attention, masked in (("sdpa", True), ("flash", False)):
        options = MemoryOptions(attention=attention)
        out = price_packed(config, packs, "bfd", 4, options=options)
        worst = out["worst_batch"]
        assert worst["shape"] == {"batch_size": 1, "input_len": int(shapes[:, 1].max()), "target_len": None,
                                  "padding": masked}
        assert worst["peak_bytes"] == estimate(config, Shape(1, int(shapes[:, 1].max()), None, masked),
                                               options).peak_bytes
        flat = [r for p in worst["rows"] for r in p]
        assert sum(min(int(lengths[r]), 256) for r in flat) == worst["shape"]["input_len"]


def test_knapsack_batches_are_padded_to_the_cutoff(config):
    # LLaMA-Factory packs cutoff_len - 1 tokens (its DataArguments lower it by one) and pads to cutoff_len
    packs = pack_knapsack(np.random.default_rng(1).integers(1, 100, 300), 128)
    assert packs.max_length == 127 and packs.pack_lengths().max() <= 127
    out = price_packed(config, packs, "knapsack", 8)
    assert out["worst_batch"]["shape"] == {"batch_size": 8, "input_len": 128, "target_len": None, "padding": False}


def test_the_memory_command_prices_packed_batches(tmp_path, bpe_dir, corpus_jsonl):
    from lengthscan.cli.main import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                  "vocab_size": 1000, "n_positions": 1024}))
    out = tmp_path / "m"
    assert main(["memory", str(corpus_jsonl), "--model", str(config), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--batch-size", "4", "--packing", "bfd", "--max-length", "128", "--budget", "8GiB",
                 "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    packed = report["memory"]["packing"]
    assert packed["flattened"] and packed["fits"] is True and packed["worst_batch"]["shape"]["batch_size"] == 1
    assert report["packing"]["splits"][0]["packs"] > 0 and (out / "packs.parquet").exists()


def test_a_packed_batch_is_predicted_as_measured_on_cpu():
    """TRL's padding-free collation of the worst bfd batch, one steady-state step measured on CPU."""
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from transformers import LlamaConfig
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_peak import measure_step

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=1000, max_position_embeddings=4096)
    rng = np.random.default_rng(3)
    packs = pack_trl(rng.integers(20, 300, 120), 384, "bfd")
    options = MemoryOptions(attention="sdpa")
    predicted = price_packed(config, packs, "bfd", 4, options=options)["worst_batch"]
    members, _ = packed_batches(packs, "bfd", 4)
    o = packs.offsets
    examples = [{"input_ids": rng.integers(4, 1000, int(packs.seq_lengths[o[p]:o[p + 1]].sum())).tolist(),
                 "seq_lengths": packs.seq_lengths[o[p]:o[p + 1]].tolist()} for p in members[predicted["index"]]]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    assert batch["input_ids"].shape == (1, predicted["shape"]["input_len"])
    measured = measure_step(build_model(config, options), {k: batch[k] for k in ("input_ids", "labels",
                                                                                  "position_ids")}, options)
    assert abs(predicted["peak_bytes"] / measured.peak_bytes - 1) < 0.01
