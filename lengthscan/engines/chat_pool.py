"""Conversations measured with ``--num-proc N``: this process and ``N - 1`` worker processes.
Preference pairs and RL prompts share the way (``measure.preference.render.TextsJob``): their
workers only render, and this process tokenizes (the trainers' ids are the tokenizer's).

Rendering a chat template is Python; so is much of what follows it. Each worker takes whole
batches (``measure.chat.apart.BatchJob``) and holds no tokenizer: Python, Jinja, transformers'
template module and the count-only engine, about 60 MB beside the engine's tables.

* The workers start as the run begins where it will want them (``Early``, ``early_workers``): they
  import while this process loads the tokenizer.
* This process measures the split's first batch itself: the chat counter's checks (the engine's
  offsets against the tokenizer's, the token ranges) are made on the run's first renderings, as
  in one process. Each worker is given the next batch before that, to render meanwhile.
* Once the engine's offsets are proven it writes a copy of its chat counter that tokenizes by the
  engine alone (``ChatCounter.light``) to a file the workers read once: a worker then measures its
  batches whole, and sends back their measurements (and the rows whose rendering ran out of time,
  counted with this process's).
* Until then, where the engine is refused, where ids are written, or where a batch holds a text
  the engine leaves to the tokenizer, a worker only renders the batch; this process tokenizes the
  renderings and finishes the rows.
* This process measures a batch itself whenever ``2 x workers`` batches wait at the workers, and
  every batch once a worker has died or none could start (one warning).

Every row is measured as one process measures it, and the batches come out in row order.
"""

from __future__ import annotations

import os
from collections import deque
from itertools import islice
from typing import Callable


def chat_batches(batches, setup, fields: tuple, layout, processes: int, here: Callable, *, with_ids: bool = False,
                 early: Early | None = None):
    """(batch, role -> Measured) in row order; ``here(batch, rendered=None)`` measures a batch in
    this process (``rendered``: role -> a worker's renderings of it); ``early``: workers the run
    started as it began (``LocalEngine.early``), taken where they are as many."""
    import shutil
    import tempfile

    from lengthscan import heap
    from lengthscan.engines.procs import WorkerDied, Workers
    from lengthscan.measure.chat.apart import run_job
    from lengthscan.measure.kinds import MeasureContext
    from lengthscan.torchless import torch_hidden

    owner = setup.rendered_by  # the fields' counter: a ChatCounter, or the pairs' or prompts' TemplateRows
    ctx = MeasureContext(setup.counter, chat=setup.chat, pairs=setup.pairs)
    shared = owner.shared  # added up over the splits
    shared["processes"] = max(shared.get("processes", 1), processes + 1)
    for key in ("measured_here", "measured_by_workers", "rendered_by_workers"):
        shared.setdefault(key, 0)
    queued = 2 * processes
    pending: deque = deque()  # (batch, the futures of its workers' answers, or this process's measurements)
    state = {"pool": None, "broken": None}
    folder = tempfile.mkdtemp(prefix="lengthscan-chat-")
    light = Light(owner, os.path.join(folder, "counter.pickle"), wanted=not with_ids)

    def measure_here(batch) -> dict:
        measured = here(batch)
        shared["measured_here"] += 1
        light.offer()
        heap.trim()
        return measured

    def given_up(exc: BaseException) -> None:
        if state["broken"] is None:
            import warnings

            warnings.warn(f"lengthscan: worker processes stopped ({exc}); measuring in this process",
                          RuntimeWarning, stacklevel=3)
            state["broken"] = exc

    def submit(batch, here_if_died: bool = True):
        try:
            jobs = [f.kind.job(batch, f, layout, ctx, light.planned()) for f in fields]
            return [state["pool"].submit(run_job, j) for j in jobs]
        except WorkerDied as exc:
            given_up(exc)
            return measure_here(batch) if here_if_died else None

    def finish(batch, futures: list) -> dict:
        measured, rendered = {}, {}
        try:
            answers = [f.result() for f in futures]
        except WorkerDied as exc:  # the OOM killer, say: this process measures the batch
            given_up(exc)
            return measure_here(batch)
        for answer in answers:
            owner.add_timeouts(answer.pop("timeouts", None))
            for role, got in answer.items():
                (rendered if isinstance(got, list) else measured)[role] = got
        if rendered:
            measured.update(here(batch, rendered))
            light.offer()
        shared["rendered_by_workers" if rendered else "measured_by_workers"] += 1
        heap.trim()
        return measured

    def ready(result) -> bool:
        return isinstance(result, dict) or all(f.done() for f in result)

    def waiting() -> int:
        return sum(1 for _, r in pending if not ready(r))

    try:
        try:
            state["pool"] = (early.take(processes) if early is not None else None) or \
                Workers(processes, start_worker, (torch_hidden(),))
        except Exception as exc:  # noqa: BLE001 - no process could start (memory, a process limit): this one measures
            given_up(exc)
        batches = iter(batches)
        first = next(batches, None)
        if first is not None:  # a next batch goes to each worker first: it renders while this process
            ahead = [] if state["broken"] is not None else [(b, submit(b, here_if_died=False))
                                                            for b in islice(batches, processes)]
            pending.append((first, measure_here(first)))  # makes the counter's checks on the first
            pending.extend((b, measure_here(b) if got is None else got) for b, got in ahead)
        for batch in batches:
            if state["broken"] is not None or waiting() >= queued:
                pending.append((batch, measure_here(batch)))
            else:
                pending.append((batch, submit(batch)))
            while pending and (ready(pending[0][1]) or len(pending) > 2 * queued):
                head, result = pending.popleft()
                yield head, result if isinstance(result, dict) else finish(head, result)
        while pending:
            head, result = pending.popleft()
            yield head, result if isinstance(result, dict) else finish(head, result)
    except BaseException:
        if state["pool"] is not None:
            state["pool"].close(kill=True)
            state["pool"] = None
        raise
    finally:
        if state["pool"] is not None:
            state["pool"].close()
        shutil.rmtree(folder, ignore_errors=True)


