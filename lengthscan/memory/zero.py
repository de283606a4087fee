"""DeepSpeed ZeRO on N ranks, as the Trainer runs it: what each rank keeps, and what stage 3 gathers.

With ``bf16=True`` (or fp16) DeepSpeed holds the model in that dtype and trains it without autocast;
its optimizer keeps an fp32 master copy. Per trained parameter, a rank holds (DeepSpeed
``runtime/zero/stage_1_and_2.py`` and ``stage3.py``):

- ``zero1``: the 16-bit weights (2 bytes), their 16-bit gradients until the step (2), and 1/N of the
  fp32 master copy (4) and of Adam's two moments (8);
- ``zero2``: the gradients are reduced as backward produces them, through a bucket of
  ``reduce_bucket_size`` elements (the Trainer's ``"auto"``: hidden_size squared), into the rank's 16-bit
  partition (2/N);
- ``zero3``: the weights are partitioned too (2/N); each layer is gathered for its forward and again for
  its backward, the next one prefetched, and freed after;
- at the step the 16-bit gradient partition becomes an fp32 one (4/N) for the master copy.
- ``--offload optimizer`` keeps the master copy, Adam's moments and the fp32 gradients in CPU memory
  (``DeepSpeedCPUAdam``), ``--offload params`` (zero3) the weights' partitions too.

DeepSpeed's own estimators count model states only: ``estimate_zero2_model_states_mem_needs`` is
``2P + 18P/N`` bytes (16-bit weights, then 2 + 4 + 4 + 8 bytes a parameter per rank), which lengthscan's
zero2 step adds up to exactly; ``estimate_zero3_model_states_mem_needs`` is ``4 x largest_layer_params +
18P/N``, where lengthscan's zero3 step holds ``20P/N`` (the estimator leaves out stage 3's 16-bit gradient
partition, ``grad_partitions_flat_buffer``) and gathers the largest layer in forward and backward, not at
the step. lengthscan adds the activations, the reduce bucket and the gathered layers.
"""

from __future__ import annotations

from types import SimpleNamespace

from lengthscan.memory import optimizers
from lengthscan.memory.sharded import ROOT, Sharding

DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size when nothing sets it


class Zero(Sharding):
    """ZeRO's per-rank state and, for stage 3, its per-layer gathers (the units FSDP2's layout finds)."""

    def __init__(self, tr, parallel, options, hidden: int | None = None):
        super().__init__(tr, parallel, options)  # FSDP2's unit layout (ZeRO has no --fsdp-version)
        self.stage = int(parallel.strategy[-1])
        self.offload = parallel.offload
        self.version = 3  # no gather buffer kept, no tail or root left gathered
        self.mixed = options.precision != "fp32"  # (self.compute, Sharding's, is the 16-bit dtype then)
        for unit in self.units.values():
            unit.reshard = self.stage == 3
        trained = sum(u.trained for u in self.units.values())
        elements = (hidden * hidden) if hidden else DEFAULT_BUCKET  # the Trainer's "auto"
        self.bucket = min(elements, trained) * self.compute if self.stage >= 2 else 0

    def state(self, optimizer: str) -> dict:
        n = self.world
        every = sum(u.numel for u in self.units.values())
        terms = {}
        if self.stage < 3:
            terms["weights"] = every * self.compute
        elif self.offload != "params":
            terms["sharded_weights"] = -(-every * self.compute // n)
        if self.offload is None:
            master = sum(-(-u.trained // n) for u in self.units.values()) * 4 if self.mixed else 0
            terms["optimizer_state"] = master + optimizers.state_bytes(optimizer, self._fp32_shards())
        return terms

    def optimizer_temporaries(self, optimizer: str) -> int:
        if self.offload is not None:
            return 0  # DeepSpeedCPUAdam steps in CPU memory
        shards = self._fp32_shards()
        fp32_grads = sum(s.numel for s in shards) * 4 if self.mixed else 0
        flat = sum(s.numel for s in shards) * self.compute if self.stage == 1 else 0  # the partition flattened
        return fp32_grads + flat + optimizers.temporaries(optimizer, shards)

    def state_blocks(self, optimizer: str) -> tuple[list, list]:
        """The persistent allocations: the 16-bit weights (stage 3: each unit's partition), and DeepSpeed's
        flat fp32 partitions (master copy, Adam's moments) when the optimizer stays on the device."""
        terms = self.state(optimizer)
        if self.stage < 3:
            state = [u.numel * self.compute for u in self.units.values() if u.numel]
        else:
            state = [-(-u.numel * self.compute // self.world) for u in self.units.values()
                     if u.numel and self.offload != "params"]
        opt = []
        if terms.get("optimizer_state"):
            trained = sum(s.numel for s in self._fp32_shards()) * 4
            opt = [trained] * (3 if self.mixed else 2)
        return state, opt

    def _fp32_shards(self) -> list:
        return [SimpleNamespace(numel=-(-u.trained // self.world), dtype="f32", shape=None)
                for u in self.units.values() if u.trained]

    # -- the replay's hooks -----------------------------------------------------------------------

    def _gather(self, live, unit, keep_output: bool = False) -> None:
        if self.stage < 3 or unit in self.gathered or unit not in self.units:
            return
        self.prefetched.discard(unit)
        self.gathered.add(unit)
        live.add("zero3_gathered", self.full(unit))

    def _prefetch(self, live, unit) -> None:
        self._gather(live, unit)

    def _free(self, live, unit) -> None:
        if unit in self.gathered:
            self.gathered.discard(unit)
            live.add("zero3_gathered", -self.full(unit))

    def forward_enter(self, live, layer) -> None:
        super().forward_enter(live, layer)
        if self.stage == 3 and layer in self.layers:  # the prefetch of the next layer
            i = self.layers.index(layer)
            if i + 1 < len(self.layers):
                self._gather(live, self.layers[i + 1])

    def forward_end(self, live) -> None:
        for unit in list(self.gathered):
            if unit != ROOT:
                self._free(live, unit)

    def backward_begin(self, live) -> None:
        live.add("zero_reduce_bucket", self.bucket)
        super().backward_begin(live)

    def backward_leave(self, live, layer) -> None:
        """A layer's gradients, reduced through the bucket into the rank's partition (stage 2 and 3)."""
        if layer in self.done or layer not in self.units:
            return
        self.done.add(layer)
        if self.stage >= 2:
            computed = self.units[layer].trained * self.compute
            if self.offload is None:  # offloading copies the partition to the CPU's fp32 gradients
                live.add("gradients", -(-computed // self.world))
            self._drop_gradients(live, layer)
        if self.units[layer].reshard:
            self._free(live, layer)

    def end(self, live) -> None:
        for unit in list(self.units):
            self.backward_leave(live, unit)
        for unit in list(self.gathered):
            self._free(live, unit)
        live.add("zero_reduce_bucket", -self.bucket)
