"""Training on several devices: what each rank holds beyond a single device's step.

``ddp`` (``DistributedDataParallel``, as accelerate wraps the model for the Trainer): every rank holds
the whole model, its optimizer state and its own per-device batch, and the reducer's gradient
buckets: flat tensors as large as all the trained gradients together (``bucket_cap_mb`` only cuts
them into pieces), allocated when the model is wrapped and kept (accelerate leaves
``gradient_as_bucket_view=False``: the buckets are a second copy of the gradients). The ranks take
the epoch's per-device batches in turn (rank r the batches r, r + N, ...), so the worst per-rank
batch is the worst batch of the epoch. Measured on CPU with gloo in 2 processes
(``cpu_dist_peak.py``): the steady step allocates nothing more than one device's.

``fsdp`` (FULL_SHARD: ``reshard_after_forward=True``) and ``fsdp_shard_grad_op`` (``False``): FSDP2
(``fully_shard``, the Trainer's default since transformers 5) or, with ``fsdp_version=1``, FSDP1. Each
rank keeps a shard of the weights, the optimizer state and the gradients, and gathers one layer at a
time (``sharded.py``). ``fsdp2`` is ``fsdp`` with version 2.

``zero1``, ``zero2``, ``zero3``: DeepSpeed ZeRO, optionally with ``offload`` ``optimizer`` (any stage) or
``params`` (stage 3: the weights' partitions too) in CPU memory (``zero.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

FSDP = ("fsdp", "fsdp_shard_grad_op", "fsdp2")  # fsdp2: fsdp with fsdp_version 2
ZERO = ("zero1", "zero2", "zero3")
STRATEGIES = ("ddp", *FSDP, *ZERO)
OFFLOADS = ("optimizer", "params")


@dataclass(frozen=True)
class Parallel:
    """``devices`` ranks trained with ``strategy`` (one device: None)."""

    devices: int = 1
    strategy: str | None = None
    fsdp_version: int | None = None  # FSDP's fsdp_config["version"]: 2 (the Trainer's default) when None
    offload: str | None = None  # ZeRO's offload_optimizer / offload_param to the CPU

    def __post_init__(self):
        if self.fsdp_version is not None and self.strategy not in FSDP:
            raise ValueError("--fsdp-version is FSDP's: give it with --strategy fsdp or fsdp_shard_grad_op")
        if self.strategy == "fsdp2":
            if self.fsdp_version == 1:
                raise ValueError("--strategy fsdp2 is FSDP version 2: drop --fsdp-version 1, or say --strategy fsdp")
            object.__setattr__(self, "strategy", "fsdp")
        if self.strategy in FSDP and self.fsdp_version is None:
            object.__setattr__(self, "fsdp_version", 2)
        if self.fsdp_version not in (None, 1, 2):
            raise ValueError(f"--fsdp-version must be 1 or 2, not {self.fsdp_version}")
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError("--devices must be at least 1")
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if self.offload is not None:
            if self.offload not in OFFLOADS:
                raise ValueError(f"--offload must be one of {', '.join(OFFLOADS)}, not {self.offload!r}")
            if self.strategy not in ZERO:
                raise ValueError("--offload is priced for DeepSpeed ZeRO (--strategy zero1|zero2|zero3); FSDP's "
                                 "cpu_offload is not priced yet")
            if self.offload == "params" and self.strategy != "zero3":
                raise ValueError("--offload params needs --strategy zero3 (only stage 3 partitions the weights)")
        if self.devices > 1 and self.strategy is None:
            raise ValueError(f"--devices {self.devices}: name the --strategy ({', '.join(STRATEGIES)})")

    @property
    def fsdp(self) -> bool:
        return self.strategy in FSDP

    @property
    def label(self) -> str:
        """The strategy as the terminal names it (``fsdp (FSDP2)``, ``zero3 + offload params``)."""
        if self.fsdp:
            return f"{self.strategy} (FSDP{self.fsdp_version})"
        return self.strategy + (f" + offload {self.offload}" if self.offload else "")

    def note(self) -> str:
        """What each rank holds, in words (the memory estimate's notes)."""
        devices = f"{self.devices} device" + ("s" if self.devices > 1 else "")
        head = f"{self.label} on {devices}: the peak is each rank's, on its per-device batch; "
        if self.strategy == "ddp":
            return head + ("every rank holds the model, its optimizer state and the reducer's gradient buckets "
                           "(ddp_buckets: a second copy of the gradients)")
        if self.fsdp:
            gathered = "every layer stays gathered from its forward to its backward" \
                if self.strategy == "fsdp_shard_grad_op" else "one layer gathered at a time" + (
                    " (and the next one prefetched in backward)" if self.fsdp_version == 2 else "")
            units = "the embedding and head units as accelerate wraps them" if self.fsdp_version == 2 else \
                "the root unit (embeddings, head) gathered throughout"
            return head + (f"each rank keeps 1/{self.devices} of the weights, gradients and optimizer state "
                           f"(sharded_weights), {gathered}, {units} (fsdp_gathered, fsdp_gather_buffer, "
                           "fsdp_reduce_buffer)")
        kept = {"zero1": "the optimizer state", "zero2": "the optimizer state and the gradients",
                "zero3": "the optimizer state, the gradients and the weights"}[self.strategy]
        out = head + (f"DeepSpeed holds the model in the compute dtype without autocast; {kept} partitioned "
                      f"1/{self.devices} per rank (with bf16 or fp16, the fp32 master copy with them)")
        if self.offload:
            weights = " and the weights" if self.offload == "params" else ""
            out += f"; offloaded to CPU memory: the optimizer state{weights}"
        return out

    @property
    def zero(self) -> bool:
        return self.strategy in ZERO

    @property
    def sharded(self) -> bool:
        """FSDP or ZeRO: the step's state and buffers are ``sharded.Sharding``'s."""
        return self.fsdp or self.zero

    @property
    def active(self) -> bool:
        """A strategy is named (DDP allocates its buckets on one device too)."""
        return self.strategy is not None


def rank_terms(trained_params, parallel: Parallel) -> dict:
    """The per-rank terms DDP adds to one device's state (FSDP's are ``sharded.Sharding``'s)."""
    if parallel.strategy != "ddp":
        return {}
    return {"ddp_buckets": sum(p.nbytes for p in trained_params)}
