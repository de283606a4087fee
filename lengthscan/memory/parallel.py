"""Training on several devices: what each rank holds beyond a single device's step.

``ddp`` (``DistributedDataParallel``, as accelerate wraps the model for the Trainer): every rank holds
the whole model, its optimizer state and its own per-device batch, and the reducer's gradient
buckets: flat tensors as large as all the trained gradients together (``bucket_cap_mb`` only cuts
them into pieces), allocated when the model is wrapped and kept (accelerate leaves
``gradient_as_bucket_view=False``: the buckets are a second copy of the gradients). The ranks take
the epoch's per-device batches in turn (rank r the batches r, r + N, ...), so the worst per-rank
batch is the worst batch of the epoch. Measured on CPU with gloo in 2 processes
(``cpu_dist_peak.py``): the steady step allocates nothing more than one device's.

``fsdp`` (FSDP1 FULL_SHARD), ``fsdp_shard_grad_op`` (FSDP1 SHARD_GRAD_OP) and ``fsdp2`` (``fully_shard``,
the Trainer's default FSDP since transformers 5): each rank keeps a shard of the weights, the optimizer
state and the gradients, and gathers one layer at a time (``sharded.py``).

Not priced yet (``ValueError``): DeepSpeed ZeRO 1/2/3.
"""

from __future__ import annotations

from dataclasses import dataclass

FSDP = ("fsdp", "fsdp_shard_grad_op", "fsdp2")  # fsdp2: fsdp with fsdp_version 2
STRATEGIES = ("ddp", *FSDP)
LATER = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Parallel:
    """``devices`` ranks trained with ``strategy`` (one device: None)."""

    devices: int = 1
    strategy: str | None = None
    fsdp_version: int = 2  # the Trainer's default (fsdp_config["version"]); --strategy fsdp2 says it too

    def __post_init__(self):
        if self.strategy == "fsdp2":
            object.__setattr__(self, "strategy", "fsdp")
            object.__setattr__(self, "fsdp_version", 2)
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"--fsdp-version must be 1 or 2, not {self.fsdp_version}")
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError("--devices must be at least 1")
        if self.strategy in LATER:
            raise ValueError(f"--strategy {self.strategy} is not priced yet ({', '.join(STRATEGIES)} are): "
                             "DeepSpeed's per-rank buffers are the next step of lengthscan's memory model")
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES + LATER)}, not {self.strategy!r}")
        if self.devices > 1 and self.strategy is None:
            raise ValueError(f"--devices {self.devices}: name the --strategy ({', '.join(STRATEGIES)})")

    @property
    def fsdp(self) -> bool:
        return self.strategy in FSDP

    @property
    def active(self) -> bool:
        """A strategy is named (DDP allocates its buckets on one device too)."""
        return self.strategy is not None


def rank_terms(trained_params, parallel: Parallel) -> dict:
    """The per-rank terms DDP adds to one device's state (FSDP's are ``sharded.Sharding``'s)."""
    if parallel.strategy != "ddp":
        return {}
    return {"ddp_buckets": sum(p.nbytes for p in trained_params)}
