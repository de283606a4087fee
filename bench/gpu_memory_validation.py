"""The memory model against ``torch.cuda.max_memory_allocated`` on a GPU (the CPU bench's cases).

    python bench/gpu_memory_validation.py              # full fine-tuning grid and the issue-29 runs
    python bench/gpu_memory_validation.py --adapters   # only LoRA, QLoRA, LLM.int8 + LoRA, 8-bit optimizers
    python bench/gpu_memory_validation.py --epoch      # the caching allocator: an epoch's reserve (issue 35)

Runs ``bench/memory_validation.py --device cuda --workers 1`` (one process at a time: the device is
shared), which measures each phase of a steady-state step with ``torch.cuda.reset_peak_memory_stats``
and ``max_memory_allocated`` (no alignment: these are CUDA's kernels), and prints the same tables.
What the CPU cannot measure and this does: cuBLAS/cuDNN workspaces (outside ``max_memory_allocated``
anyway), bitsandbytes' fused CUDA kernels (4-bit matmul below 1,536 rows, LLM.int8's int8 matmul,
the 8-bit optimizer's in-place step), SDPA's flash and memory-efficient kernels. No GPU was lent to
the sessions that wrote it: docs/memory.md says which figures are CPU-only.

``--epoch`` runs ``bench/gpu_reserved_validation.py`` (its other flags passed on): an epoch of varying
batch shapes replayed on the GPU, per batch ``max_memory_allocated``, ``max_memory_reserved`` and
``memory_stats()``, with and without ``expandable_segments``, against the allocator model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--epoch" in argv:
        argv.remove("--epoch")
        return subprocess.run([sys.executable, str(HERE / "gpu_reserved_validation.py"), *argv], check=False).returncode
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: run bench/memory_validation.py for the CPU measurement", file=sys.stderr)
        return 2
    base = [sys.executable, str(HERE / "memory_validation.py"), "--device", "cuda", "--workers", "1"]
    runs = [argv] if "--adapters" in argv else [argv, [*argv, "--adapters"]]
    return max(subprocess.run([*base, *args], check=False).returncode for args in runs)


if __name__ == "__main__":
    sys.exit(main())
