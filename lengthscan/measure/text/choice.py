"""Which strategy counts each role: the one place it is chosen, once per role and process.

For a role's first texts:

1. the fast path (``fastpath.prove``, or remembered for these tokenizer files by ``Memo``):
   ``FastCount`` where it is proven, else ``CallCount``;
2. on the fast path, the count-only BPE engine (``countbpe/``) where it is proven for the backend
   and agrees on the role's probes: ``EngineCount`` (not with ``--count-engine tokenizers``);
   rendered conversations need offsets: ``tiler`` gives them from the engine (``countbpe/tiling.py``),
   and the chat counter checks them against the tokenizer's before it uses them;
3. on demand, decide-only bounds (``bounds.py``) over the role's exact strategy: ``DecideOnly``.

Every role shares one backend copy and one count-only engine. Nothing chosen is pickled: a worker
chooses again (the proofs are remembered on disk, so that is cheap).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

import numpy as np

from lengthscan.measure.text.beside import Proving, ProvingCount
from lengthscan.measure.text.bounds import Bounds, holds_on
from lengthscan.measure.text.bounds import prove as prove_bounds
from lengthscan.measure.text.decide import DecideOnly
from lengthscan.measure.text.early import Early
from lengthscan.measure.text.fastpath import CHAT_ROLE, METHOD_FAST, PROBES, RoleMethod, prove
from lengthscan.measure.text.strategies import CallCount, CountStrategy, EngineCount, FastCount

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lengthscan.measure.text.countbpe.engine import CountEngine
    from lengthscan.measure.text.countbpe.tiling import Tiler
    from lengthscan.measure.text.handle import TokenizerHandle

#: ``count_engine`` values: the count-only BPE engine where it is proven exact, or the tokenizer always.
COUNT_ENGINES = ("auto", "tokenizers")
#: ``RoleStrategies.speculation``'s answers.
NONE, PENDING, CONFIRMED, FAILED = "none", "pending", "confirmed", "failed"
CHAT_OFFSETS = ("rendered conversations: tokenized by tokenizers for their offsets, or where proven (the chat "
                "field's token_offsets) by the count-only engine's merges")
SPECULATED = "counted with tokenizer.json as tokenizers loads it, while the fast path is proven apart"


class RoleStrategies:
    """The strategies of one tokenizer's roles, chosen on first use."""

    def __init__(self, handle: TokenizerHandle, *, count_engine: str = "auto", verify_counts: int = 0,
                 prove_beside: bool = False, conversations_only: bool = False):
        if count_engine not in COUNT_ENGINES:
            raise ValueError(f"count_engine {count_engine!r}: one of {', '.join(COUNT_ENGINES)}")
        self.handle = handle
        self.count_engine = count_engine
        self.verify_counts = int(verify_counts)
        #: a proof the cache does not hold yet is made in a thread while the fast path counts
        #: (``beside.py``); False: made before the role's first count (a worker's, an actor's)
        self.prove_beside = prove_beside
        self._reset()
        #: a run's counter begins loading and proving at once, while the source is opened (``early.py``)
        self._early = Early(handle, engine=count_engine == "auto", file=not conversations_only) if prove_beside \
            else None

    def _reset(self) -> None:
        self._exact: dict[str, CountStrategy] = {}
        self._deciders: dict[str, DecideOnly | None] = {}
        self._snapshot: Tokenizer | None = None  # the private backend copy, shared by roles (all in input mode)
        # (engine or None, why), built once; a Proving while proven beside the counting
        self._engine: tuple[CountEngine | None, str] | Proving | None = None
        self._tiler: Tiler | bool | None = None  # rendered conversations' offsets (False: refused)
        self.tiler_reason = ""
        self._speculated: dict[str, list[str]] = {}  # role -> its first texts, counted on the file's backend
        self._may_speculate = False

    # -- exact counting ---------------------------------------------------------------------
    def exact(self, role: str, texts: list[str]) -> CountStrategy:
        """The exact strategy of ``role``; ``texts`` (its first) take part in the proofs made now."""
        strategy = self._exact.get(role)
        if strategy is None:
            strategy = self._exact[role] = self._choose(role, texts)
        return strategy

    def _choose(self, role: str, texts: list[str]) -> CountStrategy:
        handle = self.handle
        memo = handle.memo()
        method = memo.method(role) if memo is not None and not handle.loaded else None
        if method is None and self._may_speculate and role != CHAT_ROLE and not self._early.asked:
            # counted with the file's backend (every role the same) while transformers loads it apart
            backend = self._snapshot if self._speculated else (
                self._early.file_backend() if self._snapshot is None else None)
            if backend is not None:
                self._speculated[role] = texts[:64]
                method = RoleMethod(METHOD_FAST, SPECULATED, backend)
        if method is None:
            method = prove(handle.tokenizer, role, texts, handle.call_ids, backend=self._snapshot, owned=handle.owned)
            if memo is not None:
                memo.remember(role, method, handle.loaded_info())
        if method.method != METHOD_FAST:
            return CallCount(handle.call_ids, role, method.reason)
        if self._snapshot is None:
            self._snapshot = method.backend
        fast = FastCount(self._snapshot, role, method.reason)  # one backend copy for every role
        return self._count_only(fast, role, [t for t in texts[:64] if len(t) <= 20_000])

    def _count_only(self, fast: FastCount, role: str, probe: list[str]) -> CountStrategy:
        """``fast`` under the count-only engine where it is proven for the role, else ``fast``
        with why not."""
        if self.count_engine == "tokenizers":
            fast.engine_reason = self.tiler_reason = "--count-engine tokenizers"
            return fast
        self._start_engine(fast.backend)
        if role == CHAT_ROLE:  # the renderings' offsets: the engine's where ``tiler`` is proven
            fast.engine_reason = CHAT_OFFSETS
            return fast
        if isinstance(self._engine, Proving):
            return ProvingCount(fast, self._engine, lambda engine, why: self._adopt(fast, role, probe, engine, why))
        return self._adopt(fast, role, probe, *self._engine)

    def _start_engine(self, backend) -> None:
        """The count-only engine (one for every role: they share the backend snapshot), proven
        beside the counting where that was asked and its proof is not cached."""
        from lengthscan.measure.text.countbpe.counting import engine_for
        from lengthscan.sources.cache_dir import cache_root

        if self._engine is None:
            cache = cache_root() / "countbpe"
            found = engine_for(backend, cache, cached_only=True) if self.prove_beside else None
            early = self._early

            def proven():  # a first run's prover process makes it into the cache: waited for once the backend is read
                return engine_for(backend, cache, ready=early.engine_made if early is not None else None)
            self._engine = found if found is not None else (
                Proving(proven) if self.prove_beside else engine_for(backend, cache))

    def tiler(self, probe: list[str]) -> Tiler | None:
        """Token offsets of rendered conversations by the count-only engine (``countbpe/tiling.py``),
        once the engine is proven and the offsets agree with the backend's on the adversarial texts;
        None: not (``tiler_reason`` says why), or not yet. ``probe``: renderings, should the chat
        role be chosen now."""
        if self._tiler is not None:
            return self._tiler or None
        strategy, engine = self.exact(CHAT_ROLE, probe), self._engine
        if isinstance(engine, Proving):
            engine = engine.result()
        if engine is None or strategy is None or strategy.backend is None:
            return None
        from lengthscan.measure.text.countbpe.counting import ADVERSARIAL
        from lengthscan.measure.text.countbpe.engine import component_state
        from lengthscan.measure.text.countbpe.proof import Refused
        from lengthscan.measure.text.countbpe.tiling import Tiler

        engine, why = engine
        self._tiler, self.tiler_reason = False, why
        if engine is None:
            return None
        try:
            tiler = Tiler(engine, component_state(strategy.backend.post_processor))
            parted = tiler.agrees(strategy.backend, list(ADVERSARIAL))
        except Refused as exc:
            self.tiler_reason = f"count-only engine: {exc}"
            return None
        if parted is not None:
            self.tiler_reason = f"count-only engine's offsets part from the tokenizer's on {parted[:40]!r}"
            return None
        self._tiler, self.tiler_reason = tiler, why
        return tiler

    def _adopt(self, fast: FastCount, role: str, probe: list[str], engine: CountEngine | None,
               why: str) -> CountStrategy:
        """``fast`` under ``engine`` where it agrees with the tokenizer on the role's probes, else
        ``fast`` with why not."""
        from lengthscan.measure.text.countbpe.counting import role_engine

        fast.engine_reason = why
        if engine is None:
            return fast
        recount = self.handle.call_ids
        counted, why = role_engine(engine, fast.backend, role, probe, verify=self.verify_counts,
                                   recount=lambda texts, r: [len(ids) for ids in recount(texts, r)])
        if counted is None:
            fast.engine_reason = why
            return fast
        return EngineCount(counted, fast, fast.engine_reason)

    # -- counting while transformers loads (early.py) ---------------------------------------
    @contextmanager
    def speculating(self):
        """Within this block a role chosen before transformers has loaded the tokenizer (a first
        run) is counted with ``tokenizer.json`` as ``tokenizers`` loads it; the caller holds what
        it counted until ``speculation`` says it is confirmed, or counts it again if not."""
        self._may_speculate = self._early is not None and self._early.first
        try:
            yield self
        finally:
            self._may_speculate = False

    def speculation(self, *, wait: bool = False) -> str:
        """``NONE`` (nothing counted on the file's backend awaits confirmation), ``PENDING`` (the
        prover process, ``confirm.py``, is still at work; ``wait``: waited for), ``CONFIRMED`` (the
        loaded tokenizer's backend serializes as the file's and the fast path is proven on it for
        every role counted: the counts stand) or ``FAILED`` (every role is chosen again: count again)."""
        if not self._speculated:
            return NONE
        early, handle = self._early, self.handle
        early.ask(self._speculated)
        answer = early.answer(wait=wait)
        if answer is None:
            return PENDING
        self._speculated = {}
        memo = handle.memo()
        if memo is not None:
            memo.forget()  # read again: what the prover wrote (the backend it proved, where the counts fail)
        if not answer.get("ok"):
            self._reset()
            return FAILED
        if answer.get("info"):
            handle.told(answer["info"])  # what the report says of the tokenizer (the prover loaded it)
        for role, reason in answer["reasons"].items():
            reason = f"{reason}; counted from the start with tokenizer.json as tokenizers loads it (the same)"
            strategy = self._exact[role]
            for part in (strategy, getattr(strategy, "fast", None)):
                if part is not None:
                    part.reason = reason
        return CONFIRMED

    # -- decide-only ------------------------------------------------------------------------
    def decider(self, role: str, probe: list[str], count: Callable[[list[str]], np.ndarray]) -> DecideOnly | None:
        """Decide-only counting of ``role`` where bounds are proven for it (None: count every row).
        ``count`` gives exact counts of texts that are no rows (the proof's probes)."""
        if role in self._deciders:
            return self._deciders[role]
        exact = self.exact(role, probe or ["probe text"])
        proof = None
        if exact.method == METHOD_FAST:
            proof = prove_bounds(exact.backend, int(count([""])[0]))
            texts = [t for t in list(PROBES) + list(probe) if t]
            if not holds_on(proof, exact.backend, texts, count):
                proof = None
            if proof is not None and proof.unit is None and not proof.prefix_ok and not proof.pieces:
                proof = None
        decider = self._deciders[role] = DecideOnly(proof, exact) if proof is not None else None
        return decider

    def proof(self, role: str) -> Bounds | None:
        """The decide-only proof already established for ``role`` (None: none, or not yet)."""
        decider = self._deciders.get(role)
        return decider.proof if decider is not None else None

    def settle(self) -> None:
        """The counting has ended: wait for a proof made beside it (written to the cache)."""
        for strategy in self._exact.values():
            if isinstance(strategy, ProvingCount):
                strategy.settle()

    # -- what the report says ---------------------------------------------------------------
    def methods(self) -> dict[str, str]:
        """role -> how it is counted (``backend.encode_batch_fast``, ``__call__``), for the roles counted so far."""
        return {role: s.method for role, s in self._exact.items()}

    def counting(self) -> dict[str, dict]:
        """role -> which engine counted it and why, with what the count-only engine did."""
        return {role: s.describe() for role, s in self._exact.items()}

    def reasons(self) -> dict[str, str]:
        """role -> why its method (the fast path's proof, or why there is none)."""
        return {role: s.reason for role, s in self._exact.items()}

    # -- pickling: a worker chooses again ---------------------------------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        # a worker or an actor proves before its first count (the proof is on disk by then, mostly)
        state.update(_exact={}, _deciders={}, _snapshot=None, _engine=None, _tiler=None, prove_beside=False,
                     _early=None, _speculated={}, _may_speculate=False)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
