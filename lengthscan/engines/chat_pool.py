"""Conversations measured with ``--num-proc N``: this process and ``N - 1`` worker processes.

Rendering a chat template is Python; so is much of what follows it. Each worker takes whole
batches (``measure.chat.apart.BatchJob``) and holds no tokenizer: Python, Jinja, transformers'
template module and the count-only engine, about 60 MB beside the engine's tables.

* Once this process has proven the engine's offsets on the run's first renderings (the chat
  counter's check), it writes a copy of its chat counter that tokenizes by the engine alone
  (``ChatCounter.light``) to a file the workers read once: a worker then measures its batches
  whole, and sends back their measurements.
* Until then, where the engine is refused, or where a batch holds a text the engine leaves to the
  tokenizer, a worker only renders the batch; this process tokenizes the renderings and finishes
  the measurements.
* This process measures a batch itself whenever ``2 x workers`` batches wait at the workers.

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
    from lengthscan.engines.procs import Workers
    from lengthscan.measure.chat.apart import run_job, start_renderer
    from lengthscan.measure.kinds import MeasureContext
    from lengthscan.torchless import torch_hidden

    ctx = MeasureContext(setup.counter, chat=setup.chat)
    folder = tempfile.mkdtemp(prefix="lengthscan-chat-")
    light = Light(setup.chat, os.path.join(folder, "counter.pickle"), wanted=not with_ids)
    queued = 2 * processes
    pending: deque = deque()  # (batch, the futures of its workers' answers, or this process's measurements)

    def job(batch):
        return [f.kind.job(batch, f, layout, ctx, light.path_if_written()) for f in fields]

    shared = setup.chat.shared
    shared.update(processes=processes + 1, measured_here=0, measured_by_workers=0, rendered_by_workers=0)

    def finish(batch, futures: list) -> dict:
        measured, rendered = {}, {}
        for answer in (f.result() for f in futures):
            for role, got in answer.items():
                (rendered if isinstance(got, list) else measured)[role] = got
        if rendered:
            measured.update(here(batch, rendered))
            light.offer()
        shared["rendered_by_workers" if rendered else "measured_by_workers"] += 1
        heap.trim()
        return measured

    def measure_here(batch) -> dict:
        measured = here(batch)
        shared["measured_here"] += 1
        light.offer()
        heap.trim()
        return measured

    def ready(result) -> bool:
        return isinstance(result, dict) or all(f.done() for f in result)

    def waiting() -> int:
        return sum(1 for _, r in pending if not ready(r))

    try:
        pool = Workers(processes, start_renderer, (torch_hidden(),))
    except OSError as exc:  # no process could be started (memory, a process limit): this one measures
        import warnings

        warnings.warn(f"lengthscan: worker processes did not start ({exc}); measuring in this process",
                      RuntimeWarning, stacklevel=2)
        shutil.rmtree(folder, ignore_errors=True)
        light.wanted = False
        for batch in batches:
            yield batch, measure_here(batch)
        return
    try:
        with pool:
            for batch in batches:
                if waiting() < queued:
                    pending.append((batch, [pool.submit(run_job, j) for j in job(batch)]))
                else:
                    pending.append((batch, measure_here(batch)))
                while pending and (ready(pending[0][1]) or len(pending) > 2 * queued):
                    head, result = pending.popleft()
                    yield head, result if isinstance(result, dict) else finish(head, result)
            while pending:
                head, result = pending.popleft()
                yield head, result if isinstance(result, dict) else finish(head, result)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Light:
    """The chat counter's light copy (``ChatCounter.light``), written once to ``path`` for the
    workers as soon as this process has one."""

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
        with open(part, "wb") as fh:
            pickle.dump(copy, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(part, self.path)
        self.written = True

    def path_if_written(self) -> str | None:
        return self.path if self.written else None
