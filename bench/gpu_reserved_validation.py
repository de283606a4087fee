"""The caching allocator model against a GPU's own reserve, over an epoch of varying batch shapes.

    python bench/gpu_reserved_validation.py                    # on a CUDA device: measure and compare
    python bench/gpu_reserved_validation.py --predict-only     # anywhere: the modelled figures alone
    python bench/gpu_reserved_validation.py --steps 200 --batch-size 8 --max-len 2048

A random-initialised Llama (no download) trains on an epoch of batches whose padded lengths are drawn
from a long-tailed distribution (seeded), in their order: forward under bf16 autocast, backward, the
fused AdamW step, ``zero_grad(set_to_none=True)``. Each allocator configuration runs in its own
process (``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA starts): per batch it records
``max_memory_allocated``, ``max_memory_reserved`` and ``memory_stats()``'s segment count; the same
shapes go through ``lengthscan.memory.reserved.replay_steps``. The table (measured vs modelled,
reserved and allocated peaks, and the batch where the reserve stops growing) goes to
``bench/results-gpu-reserved.md`` and is what docs/memory.md cites before it calls the figures more
than modelled. No GPU was lent to the session that wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFS = ("", "expandable_segments:True", "max_split_size_mb:128")
MiB = 1 << 20


def config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                       num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)


def shapes(steps: int, batch: int, max_len: int, seed: int = 0) -> list:
    import numpy as np

    from lengthscan.memory.options import Shape

    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(6.0, 0.7, steps).astype(int) + 16, max_len)
    return [Shape(batch, int(n), padding=True) for n in lengths]


def measure(conf: str, order: list) -> dict:
    """The epoch on the GPU, in this process (``PYTORCH_CUDA_ALLOC_CONF`` set by the caller)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    rows = []
    for shape in order:
        ids = torch.randint(4, 32000, (shape.batch_size, shape.input_len), device="cuda")
        mask = torch.ones_like(ids)
        mask[-1, shape.input_len // 2:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        del loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        rows.append({"allocated_peak": torch.cuda.max_memory_allocated(), "reserved_peak":
                     torch.cuda.max_memory_reserved(), "segments": stats.get("segment.all.current", 0)})
    return {"conf": conf, "rows": rows}


def predict(conf: str, order: list, device_memory: int | None) -> dict:
    """The allocator model on the same shapes (the device's memory less the CUDA context as its capacity)."""
    from lengthscan.memory import MemoryOptions
    from lengthscan.memory.alloc_conf import AllocatorConfig
    from lengthscan.memory.reserved import CUDA_CONTEXT, replay_steps

    capacity = None if device_memory is None else device_memory - CUDA_CONTEXT
    return replay_steps(config(), order, MemoryOptions(precision="bf16"),
                        AllocatorConfig.parse(conf, total=device_memory, capacity=capacity),
                        max_steps=len(order), max_events=10**9)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--predict-only", action="store_true", help="the modelled figures alone (no GPU needed)")
    p.add_argument("--device-gib", type=float, default=80.0,
                   help="--predict-only: the device's memory (default 80, an H100): the allocator releases its "
                        "cache and retries only against a limit")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results-gpu-reserved.md")
    args = p.parse_args(argv)
    order = shapes(args.steps, args.batch_size, args.max_len)
    if args.worker is not None:
        print(json.dumps(measure(args.worker, order)))
        return 0
    lines = [f"# The allocator model against the GPU: {args.steps} batches of {args.batch_size}, lengths up to "
             f"{args.max_len} (Llama 8 x 1024, bf16 autocast, fused AdamW)", "",
             "| PYTORCH_CUDA_ALLOC_CONF | modelled reserved MiB | measured reserved MiB | modelled allocated MiB | "
             "measured allocated MiB |", "|---|---:|---:|---:|---:|"]
    device_memory = int(args.device_gib * 2**30)
    if not args.predict_only:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: use --predict-only", file=sys.stderr)
            return 2
        device_memory = torch.cuda.get_device_properties(0).total_memory
    for conf in CONFS:
        model = predict(conf, order, device_memory)
        measured = {"reserved": None, "allocated": None}
        if not args.predict_only:
            out = subprocess.run([sys.executable, __file__, "--worker", conf, "--steps", str(args.steps),
                                  "--batch-size", str(args.batch_size), "--max-len", str(args.max_len)],
                                 capture_output=True, text=True, env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf})
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
            measured = {"reserved": rows[-1]["reserved_peak"], "allocated": rows[-1]["allocated_peak"]}

        def mib(v):
            return "-" if v is None else f"{v / MiB:,.1f}"

        lines.append(f"| {conf or 'default'} | {mib(model['reserved_peak_bytes'])} | {mib(measured['reserved'])} | "
                     f"{mib(model['allocated_peak_bytes'])} | {mib(measured['allocated'])} |")
        print(lines[-1], flush=True)
    if not args.predict_only:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
