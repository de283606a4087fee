"""Training on several devices: what each rank holds beyond a single device's step.

``ddp`` (``DistributedDataParallel``, as accelerate wraps the model for the Trainer): every rank holds
the whole model, its optimizer state and its own per-device batch, and the reducer's gradient
buckets: flat tensors as large as all the trained gradients together (``bucket_cap_mb`` only cuts
them into pieces), allocated when the model is wrapped and kept (accelerate leaves
``gradient_as_bucket_view=False``: the buckets are a second copy of the gradients). The ranks take
the epoch's per-device batches in turn (rank r the batches r, r + N, ...), so the worst per-rank
batch is the worst batch of the epoch. Measured on CPU with gloo in 2 processes
(``cpu_dist_peak.py``): the steady step allocates nothing more than one device's.

Not priced yet (``ValueError``): FSDP (full or gradient-op sharding, FSDP2) and DeepSpeed ZeRO 1/2/3.
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("ddp",)
LATER = ("fsdp", "fsdp_shard_grad_op", "fsdp2", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Parallel:
    """``devices`` ranks trained with ``strategy`` (one device: None)."""

    devices: int = 1
    strategy: str | None = None

    def __post_init__(self):
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError("--devices must be at least 1")
        if self.strategy in LATER:
            raise ValueError(f"--strategy {self.strategy} is not priced yet (only ddp): the sharded strategies' "
                             "per-rank buffers are the next step of lengthscan's memory model")
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES + LATER)}, not {self.strategy!r}")
        if self.devices > 1 and self.strategy is None:
            raise ValueError(f"--devices {self.devices}: name the --strategy (ddp)")

    @property
    def active(self) -> bool:
        """A strategy is named (DDP allocates its buckets on one device too)."""
        return self.strategy is not None


def rank_terms(trained_params, parallel: Parallel) -> dict:
    """The per-rank terms a strategy adds to one device's state."""
    if not parallel.active:
        return {}
    return {"ddp_buckets": sum(p.nbytes for p in trained_params)}
