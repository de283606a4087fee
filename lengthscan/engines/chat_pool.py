"""Conversations measured with ``--num-proc N``: this process and ``N - 1`` worker processes.
Preference pairs and RL prompts share the way (``measure.preference.render.TextsJob``): their
workers only render, and this process tokenizes (the trainers' ids are the tokenizer's).

Rendering a chat template is Python; so is much of what follows it. Each worker takes whole
batches (``measure.chat.apart.BatchJob``) and holds no tokenizer: Python, Jinja, transformers'
template module and the count-only engine, about 60 MB beside the engine's tables.

* This process measures the split's first batch itself: the chat counter's checks (the engine's
  offsets against the tokenizer's, the token ranges) are made on the run's first renderings, as
  in one process.
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

from collections import deque
from typing import Callable


def chat_batches(batches, setup, fields: tuple, layout, processes: int, here: Callable, *, with_ids: bool = False):
    """(batch, role -> Measured) in row order; ``here(batch, rendered=None)`` measures a batch in
    this process (``rendered``: role -> a worker's renderings of it)."""
    import os
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

    def submit(batch):
        try:
            jobs = [f.kind.job(batch, f, layout, ctx, light.path_if_written()) for f in fields]
            return [state["pool"].submit(run_job, j) for j in jobs]
        except WorkerDied as exc:
            given_up(exc)
            return measure_here(batch)

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
            state["pool"] = Workers(processes, start_worker, (torch_hidden(),))
        except Exception as exc:  # noqa: BLE001 - no process could start (memory, a process limit): this one measures
            given_up(exc)
        first = True
        for batch in batches:
            if first or state["broken"] is not None or waiting() >= queued:
                pending.append((batch, measure_here(batch)))  # the first: the counter's checks, made here
                first = False
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

    def path_if_written(self) -> str | None:
        return self.path if self.written else None
