"""Reserved memory over many steps: each step's allocations and frees, in the order the memory model
replays them (``timeline.replay``'s log), through the caching allocator model (``allocator.py``).
**Modelled**: no GPU has confirmed these figures yet (``bench/gpu_memory_validation.py`` is prepared).

Before the first step the weights and buffers are allocated, then cuBLAS's workspace (at the first
matmul); each step allocates its batch, replays its allocations and frees (the optimizer's state is
allocated at the first optimizer step, into whatever the first step left cached), frees what is left
of its activations when the optimizer step begins, its gradients at ``zero_grad(set_to_none=True)``
and its batch. The CUDA context is outside the allocator: it lowers what ``cudaMalloc`` can take.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lengthscan.memory.alloc_conf import AllocatorConfig, MiB
from lengthscan.memory.allocator import AllocatorOOM, CachingAllocator
from lengthscan.memory.options import MemoryOptions, Shape

#: the CUDA context (driver, kernels' images): 300 MB to 1 GB by GPU, CUDA version and loaded libraries
#: (PyTorch's "CUDA semantics" notes); outside the caching allocator, in nvidia-smi's figure only
CUDA_CONTEXT = 512 * MiB
#: cuBLAS's workspace, allocated through the caching allocator on the first matmul: ``:4096:8``
#: (8 x 4 MiB), the default on Hopper (``CUBLAS_WORKSPACE_CONFIG``; ``:4096:2:16:8`` before it)
CUBLAS_WORKSPACE = 32 * MiB
#: steps replayed at most (in the epoch's order), and allocations and frees at most over them (the
#: replay runs about 150,000 a second): enough for the reserve to settle on the epoch's shapes
MAX_STEPS, MAX_EVENTS = 2000, 600_000


@dataclass(frozen=True)
class StepAllocations:
    """One step's allocations: ``state`` once before training, ``optimizer`` at the first optimizer step,
    ``batch`` around each step, ``events`` (term, +bytes | -bytes; a phase's start as (phase, 0))."""

    state: tuple
    optimizer: tuple
    batch: tuple
    events: tuple


def step_allocations(config, shape: Shape, options: MemoryOptions) -> StepAllocations:
    """The allocations of one step of ``shape`` (the memory model's replay, logged)."""
    from lengthscan.memory import optimizers
    from lengthscan.memory.model import phases, sharding

    log: list = []
    if options.objective.name == "trainer":
        tr, base, _ = phases(config, shape, options, log=log)
    else:
        from lengthscan.memory.preference import phases as objective_phases

        tr, base, _ = objective_phases(config, shape, options, log=log)
    params = list({id(p): p for p in tr.tape.params.values()}.values())
    sharded = sharding(tr, options)
    state = [p.nbytes for p in params if p.nbytes] if sharded is None else sharded.state_blocks(options.optimizer)[0]
    state += [s.nbytes for s in tr.tape.storages if s.held and s.kind == "buffers"]
    if base.get("gradients"):  # accumulation: the gradients live from step to step
        state += [p.nbytes for p in tr.trained_params]
    held = ("weights", "sharded_weights", "optimizer_state", "batch", "buffers", "gradients")
    state += [v for k, v in base.items() if k not in held and v]  # a reference model, DDP's buckets ...
    moments = 2 if options.optimizer.startswith(("adamw", "paged_adamw")) else 1
    optimizer = []
    for p in tr.trained_params if sharded is None else ():
        total = optimizers.state_bytes(options.optimizer, [p])
        optimizer += [total // moments] * moments if total else []
    if sharded is not None:
        optimizer = sharded.state_blocks(options.optimizer)[1]
    batch = tuple(s.nbytes for s in tr.tape.storages if s.held and s.kind == "batch")
    return StepAllocations(tuple(state), tuple(optimizer), batch, tuple(log))


def replay_steps(config, shapes: list[Shape], options: MemoryOptions, alloc: AllocatorConfig,
                 max_steps: int = MAX_STEPS, max_events: int = MAX_EVENTS, *, worst: Shape | None = None,
                 memo: dict | None = None) -> dict:
    """The allocator's figures over ``shapes`` in order (the first ``max_steps``, and no more than
    ``max_events`` allocations and frees; ``worst`` then replayed last when the prefix left it out):
    its reserved and allocated peaks, the fragmentation at the reserved peak, the step at which it
    runs out of memory. ``memo``: steps already traced (shape -> ``StepAllocations``), shared."""
    a = CachingAllocator(alloc)
    memo = {} if memo is None else memo
    reserved_after: list[int] = []
    oom = None
    started, events, order = False, 0, list(shapes[:max_steps])
    cut = last = False  # the events' cap reached; the worst batch replayed in place of the rest
    try:
        for k, shape in enumerate(order):
            step = memo.get(shape) or memo.setdefault(shape, step_allocations(config, shape, options))
            events += len(step.events)
            if started and events > max_events and not cut:
                cut = True
                if worst is None or worst in order[:k]:
                    break
                order[k + 1:] = []
                shape, last = worst, True
                step = memo.get(shape) or memo.setdefault(shape, step_allocations(config, shape, options))
            if not started:
                for n in step.state:
                    a.malloc(n)
                a.malloc(CUBLAS_WORKSPACE)
            _run(a, step, first=not started)
            started = True
            reserved_after.append(a.stats.reserved)
    except AllocatorOOM as exc:
        oom = {"step": len(reserved_after), "worst_batch": last and len(reserved_after) == len(order) - 1,
               "tried_bytes": exc.alloc_size, "reserved_bytes": exc.reserved, "allocated_bytes": exc.allocated}
    s = a.stats
    return {"modelled": True, "steps": len(reserved_after), "of_steps": len(shapes), "worst_replayed_last": last,
            "reserved_peak_bytes": s.reserved_peak, "allocated_peak_bytes": s.allocated_peak,
            "fragmentation_bytes": s.fragmentation_at_peak, "overhead_bytes": s.reserved_peak - s.allocated_peak,
            "segments": s.segments, "alloc_retries": s.alloc_retries, "out_of_memory": oom,
            "reserved_after_step": reserved_after}


def epoch_report(config, epoch, options: MemoryOptions, alloc: AllocatorConfig, budget: int | None,
                 usable: int | None, *, sampler: str, seed: int) -> dict:
    """``report.json["memory"]["allocator"]``: the epoch's batches (in its order) through the allocator
    with ``alloc`` and the device's limits (``budget`` less the CUDA context), and what
    ``expandable_segments`` and ``group_by_length`` change. Every figure is modelled."""
    from dataclasses import replace

    from lengthscan.memory.epoch import batch_shapes, shape_of, simulate_epoch

    conf = replace(alloc, total=budget, capacity=None if budget is None else budget - CUDA_CONTEXT)
    shapes = [epoch.shape(i) for i in range(len(epoch.shapes))]
    memo: dict = {}
    worst = epoch.shape(epoch.worst)
    main = replay_steps(config, shapes, options, conf, worst=worst, memo=memo)
    over = next((k for k, r in enumerate(main["reserved_after_step"]) if usable is not None and r > usable), None)
    out = {**{k: v for k, v in main.items() if k != "reserved_after_step"}, "alloc_conf": describe(alloc),
           "memory_fraction": alloc.memory_fraction, "cuda_context_bytes": CUDA_CONTEXT, "bounded": budget is not None,
           "cublas_workspace_bytes": CUBLAS_WORKSPACE, "first_step_over_usable": over,
           "reserved_after_step": main["reserved_after_step"][:: max(1, len(main["reserved_after_step"]) // 500)],
           "variants": {}}
    tries = []
    if not alloc.expandable_segments:
        tries.append(("expandable_segments:True", shapes, replace(conf, expandable_segments=True)))
    if sampler != "group_by_length":
        grouped = simulate_epoch(epoch.layout, epoch.batches.batch_size, sampler="group_by_length", seed=seed,
                                 grad_accum=options.gradient_accumulation_steps)
        table = batch_shapes(epoch.layout, grouped)
        tries.append(("group_by_length", [shape_of(row) for row in table], conf))
    for name, order, c in tries:
        r = replay_steps(config, order, options, c, worst=worst, memo=memo)
        out["variants"][name] = {k: r[k] for k in ("reserved_peak_bytes", "allocated_peak_bytes", "overhead_bytes",
                                                   "out_of_memory", "steps")}
    return out


class _Held:
    """One allocation of the replay (the allocator reuses its block objects once they are freed)."""

    __slots__ = ("block", "live")

    def __init__(self, block):
        self.block, self.live = block, True

    def free(self, a: CachingAllocator) -> None:
        if self.live:
            self.live = False
            a.free(self.block)


def _run(a: CachingAllocator, step: StepAllocations, *, first: bool) -> None:
    batch = [_Held(a.malloc(n)) for n in step.batch]
    live: dict = defaultdict(list)  # (term, bytes) -> allocations, last made last
    order: list = []  # (term, bytes, allocation) in allocation order
    gradients: list = []
    for term, n in step.events:
        if n == 0:
            if term == "optimizer_step":  # what the step left of its activations is gone by now
                for t, _, held in order:
                    if t != "gradients":
                        held.free(a)
                order.clear()
                live.clear()
                if first:
                    for size in step.optimizer:
                        a.malloc(size)
            continue
        if n > 0:
            held = _Held(a.malloc(n))
            live[(term, n)].append(held)
            order.append((term, n, held))
            if term == "gradients":
                gradients.append(held)
            continue
        _free(a, live, order, term, -n)
    for held in (*(h for _, _, h in order), *gradients, *batch):
        held.free(a)


def _free(a: CachingAllocator, live: dict, order: list, term: str, n: int) -> None:
    """Free ``n`` bytes of ``term``: the last allocation of that size and term, else the last ones of the
    term no larger than what is left, until ``n`` is covered (a free the replay sums over several
    tensors: a split's gradients); never another term's."""
    stack = live.get((term, n))
    if stack:
        stack.pop().free(a)
        return
    for t, size, held in reversed(order):  # a sum never frees an allocation larger than what is left of it
        if n <= 0:
            break
        if t == term and held.live and size <= n:
            blocks = live[(t, size)]
            if held in blocks:
                blocks.remove(held)
            held.free(a)
            n -= size


def describe(alloc: AllocatorConfig) -> str:
    """The allocator options in ``PYTORCH_CUDA_ALLOC_CONF`` words ("default" when none)."""
    parts = []
    if alloc.expandable_segments:
        parts.append("expandable_segments:True")
    if alloc.max_split_size is not None:
        parts.append(f"max_split_size_mb:{alloc.max_split_size // MiB}")
    if alloc.garbage_collection_threshold:
        parts.append(f"garbage_collection_threshold:{alloc.garbage_collection_threshold:g}")
    if alloc.roundup_power2_divisions:
        parts.append("roundup_power2_divisions")
    return ",".join(parts) or "default"
