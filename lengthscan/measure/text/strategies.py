"""How one role's strings are counted: three exact strategies behind one small interface.

* ``CallCount``: the tokenizer's own ``__call__`` (always right; the slowest);
* ``FastCount``: the backend's ``encode_batch_fast``, where ``fastpath.py`` proved it gives
  ``__call__``'s ids for this tokenizer and role (no offsets, no Python per token);
* ``EngineCount``: the count-only BPE engine (``countbpe/``), where it is proven too; it makes no
  ids, so ids come from the fast path under it.

Each takes non-empty strings already triaged (``TokenCounter.count`` flags None, "" and texts
over ``--max-chars``) and cut into chunks (``TokenCounter.count_strings``): a call per chunk, no
Python per row. Decide-only counting (``decide.DecideOnly``) wraps one of them. Which strategy a
role gets is chosen in one place, ``choice.RoleStrategies``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from lengthscan.measure.text.fastpath import CHAT_ROLE, METHOD_CALL, METHOD_FAST

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lengthscan.measure.text.countbpe.counting import RoleEngine

#: ``__call__``'s ids for (texts, role): ``TokenizerHandle.call_ids``.
CallIds = Callable[[list[str], str], list]


class CountStrategy(Protocol):
    """Exact token counts of one role's strings, as the model receives them."""

    method: str                   # what the report's ``methods`` says: METHOD_FAST or METHOD_CALL
    reason: str                   # why this method (the fast path's proof, or why there is none)
    backend: Tokenizer | None     # the proven backend (None: counted by ``__call__``)

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        """Token counts; ``rows`` (a mask, None: all) marks the texts that are rows, for tallies."""
        ...

    def ids(self, texts: list[str]) -> list[list[int]]:
        """The token ids ``__call__`` gives."""
        ...

    def describe(self) -> dict:
        """The report's ``counting`` entry: which engine counted and why."""
        ...


class CallCount:
    """The tokenizer's own ``__call__``."""

    method = METHOD_CALL
    backend = None

    def __init__(self, call_ids: CallIds, role: str, reason: str):
        self._call_ids = call_ids
        self.role = role
        self.reason = reason

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        return np.array([len(ids) for ids in self._call_ids(texts, self.role)], np.int64)

    def ids(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._call_ids(texts, self.role)]

    def describe(self) -> dict:
        return {"engine": "__call__", "reason": self.reason}


class FastCount:
    """The backend's ``encode_batch_fast``, proven to give ``__call__``'s ids for the role.
    ``engine_reason`` says why the count-only engine does not count it (empty: not asked)."""

    method = METHOD_FAST

    def __init__(self, backend: Tokenizer, role: str, reason: str, engine_reason: str = ""):
        self.backend = backend
        self.role = role
        self.reason = reason
        self.engine_reason = engine_reason
        self._specials = role != CHAT_ROLE  # a rendered conversation holds its special tokens already

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        return np.array([len(e) for e in self.backend.encode_batch_fast(texts, add_special_tokens=self._specials)],
                        np.int64)

    def ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=self._specials)]

    def describe(self) -> dict:
        return {"engine": "tokenizers", "reason": self.engine_reason or self.reason}


class EngineCount:
    """The count-only BPE engine for the role (a ``countbpe`` ``RoleEngine``), over the fast path
    it was proven against (its ids, and the texts the engine leaves to the tokenizer)."""

    method = METHOD_FAST

    def __init__(self, engine: RoleEngine, fast: FastCount, engine_reason: str):
        self.engine = engine
        self.fast = fast
        self.backend = fast.backend
        self.reason = fast.reason
        self.engine_reason = engine_reason

    def count(self, texts: list[str], rows: np.ndarray | None = None) -> np.ndarray:
        return self.engine.count(texts, rows)

    def ids(self, texts: list[str]) -> list[list[int]]:
        return self.fast.ids(texts)

    def describe(self) -> dict:
        return self.engine.to_dict(self.engine_reason)
