"""The measured CPU peak of one rank's training step under ``DistributedDataParallel`` (validation only).

torch is imported inside the functions. ``world`` processes join a gloo group on this machine; each
builds the same random-initialised model (``build.build_model``), wraps it in DDP as accelerate does
(``gradient_as_bucket_view=False``) and takes a steady-state step on its own batch of the shape;
rank 0 measures its step as :func:`lengthscan.memory.cpu_peak.measure_step` does, after one more
forward and backward (the reducer rebuilds its buckets at the second forward). The reducer's
buckets are C++ tensors no Python object reaches, allocated when the model is wrapped: their bytes
are the reducer's own figure (``_get_ddp_logging_data()["bucket_sizes"]``), added to the peak.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile

from lengthscan.memory.options import MemoryOptions, Shape


def measure_ddp(config, shape: Shape, options: MemoryOptions, world: int = 2) -> dict:
    """Rank 0's measured peak (``peak_bytes``: the step's, with the buckets), its parts, and the phase."""
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
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lengthscan.memory.cpu_peak import build_model, make_batch, measure_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = DistributedDataParallel(build_model(config, options), gradient_as_bucket_view=False)
        batch = make_batch(config, shape, options, seed=rank)
        model(**batch).loss.backward()  # the reducer rebuilds its buckets in the next forward: a step before
        model.zero_grad(set_to_none=True)
        measured = measure_step(model, batch, options)
        buckets = sum(int(b) for b in str(model._get_ddp_logging_data()["bucket_sizes"]).split(",") if b)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"peak_bytes": measured.peak_bytes + buckets, "step_peak_bytes": measured.peak_bytes,
                           "bucket_bytes": buckets, "phase": measured.phase}, f)
    finally:
        dist.destroy_process_group()
