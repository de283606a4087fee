"""The count-only engine proven beside the counting, off its critical path.

On a first run the engine's proof (the rank table, ``countbpe/proof.py``; the code-point probe,
``countbpe/pattern.py``) costs seconds on a large vocabulary, before any row could be counted. A
run's counter (``RoleStrategies(prove_beside=True)``) starts that proof in a thread and counts with
the proven fast path (``FastCount``) meanwhile; each role takes the engine over at its next batch
once the proof has ended (``ProvingCount``). Counts are identical either way (both are proven to be
the tokenizer's); the report's ``counting`` entry says how many texts the tokenizer counted
before the switch. ``settle`` waits for a proof still running when the counting ends, so that
the proof is written to the cache for the next run.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from lengthscan.measure.text.fastpath import METHOD_FAST

if TYPE_CHECKING:
    from lengthscan.measure.text.strategies import CountStrategy, FastCount


class Proving:
    """``prove()`` (``countbpe.counting.engine_for``: (engine or None, reason)) run in a thread."""

    def __init__(self, prove: Callable[[], tuple]):
        self._result: tuple | None = None
        self._thread = threading.Thread(target=self._run, args=(prove,), name="lengthscan-count-proof", daemon=True)
        self._thread.start()

    def _run(self, prove) -> None:
        try:
            result = prove()
        except BaseException as exc:  # noqa: BLE001 - Rust panics are BaseExceptions; counting goes on
            result = (None, f"count-only engine not built ({type(exc).__name__}: {str(exc)[:100]}): "
                            "counted by tokenizers")
        self._result = result

    def result(self) -> tuple | None:
        """(engine or None, reason) once the proof has ended; None while it runs."""
        return self._result

    def wait(self) -> tuple:
        self._thread.join()
        return self._result


class ProvingCount:
    """One role's strategy while the engine is proven beside the counting: ``fast`` until the proof
    has ended, then what ``adopt(engine, reason)`` makes of it (``EngineCount``, or ``fast`` with why
    not). Texts never wait for the proof."""

    method = METHOD_FAST

    def __init__(self, fast: FastCount, proving: Proving, adopt: Callable[..., CountStrategy]):
        self.fast = fast
        self.backend = fast.backend
        self.reason = fast.reason
        self._proving = proving
        self._adopt = adopt
        self._now: CountStrategy | None = None
        self.before = 0  # texts the tokenizer counted while the proof ran
        self.after = 0   # texts counted once it had ended

    def current(self) -> CountStrategy | None:
        """The strategy after the proof (None: still proving)."""
        if self._now is None:
            result = self._proving.result()
            if result is not None:
                self._now = self._adopt(*result)
        return self._now

    def settle(self) -> None:
        """Wait for the proof (the end of the counting): it is cached for the next run."""
        if self._now is None:
            self._now = self._adopt(*self._proving.wait())

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        now = self.current()
        if now is None:
            self.before += len(texts) if rows is None else int(np.count_nonzero(rows))
            return self.fast.count(texts, rows)
        self.after += len(texts) if rows is None else int(np.count_nonzero(rows))
        return now.count(texts, rows)

    def ids(self, texts: list[str]) -> list[list[int]]:
        return self.fast.ids(texts)

    def describe(self) -> dict:
        now = self.current()
        if now is None:
            return {"engine": "tokenizers", "reason": "the count-only engine was being proven beside the counting, "
                                                      "which ended first", "before_proof": self.before}
        entry = dict(now.describe())
        if now is self.fast:  # not proven: why not
            return entry
        if not self.after:
            return {"engine": "tokenizers", "reason": "the count-only engine was proven beside the counting, which "
                                                      "ended first (the next run finds the proof in the cache)",
                    "before_proof": self.before}
        if self.before:
            entry["reason"] = (f"{entry['reason']}; proven beside the counting: the tokenizer counted the first "
                               f"{self.before:,} texts")
            entry["before_proof"] = self.before
        return entry
