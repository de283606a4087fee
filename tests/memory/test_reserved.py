"""Reserved memory over many steps (``memory/reserved.py``): the memory model's allocations and frees
replayed in order through the caching allocator model. Modelled figures, checked for what follows
from the allocator's rules: a repeated shape allocates what the memory model predicts (blocks rounded
up), shapes that vary leave the reserve above what is allocated and expandable segments keep it close,
and a device too small runs out of memory at the first batch it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
import transformers as tr

from lengthscan.memory import MemoryOptions, Shape, estimate
from lengthscan.memory.alloc_conf import AllocatorConfig
from lengthscan.memory.objective import Objective
from lengthscan.memory.parallel import Parallel
from lengthscan.memory.reserved import CUBLAS_WORKSPACE, replay_steps

MiB = 1 << 20
CONFIG = tr.LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=704, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2)
OPTIONS = MemoryOptions(precision="bf16")


@pytest.mark.parametrize("config,options", [
    (CONFIG, OPTIONS),
    (tr.GPT2Config(vocab_size=8000, n_embd=256, n_layer=3, n_head=4), OPTIONS),  # a split's gradients freed as one
    (CONFIG, MemoryOptions(precision="bf16", parallel=Parallel(2, "ddp"))),  # the buckets held from the start
    (CONFIG, MemoryOptions(objective=Objective("dpo"))),  # a reference model held, its forward in the step
    (CONFIG, MemoryOptions(precision="bf16", parallel=Parallel(4, "fsdp"))),  # gathers, reduce buffers, shards
    (CONFIG, MemoryOptions(precision="bf16", parallel=Parallel(4, "fsdp", 1))),  # FSDP1's flat gradients
    (CONFIG, MemoryOptions(precision="bf16", parallel=Parallel(4, "zero3"))),  # the bucket, partitions
], ids=["llama", "gpt2-fused-qkv", "ddp", "dpo", "fsdp2", "fsdp1", "zero3"])
def test_a_repeated_shape_allocates_what_the_memory_model_predicts(config, options):
    shape = Shape(4, 512, padding=True)
    predicted = estimate(config, shape, options).peak_bytes
    replayed = replay_steps(config, [shape] * 3, options, AllocatorConfig())
    allocated = replayed["allocated_peak_bytes"] - CUBLAS_WORKSPACE
    assert predicted <= allocated <= predicted * 1.03  # blocks are rounded up, and some handed out whole
    assert replayed["reserved_peak_bytes"] >= replayed["allocated_peak_bytes"] and replayed["steps"] == 3
    assert replayed["out_of_memory"] is None and replayed["modelled"]


def test_varying_shapes_leave_the_reserve_above_the_allocation_and_expandable_segments_close_to_it():
    lengths = np.random.default_rng(0).integers(32, 1024, 60)
    shapes = [Shape(4, int(n), padding=True) for n in lengths]
    plain = replay_steps(CONFIG, shapes, OPTIONS, AllocatorConfig())
    expandable = replay_steps(CONFIG, shapes, OPTIONS, AllocatorConfig(expandable_segments=True))
    assert plain["overhead_bytes"] > 2 * expandable["overhead_bytes"]
    assert expandable["reserved_peak_bytes"] < plain["reserved_peak_bytes"]
    assert expandable["segments"] == 0 and plain["segments"] > 10


def test_a_device_too_small_runs_out_at_the_first_batch_it_cannot_serve():
    small, large = Shape(2, 64, padding=True), Shape(8, 2048, padding=True)
    room = replay_steps(CONFIG, [small] * 2, OPTIONS, AllocatorConfig())["reserved_peak_bytes"]
    order = [small, small, small, large, small]
    out = replay_steps(CONFIG, order, OPTIONS, AllocatorConfig(capacity=room + 40 * MiB))
    assert out["out_of_memory"]["step"] == 3 and out["steps"] == 3
    assert out["alloc_retries"] >= 1  # the cache was released and the segment tried again first
    assert replay_steps(CONFIG, order, OPTIONS, AllocatorConfig())["out_of_memory"] is None


def test_shape_mode_replays_three_steps_and_says_modelled(tmp_path, capsys):
    import json

    from lengthscan.cli.main import main

    CONFIG.save_pretrained(tmp_path)
    base = ["memory", "--model", str(tmp_path), "--batch-size", "2", "--input-len", "256"]
    assert main([*base, "--budget", "4GiB", "--alloc-conf", "expandable_segments:True", "--json"]) == 0
    al = json.loads(capsys.readouterr().out)["memory"]["allocator"]
    assert al["modelled"] and al["steps"] == 3 and al["alloc_conf"] == "expandable_segments:True"
    assert al["reserved_peak_bytes"] >= al["allocated_peak_bytes"] and al["segments"] == 0
    assert main([*base, "--alloc-conf", "garbage_collection_threshold:0.8"]) == 0
    captured = capsys.readouterr()
    assert "reserved (modelled, allocator garbage_collection_threshold:0.8)" in captured.out
    assert "acts only under a memory fraction" in captured.err
    assert main([*base, "--memory-fraction", "0.5"]) == 2  # a share of the device: --budget needed
