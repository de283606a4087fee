"""Packed batches: the memory model's prediction against the measured CPU peak of one training step.

    python bench/packed_memory_validation.py

A corpus of long-tailed lengths is packed (TRL bfd at 512, wrapped at 512, LLaMA-Factory knapsack
at 512); the worst batch of 4 packs is collated as the trainer collates it (TRL's
``DataCollatorForLanguageModeling(padding_free=True)`` for bfd: one row with ``position_ids``; the
usual padding for wrapped; knapsack's rows padded to ``cutoff_len + 1``) and one steady-state step
of a random-initialised model is measured (``lengthscan.memory.cpu_peak``). Prints predicted,
measured and the error per case. Needs torch and trl.
"""

from __future__ import annotations

import numpy as np


def main() -> None:
    import torch
    from transformers import GPT2Config, LlamaConfig
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from lengthscan.memory.api import estimate
    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_peak import measure_step
    from lengthscan.memory.options import MemoryOptions
    from lengthscan.memory.packed import packed_batches, price_packed
    from lengthscan.pack.others import pack_knapsack
    from lengthscan.pack.trl import pack_trl

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 400, 200)
    configs = {
        "llama": LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=2000, max_position_embeddings=4096),
        "gpt2": GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=2000, n_positions=4096),
    }
    print(f"{'model':6} {'strategy':9} {'attention':9} {'shape':>12} {'predicted':>12} {'measured':>12} {'error':>8}")
    for name, config in configs.items():
        for strategy in ("bfd", "wrapped", "knapsack"):
            packs = pack_knapsack(lengths, 512) if strategy == "knapsack" else pack_trl(lengths, 512, strategy)
            for attention in ("sdpa", "eager"):
                options = MemoryOptions(attention=attention)
                predicted = price_packed(config, packs, strategy, 4, options=options)
                worst = predicted["worst_batch"]
                members, _ = packed_batches(packs, strategy, 4)
                batch = _collate(packs, members[worst["index"]], strategy, rng, DataCollatorForLanguageModeling)
                measured = measure_step(build_model(config, options), batch, options)
                shape = f"{worst['shape']['batch_size']}x{worst['shape']['input_len']}"
                check = estimate(config, _shape(worst["shape"]), options).peak_bytes
                assert check == worst["peak_bytes"]
                error = worst["peak_bytes"] / measured.peak_bytes - 1
                print(f"{name:6} {strategy:9} {attention:9} {shape:>12} {worst['peak_bytes']:12,} "
                      f"{measured.peak_bytes:12,} {error:+8.2%}")


def _shape(d):
    from lengthscan.memory.options import Shape

    return Shape(**d)


def _collate(packs, members, strategy, rng, collator_class):
    import torch

    o = packs.offsets
    if strategy == "bfd":
        examples = [{"input_ids": rng.integers(4, 2000, int(packs.seq_lengths[o[p]:o[p + 1]].sum())).tolist(),
                     "seq_lengths": packs.seq_lengths[o[p]:o[p + 1]].tolist()} for p in members]
        batch = collator_class(pad_token_id=0, padding_free=True)(examples)
        return {k: v for k, v in batch.items() if k in ("input_ids", "labels", "position_ids")}
    sizes = packs.pack_lengths()[members]
    width = packs.max_length + 1 if strategy == "knapsack" else int(sizes.max())
    ids = torch.zeros((len(members), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(sizes):
        ids[i, :n] = torch.from_numpy(rng.integers(4, 2000, int(n)))
        mask[i, :n] = 1
    if strategy == "knapsack":  # LLaMA-Factory: pads unmasked (ones) without neat_packing
        mask[:] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


if __name__ == "__main__":
    main()
