"""The worker processes of ``--num-proc`` for text and audio (``multiprocessing``, spawned): each
gets the run's ``WorkerJob`` once and measures the batches it is handed, reporting how its
tokenizer counted. Conversations, preference pairs and RL prompts use ``chat_pool`` instead. Also:
how many cores this process may use, and the count-only engine's tallies added up over processes."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan import heap
from lengthscan.measure.batch import RoleField, measure_batch
from lengthscan.measure.setup import Setup
from lengthscan.sources.scan import Batch
from lengthscan.sources.source import SplitLayout


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, within a container's CPU quota (cgroup v2
    ``cpu.max``) where one is set."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


@dataclass(frozen=True)
class WorkerJob:
    """What a measuring worker process gets once (small: the counter pickles by name)."""

    setup: Setup
    fields: tuple[RoleField, ...]
    layout: SplitLayout
    with_ids: bool = False


_WORKER: list = []  # the job of this worker process (set once by ``start_worker``)


def start_worker(job: bytes, hide_torch: bool = False) -> None:
    """A worker process's initializer: torch hidden where the parent hides it (before the job, a
    pickled ``WorkerJob``, is read), tokenizer threads off (one process a core), the job kept,
    Ctrl-C left to the parent (which stops the pool and says so once)."""
    import os
    import pickle
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if hide_torch:
        from lengthscan.torchless import hide_torch as hide

        hide()
    heap.one_arena_per_core_pair()  # the tokenizer's thread shares the heap, not one of its own
    _WORKER[:] = [pickle.loads(job)]


def worker_measure(batch: Batch) -> tuple:
    """One batch measured in a worker process: (role -> Measured, this process's id, how its
    tokenizer has counted so far: (role -> method, role -> counting) or None)."""
    import os

    job = _WORKER[0]
    counter = job.setup.counter
    measured = measure_batch(batch, job.fields, job.layout, counter=counter, audio=job.setup.settings,
                             decide_caps=job.setup.decide_caps, with_ids=job.with_ids, chat=job.setup.chat,
                             pairs=job.setup.pairs)
    counting = (counter.methods(), counter.counting()) if counter is not None else None
    heap.trim()  # a batch's encodings freed: their pages back to the system
    return measured, os.getpid(), counting


#: The count-only engine's tallies, which add up over the processes (or actors) that counted.
COUNTING_TALLIES = ("texts", "by_tokenizer", "verified")


def add_counting(into: dict, counting: dict) -> dict:
    """Merge one process's ``counting`` (role -> engine, reason, tallies) into ``into``: the first
    seen engine and reason of a role, its tallies summed."""
    for role, c in counting.items():
        if role not in into:
            into[role] = dict(c)
            continue
        for key in COUNTING_TALLIES:
            if key in c:
                into[role][key] = into[role].get(key, 0) + c[key]
    return into
