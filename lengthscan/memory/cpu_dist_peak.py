"""The measured CPU peak of one rank's training step under DDP or FSDP (validation only).

torch is imported inside the functions. ``world`` processes join a gloo group on this machine; each
builds the same random-initialised model (``build.build_model``), wraps it as the Trainer's accelerate
does (:func:`wrap`) and takes steady-state steps on its own batch of the shape; rank 0's measured step
is profiled from before its model exists (:func:`lengthscan.memory.cpu_peak.measure_from_start`), so
shards, gathered units, reduce buffers and DDP's C++ gradient buckets are all allocations it saw.
gloo's own scratch (it copies where NCCL works in place) is left out by ``cpu_peak.profiled_peak``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import tempfile

from lengthscan.memory.options import MemoryOptions, Shape


def measure_rank(config, shape: Shape, options: MemoryOptions, world: int = 2) -> dict:
    """Rank 0's measured peak (``peak_bytes``), the phase it happened in and each phase's peak, for the
    strategy ``options.parallel`` names (``bucket_bytes``: DDP's reducer's own figure)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        mp.spawn(_rank, args=(world, port, config, shape, options, out), nprocs=world, join=True)
        with open(out) as f:
            return json.load(f)


def _rank(rank: int, world: int, port: int, config, shape: Shape, options: MemoryOptions, out: str) -> None:
    import torch.distributed as dist

    from lengthscan.memory.cpu_peak import build_model, make_batch, measure_from_start

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        held = {}

        def build():
            held["model"] = wrap(build_model(config, options), options)
            return held["model"], make_batch(config, shape, options, seed=rank)

        with _settled_collectives():
            measured = measure_from_start(build, options)
        result = {"peak_bytes": measured.peak_bytes, "phase": measured.phase, "phase_peaks": measured.phase_peaks}
        if options.parallel.strategy == "ddp":
            sizes = str(held["model"]._get_ddp_logging_data()["bucket_sizes"]).split(",")
            result["bucket_bytes"] = sum(int(b) for b in sizes if b)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


COLLECTIVES = ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_reduce", "broadcast", "all_gather", "reduce_scatter", "_all_gather_base", "_reduce_scatter_base")


@contextlib.contextmanager
def _settled_collectives(pause: float = 0.05):
    """Let gloo's worker thread drop its references to a collective's tensors before the caller goes on,
    so that the caller's own release is the one that frees them: a free on the worker thread is one
    the profiler never records (it watches the thread it was started on)."""
    import time

    import torch.distributed as dist

    class Settled:
        def __init__(self, work):
            self._work = work

        def wait(self, *args, **kwargs):
            out = self._work.wait(*args, **kwargs)
            time.sleep(pause)
            return out

        def __getattr__(self, name):
            return getattr(self._work, name)

    def settled(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out is not None and hasattr(out, "wait"):
                return Settled(out)
            time.sleep(pause)
            return out
        return call

    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    for name, fn in originals.items():
        setattr(dist, name, settled(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def wrap(model, options: MemoryOptions):
    """``model`` wrapped for ``options.parallel`` as accelerate 1.16 does for the Trainer."""
    import torch

    parallel = options.parallel
    if parallel.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # init_sync=False: every rank built the same seeded model, and the broadcast's flat buffer, freed on gloo's
        # worker thread, is one the profiler would never see freed
        wrapped = DistributedDataParallel(model, gradient_as_bucket_view=False, init_sync=False)
        wrapped.register_comm_hook(None, _settled_allreduce)  # the C++ default's all-reduce, from Python: settled
        return wrapped
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
    layers = _layer_classes(model)
    if parallel.fsdp_version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        strategy = ShardingStrategy.SHARD_GRAD_OP if parallel.strategy == "fsdp_shard_grad_op" else \
            ShardingStrategy.FULL_SHARD
        policy = MixedPrecision(param_dtype=low, reduce_dtype=low, buffer_dtype=low) if low else None
        return FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                              transformer_layer_cls=layers),
                    sharding_strategy=strategy, use_orig_params=True, device_id=torch.device("cpu"),
                    mixed_precision=policy, limit_all_gathers=True, backward_prefetch=None)
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if low:  # accelerate upcasts what trains to fp32: the master copy
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    kwargs = {"reshard_after_forward": parallel.strategy != "fsdp_shard_grad_op",
              "mp_policy": MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low) if low else MixedPrecisionPolicy()}
    ignored = {p for p in model.parameters() if type(p).__name__ == "Params4bit" and not p.is_floating_point()}
    if ignored:  # uint8-stored 4-bit weights: accelerate leaves them out of the sharding (kept whole)
        kwargs["ignored_params"] = ignored
    for module in reversed(list(model.modules())):  # bottom-up, as get_module_children_bottom_up
        if isinstance(module, tuple(layers)) and module is not model:
            fully_shard(module, **kwargs)
    embed, head = _embeddings(model)
    tied = embed is not None and head is not None and embed.weight is head.weight
    inside = embed is not None and any(isinstance(m, FSDPModule) and any(p is embed.weight for p in m.parameters())
                                       for m in model.modules())
    if embed is not None and not tied and not inside:  # (accelerate calls it on BERT's too, inside BertEmbeddings'
        fully_shard(embed, **kwargs)  # unit, and torch refuses: what runs is the unit's)
    tail = [m for m in (_final_norm(model), *((embed,) if tied else ()), head) if m is not None]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})
    return fully_shard(model, **{k: v for k, v in kwargs.items() if k != "reshard_after_forward"})


def _settled_allreduce(state, bucket):
    """DDP's default communication hook (``allreduce_hook``: divide, all-reduce in place) run from Python, so
    that :func:`_settled_collectives` lets gloo's worker let go of the bucket before DDP goes on."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _embeddings(model) -> tuple:
    """The input and output embeddings (None where the model has none: a speech encoder's
    ``get_input_embeddings`` raises, which accelerate 1.16 does not catch)."""
    found = []
    for name in ("get_input_embeddings", "get_output_embeddings"):
        try:
            found.append(getattr(model, name, lambda: None)())
        except NotImplementedError:
            found.append(None)
    return tuple(found)


def _layer_classes(model) -> set:
    """The classes of ``model._no_split_modules`` it holds (accelerate's ``transformer_based_wrap``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return {type(m) for m in model.modules() if type(m).__name__ in names}


def _final_norm(model):
    """accelerate's ``_find_final_norm``: the last direct child of the base model with "Norm" in its class."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    found = None
    for _, module in base.named_children() if base is not None else ():
        if "Norm" in type(module).__name__:
            found = module
    return found