def start_worker(hide_torch: bool) -> None:
    """A worker's start (``apart.start_renderer``), then what every job needs imported: this
    process measures the run's first batch meanwhile (about half a second of importing that is then
    off the run's path)."""
    from lengthscan.measure.chat.apart import start_renderer

    start_renderer(hide_torch)
    try:
        import transformers.utils.chat_template_utils  # noqa: F401 - the template's renderer

        import lengthscan.measure.chat.counter  # noqa: F401 - what a light copy unpickles into
        import lengthscan.measure.preference.render  # noqa: F401
        import lengthscan.measure.text.countbpe.engine  # noqa: F401
    except ImportError:  # the job imports it itself, and says what is missing
        pass


class Light:
    """The chat counter's light copy (``ChatCounter.light``), written once to ``path`` for the
    workers as soon as this process has one. The copy is an optimisation: where it cannot be
    written, the workers go on rendering only."""

    def __init__(self, chat, path: str, *, wanted: bool):
        self.chat = chat
        self.path = path
        self.written = False
        self.wanted = wanted  # not where token ids are written (the tokenizer's)

    def offer(self) -> None:
        if self.written or not self.wanted:
            return
        copy = self.chat.light()
        if copy is None:
            return
        import os
        import pickle

        part = f"{self.path}.part"
        try:
            with open(part, "wb") as fh:
                pickle.dump(copy, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(part, self.path)
        except (OSError, pickle.PicklingError, TypeError, AttributeError):  # a full disk, a table that won't pickle
            self.wanted = False
            return
        self.written = True

    def planned(self) -> str | None:
        """Where the copy is (or will be) written, for a job: a worker reads it once it is there."""
        return self.path if self.wanted else None


#: Without --num-proc, a local source of fewer bytes starts no worker early (it may hold fewer
#: than ``loop.AUTO_ROWS`` conversations, measured by this process alone)
EARLY_BYTES = 512 << 10


class Early:
    """Chat workers started as a run begins (``LocalEngine.early``): each imports what its jobs
    need while this process imports transformers and loads the tokenizer, about a second a worker
    off the run's path. ``take(n)`` gives them once, where ``n`` are wanted; those never taken are
    stopped as the run ends."""

    def __init__(self, processes: int):
        from lengthscan.engines.procs import Workers
        from lengthscan.torchless import torch_hidden

        self.processes = processes
        try:
            self.pool = Workers(processes, start_worker, (torch_hidden(),))
        except Exception:  # noqa: BLE001 - an optimisation: the split's own start says what fails
            self.pool = None

    def take(self, processes: int):
        pool, self.pool = self.pool, None
        if pool is not None and processes != self.processes:
            pool.close(kill=True)
            return None
        return pool

    def __enter__(self) -> Early:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close(kill=True)
            self.pool = None


def early_workers(source, spec, num_proc: int | None, auto: int) -> int:
    """The chat workers worth starting before a run's set-up: ``num_proc - 1`` with --num-proc
    where the run renders (conversations, preference pairs, RL prompts), else ``auto - 1`` for
    conversations (``--messages``) measured whole or by default; none for a source that is not a
    local file or folder of ``EARLY_BYTES`` or more (a small one may need no worker at all)."""
    m, s = spec.measure, spec.sample
    if num_proc is not None:
        wanted = num_proc - 1 if any((m.messages, m.prompt, m.chosen, m.rl)) else 0
    else:
        wanted = auto - 1 if m.messages is not None and (s.full or s.sample is None) else 0
    return wanted if wanted > 0 and _local_bytes(source, EARLY_BYTES) >= EARLY_BYTES else 0


def _local_bytes(source, enough: int) -> int:
    """The bytes of a local file, or of a folder's files (counted until ``enough``); 0 otherwise."""
    if not isinstance(source, (str, os.PathLike)):
        return 0
    try:
        if os.path.isfile(source):
            return os.path.getsize(source)
        total = 0
        for root, _, files in os.walk(source):
            for name in files:
                total += os.path.getsize(os.path.join(root, name))
                if total >= enough:
                    return total
        return total
    except OSError:
        return 0
