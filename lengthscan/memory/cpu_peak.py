"""The measured CPU peak of one training step, aligned with what CUDA kernels keep (validation only).

Everything here needs torch (imported inside the functions: the package itself never needs it).
One steady-state step is the Trainer's: forward under autocast for mixed precision, the outputs
dropped before ``backward`` (``compute_loss`` keeps only the loss), ``backward``, gradient
clipping (``max_grad_norm=1.0``), the optimizer step, ``zero_grad(set_to_none=True)``. A first
step runs unmeasured so the optimizer state exists, as it does for every step but the first.

The peak is the bytes live before the step (every tensor storage reachable from Python: weights,
optimizer state, the batch) plus the maximum of the running sum of the allocation events that
``torch.profiler.profile(profile_memory=True)`` records during the step, in time order.

The kernels are aligned with CUDA's by :func:`lengthscan.memory.align.cuda_like` (docs/memory.md).
The fused AdamW kernel (the Trainer's default ``adamw_torch_fused``) and the foreach one run on CPU
with the same allocations as on CUDA, so the optimizer needs no alignment.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

from lengthscan.memory.align import cuda_like
from lengthscan.memory.build import build_model, make_batch  # noqa: F401  (re-exported for the bench and the tests)
from lengthscan.memory.options import MemoryOptions


@dataclass(frozen=True)
class Measurement:
    """The measured peak of one step, and where it happened."""

    peak_bytes: int
    live_before: int
    phase: str
    phase_peaks: dict

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "live_before": self.live_before, "phase": self.phase,
                "phase_peaks": dict(self.phase_peaks)}


# -- the step ------------------------------------------------------------------------------------


def _optimizer(model, options: MemoryOptions):
    """The optimizer the Trainer builds for ``TrainingArguments(optim=options.optimizer)``."""
    import tempfile

    import torch
    from transformers import Trainer, TrainingArguments

    params = [p for p in model.parameters() if p.requires_grad]
    if options.optimizer == "adamw_torch_loop":  # not a Trainer name: AdamW(foreach=False)
        return torch.optim.AdamW(params, lr=1e-5, foreach=False)
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(output_dir=folder, optim=options.optimizer, learning_rate=1e-5, use_cpu=True,
                                 report_to=[])
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls(params, **kwargs)


def live_bytes(torch, model, exclude=()) -> int:
    """Bytes of every distinct tensor storage reachable from Python, and of the model's gradients.

    (Gradients made by autograd have no Python object until ``.grad`` is read, so the garbage
    collector does not list them.) ``exclude``: tensors whose storages are not counted (:func:`foreign_tensors`).
    """
    gc.collect()
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    seen, total = {t.untyped_storage().data_ptr() for t in exclude}, 0
    for obj in tensors:
        if obj.device.type != "cpu" or obj.is_meta:
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: not used by the models here
            continue
        if storage.data_ptr() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def foreign_tensors(torch, model) -> list:
    """Tensors alive now that are not ``model``'s (an earlier measurement's model and optimizer state, still
    referenced somewhere in the process): not this run's device memory. Hold the list while measuring, so
    that their storages are not freed and reused."""
    gc.collect()
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    return [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu"
            and not obj.is_meta and not obj.is_sparse and obj.untyped_storage().data_ptr() not in own]


def measure_step(model, batch: dict, options: MemoryOptions = MemoryOptions(), *, align: bool = True,
                 loss=None, optimizer=None, exclude=()) -> Measurement:
    """The CPU peak of one steady-state training step of ``model`` on ``batch``; ``loss``: a callable
    computing the step's loss (default ``model(**batch).loss``: a trainer's ``compute_loss``);
    ``optimizer``: the trainer's own (default: the one ``options.optimizer`` names); ``exclude``:
    tensors not counted as live (:func:`foreign_tensors`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = make_step(model, batch, options, loss=loss, optimizer=optimizer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # oneDNN keeps scratch per thread: one thread makes the figure machine-independent
    try:
        with cuda_like() if align else contextlib.nullcontext():
            step()
            if options.gradient_accumulation_steps > 1:  # measure the cycle's last micro-batch: gradients exist
                step(update=False)
            live_before = live_bytes(torch, model, exclude=exclude)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
    finally:
        torch.set_num_threads(threads)
    return profiled_peak(prof, live_before)


def make_step(model, batch: dict, options: MemoryOptions = MemoryOptions(), *, loss=None, optimizer=None):
    """The Trainer's training step as a callable ``step(update=True)``, its phases marked for
    :func:`profiled_peak` (``update=False``: an earlier micro-batch of gradient accumulation)."""
    import torch
    from torch.profiler import record_function

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
    optimizer = optimizer if optimizer is not None else _optimizer(model, options)
    scaler = torch.amp.GradScaler("cpu") if options.precision == "fp16" else None
    model.train()

    no_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2: accelerate's no_sync under accumulation

    def step(update: bool = True):
        if no_sync is not None:
            no_sync(update)
        autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with record_function("ls::forward"), autocast:
            value = model(**batch).loss if loss is None else loss()  # the outputs die here (compute_loss)
        with record_function("ls::backward"):
            (scaler.scale(value) if scaler else value).backward()
        del value
        if not update:
            return
        with record_function("ls::optimizer_step"):
            if scaler:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer) if scaler else optimizer.step()
            if scaler:
                scaler.update()
            optimizer.zero_grad(set_to_none=True)

    return step


def profiled_peak(prof, live_before: int) -> Measurement:
    """The peak of the profiled allocations over ``live_before``.

    When ranges ``ls::measured`` were recorded (a profile from the process's start:
    :func:`measure_from_start`), the running sum counts every event and each range is a step: the
    figure is the lowest of the steps' peaks. A block freed by a thread the profiler does not watch (a
    collective's worker dropping the last reference) only ever adds to it, until its address is handed
    out again (then it is counted freed): the figure can be too high, never too low."""
    allocations, ranges = _profiled_events(prof)
    windows = sorted((a, b) for name, a, b in ranges if name == "measured") or [(None, None)]
    phases = [(name, a, b) for name, a, b in ranges if name != "measured"]
    running, live, w = 0, {}, 0
    steps = [{"best": -1, "phase": "forward", "peaks": {}} for _ in windows]
    for t, size, ptr in allocations:
        if size > 0 and ptr in live:  # freed unseen: freed by now
            running -= live[ptr]
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
        running += size
        while w < len(windows) and windows[w][1] is not None and t > windows[w][1]:
            w += 1
        if w == len(windows) or (windows[w][0] is not None and t < windows[w][0]):
            continue
        step = steps[w]
        phase = next((name for name, a, b in phases if a <= t <= b), "other")
        step["peaks"][phase] = max(step["peaks"].get(phase, 0), running)
        if running > step["best"]:
            step["best"], step["phase"] = running, phase
    clean = min(steps, key=lambda step: step["best"] if step["best"] >= 0 else float("inf"))
    names = {"forward": "forward_end", "backward": "backward", "optimizer_step": "optimizer_step"}
    return Measurement(live_before + max(clean["best"], 0), live_before, names.get(clean["phase"], clean["phase"]),
                       {names.get(k, k): live_before + v for k, v in clean["peaks"].items()})


def _profiled_events(prof) -> tuple[list, list]:
    """Allocations ``(time, bytes, address)`` in time order, and ranges ``(name, start, end)`` of the
    ``ls::`` marks; the communication backend's own scratch is left out (gloo copies where NCCL
    works in place), and so is its free, wherever it happens."""
    import torch

    kind = torch._C._profiler._EventType  # torch's own private: the profiler tree's event kinds
    allocations, ranges, backend = [], [], set()

    def walk(nodes, collective=False):
        for node in nodes:
            if node.tag == kind.Allocation:
                size, ptr = node.extra_fields.alloc_size, node.extra_fields.ptr
                if collective and size > 0:
                    backend.add(ptr)
                elif size < 0 and ptr in backend:
                    backend.discard(ptr)
                else:
                    allocations.append((node.start_time_ns, size, ptr))
            elif node.name.startswith("ls::"):
                ranges.append((node.name[4:], node.start_time_ns, node.end_time_ns))
            walk(node.children, collective or node.name.startswith(("c10d::", "gloo:")))

    walk(prof.profiler.kineto_results.experimental_event_tree())
    allocations.sort(key=lambda a: a[0])
    return allocations, ranges


def measure_from_start(build, options: MemoryOptions = MemoryOptions(), *, align: bool = True,
                       steps: int = 3) -> Measurement:
    """The CPU peak of a steady-state step of the model ``build()`` returns (``(model, batch)``), profiled
    from before the model exists: every byte the step holds is an allocation the profiler saw, which is
    how a rank's state is counted when its tensors are views, resized storages or C++ buffers that
    :func:`live_bytes` cannot see (FSDP's shards, DDP's buckets)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with cuda_like() if align else contextlib.nullcontext():
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                model, batch = build()
                step = make_step(model, batch, options)
                step()
                for _ in range(steps):
                    if options.gradient_accumulation_steps > 1:  # the cycle's last micro-batch is measured
                        step(update=False)
                    with record_function("ls::measured"):
                        step()
    finally:
        torch.set_num_threads(threads)
    return profiled_peak(prof, 0)


def measure_step_cuda(model, batch: dict, options: MemoryOptions = MemoryOptions()) -> Measurement:
    """The same step on a CUDA device: ``torch.cuda.max_memory_allocated`` per phase (no alignment needed)."""
    import torch

    device = torch.device("cuda")
    model = model.to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
    optimizer = _optimizer(model, options)
    scaler = torch.amp.GradScaler("cuda") if options.precision == "fp16" else None
    peaks = {}

    def phase(name, fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated()
        return out

    def forward():
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return model(**batch).loss

    def update():
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer) if scaler else optimizer.step()
        if scaler:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # the first step creates the optimizer state; the second is measured
        peaks.clear()
        live_before = torch.cuda.memory_allocated()
        loss = phase("forward_end", forward)
        phase("backward", (scaler.scale(loss) if scaler else loss).backward)
        loss = None  # as Trainer.training_step: only the detached value survives
        phase("optimizer_step", update)
    best = max(peaks, key=peaks.get)
    return Measurement(peaks[best], live_before, best, dict(peaks))
