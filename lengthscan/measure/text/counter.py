"""Token lengths exactly as the model receives them, at the fast tokenizer's own speed.

A length is ``len(tokenizer(text)["input_ids"])`` for inputs and
``len(tokenizer(text_target=text)["input_ids"])`` for targets: special tokens included, no
truncation, no padding. For speed we call the backend ``tokenizers.Tokenizer.encode_batch_fast``
directly (no offsets, no Python per token, the tokenizer's own threads) only where that is
proven to give the same ids for this tokenizer and role:

1. structurally: a fast tokenizer whose ``__call__``/``_encode_plus`` are transformers' own
   (they reduce to ``backend.encode_batch(texts, add_special_tokens=True)``), and, for targets,
   no separate target mode (``_switch_to_target_mode``: Marian, MBart, NLLB, M2M100, ...);
2. empirically: on probe strings (empty, whitespace, Unicode that normalizers change, special
   tokens written out) and the first real texts of the role, ids equal ``__call__``'s.

Anything else uses ``__call__`` itself, batched. Which method ran is recorded per role.

``TokenCounter`` is the entry point: a tokenizer handle (``handle.py``: loading, hash, what the
report says of it, pickling) and the counting strategies of its roles (``strategies.py``: the
tokenizer's call, the fast path, the count-only BPE engine; ``decide.py``: decide-only), each
role's chosen in one place (``choice.py``). Here: the rows triaged (missing, empty, too long),
chunked, and handed to the role's strategy.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from lengthscan.measure.records import FLAG_EMPTY, FLAG_MISSING, FLAG_TOO_LONG, TokenizerInfo
from lengthscan.measure.text.choice import COUNT_ENGINES, RoleStrategies
from lengthscan.measure.text.chunking import chunks
from lengthscan.measure.text.decide import DecideOnly, decide_count
from lengthscan.measure.text.fastpath import CHAT_ROLE, METHOD_CALL, METHOD_FAST
from lengthscan.measure.text.handle import TokenizerHandle

__all__ = ["CHAT_ROLE", "CHUNK_CHARS", "COUNT_ENGINES", "DEFAULT_MAX_CHARS", "METHOD_CALL", "METHOD_FAST",
           "TokenCounter"]

#: Texts longer than this many characters are recorded as too long instead of tokenized, so one
#: pathological row cannot hang the audit or exhaust memory (``--max-chars`` raises it).
DEFAULT_MAX_CHARS = 10_000_000

#: Characters handed to the tokenizer in one call: bounds memory whatever the row sizes.
CHUNK_CHARS = 4_000_000


class TokenCounter:
    """Counts tokens per role for one tokenizer; picklable (reloads by name in workers).

    ``tokenizer`` is a local directory, a hub name, or an already loaded tokenizer object.
    ``handle`` is the tokenizer; ``roles`` chooses and holds each role's counting strategy.
    ``prove_beside``: a run's counter, whose proofs begin as it is made (``early.py``);
    ``conversations_only``: it counts rendered conversations alone (only the engine's proof begins);
    ``share_backend``: a run's counter whose tokenizer only the run calls (a directory or hub name
    it loads itself): counted on the tokenizer's own backend, not a copy (``fastpath.shared_backend``).
    """

    def __init__(self, tokenizer, *, revision: str | None = None, trust_remote_code: bool = False,
                 max_chars: int = DEFAULT_MAX_CHARS, name: str | None = None, count_engine: str = "auto",
                 verify_counts: int = 0, prove_beside: bool = False, conversations_only: bool = False,
                 share_backend: bool = False):
        if count_engine not in COUNT_ENGINES:  # before a hub name is loaded
            raise ValueError(f"count_engine {count_engine!r}: one of {', '.join(COUNT_ENGINES)}")
        self.handle = TokenizerHandle(tokenizer, revision=revision, trust_remote_code=trust_remote_code, name=name,
                                      share_backend=share_backend)
        self.roles = RoleStrategies(self.handle, count_engine=count_engine, verify_counts=verify_counts,
                                    prove_beside=prove_beside, conversations_only=conversations_only)
        self.max_chars = max_chars
        self._aside = 0  # > 0: texts counted now are no rows (probes, prefixes, truncation searches)

    # -- the tokenizer (handle.py) ----------------------------------------------------------
    @property
    def name(self) -> str:
        return self.handle.name

    @property
    def tokenizer(self):
        """The transformers tokenizer, loaded on first use."""
        return self.handle.tokenizer

    @property
    def loaded(self) -> bool:
        return self.handle.loaded

    def facts(self, *, load: bool = True):
        """What rendering conversations reads off the tokenizer, without loading it where an
        earlier run on these files remembered it (``TokenizerHandle.facts``)."""
        return self.handle.facts(load=load)

    @property
    def hash(self) -> str:
        return self.handle.hash

    def model_max_length(self) -> int | None:
        """The tokenizer's real ``model_max_length`` (None for transformers' placeholder)."""
        return self.handle.model_max_length()

    def info(self, cached: set[str] = frozenset()) -> TokenizerInfo:
        """What the report says of the tokenizer; ``cached`` roles had their lengths from the cache.

        When every length came from the cache the tokenizer was never loaded: its class and
        ``model_max_length`` are then read from ``tokenizer_config.json``.
        """
        methods = {role: "cached lengths" for role in sorted(cached)}
        methods.update(self.roles.methods())
        cls, fast, max_len = self.handle.description()
        return TokenizerInfo(name=self.name, cls=cls, is_fast=fast, hash=self.hash, methods=methods,
                             model_max_length=max_len, counting=self.roles.counting())

    def settle(self) -> None:
        """The counting has ended: a count-only proof made beside it (``prove_beside``) is waited
        for, so that the next run finds it in the cache."""
        self.roles.settle()

    def speculating(self):
        """A block where a first run's roles may be counted while transformers loads the tokenizer
        (``RoleStrategies.speculating``); ``speculation`` says whether those counts stand."""
        return self.roles.speculating()

    def speculation(self, *, wait: bool = False) -> str:
        """``RoleStrategies.speculation``: none, pending, confirmed or failed (count again)."""
        return self.roles.speculation(wait=wait)

    def methods(self) -> dict[str, str]:
        """role -> how it is counted (``backend.encode_batch_fast``, ``__call__``), for the roles counted so far."""
        return self.roles.methods()

    def counting(self) -> dict[str, dict]:
        """role -> which engine counted it and why, with what the count-only engine did."""
        return self.roles.counting()

    # -- counting rows ----------------------------------------------------------------------
    def count(self, texts: list, role: str) -> tuple[np.ndarray, np.ndarray]:
        """Token counts of ``texts`` for ``role``: (lengths with -1 where none, flag codes).

        None is missing (no length); "" is measured (special tokens only) and flagged empty;
        a text over ``max_chars`` is flagged too long and not tokenized. Non-strings raise
        TypeError naming their position in ``texts``.
        """
        n = len(texts)
        lengths = np.full(n, -1, np.int64)
        flags, todo = self._triage(texts)
        if len(todo) == n:
            lengths[:] = self.count_strings(texts, role)
        elif todo:
            lengths[np.asarray(todo)] = self.count_strings([texts[i] for i in todo], role)
        return lengths, flags

    def count_ids(self, texts: list, role: str) -> tuple[np.ndarray, np.ndarray, list]:
        """As ``count``, keeping the ids (None where no length): ``clean --tokenize`` writes them
        without tokenizing a second time."""
        n = len(texts)
        lengths = np.full(n, -1, np.int64)
        flags, todo = self._triage(texts)
        ids: list = [None] * n
        for i, row in zip(todo, self.ids([texts[i] for i in todo], role) if todo else []):
            ids[i] = row
            lengths[i] = len(row)
        return lengths, flags, ids

    def decide_count(self, texts: list, role: str, limit: int):
        """Decide-only counting against an upper ``limit``: (lengths, flags, at_least, at_most);
        see ``decide.decide_count``."""
        return decide_count(self, texts, role, limit)

    def _triage(self, texts: list) -> tuple[np.ndarray, list[int]]:
        """Flags (missing, too long, empty) and the positions to tokenize; TypeError on a non-string."""
        flags = np.zeros(len(texts), np.int8)
        todo: list[int] = []
        for i, text in enumerate(texts):
            if text is None:
                flags[i] = FLAG_MISSING
            elif not isinstance(text, str):
                raise TypeError(f"position {i}: {type(text).__name__} value {str(text)[:60]!r} is not text")
            elif len(text) > self.max_chars:
                flags[i] = FLAG_TOO_LONG
            else:
                if not text:
                    flags[i] = FLAG_EMPTY
                todo.append(i)
        return flags, todo

    # -- counting strings, by the role's strategy (choice.py) -------------------------------
    def count_strings(self, texts: list[str], role: str, rows=None) -> np.ndarray:
        """Exact lengths of non-empty strings (no triage of None, "" or over-long texts). ``rows``
        (a mask; None: all) says which texts are rows, for the count-only engine's tallies."""
        strategy = self.roles.exact(role, texts)
        out = np.empty(len(texts), np.int64)
        if self._aside:
            rows = np.zeros(len(texts), bool)
        for start, stop in chunks(texts, CHUNK_CHARS):
            out[start:stop] = strategy.count(texts[start:stop], None if rows is None else rows[start:stop])
        return out

    def ids(self, texts: list[str], role: str) -> list[list[int]]:
        """Token ids of strings for ``role`` as ``__call__`` gives them (by the proven fast path
        where there is one)."""
        strategy = self.roles.exact(role, texts)
        out: list = []
        for start, stop in chunks(texts, CHUNK_CHARS):
            out += strategy.ids(texts[start:stop])
        return out

    def fast_backend(self, role: str, probe: list[str]):
        """The backend ``role`` is counted with when the fast path is proven for it (None: use
        ``__call__``); ``probe`` texts take part in the proof when it is made now."""
        return self.roles.exact(role, probe).backend

    def chat_tiler(self, probe: list[str]):
        """Rendered conversations' token offsets by the count-only engine, where it is proven
        (``RoleStrategies.tiler``; None: not, or not yet); ``probe``: renderings."""
        return self.roles.tiler(probe)

    def empty_length(self, role: str) -> int:
        """The length of "" for ``role`` (its special tokens), remembered per tokenizer file hash so a
        run on cached lengths does not load the tokenizer just for it."""
        from lengthscan.sources.cache_dir import cache_root, read_cache_json, write_cache_json

        path = cache_root() / "tokenizers" / f"{self.hash}.json"
        known = read_cache_json(path) if path.exists() else None
        known = known if isinstance(known, dict) else {}
        if role not in known:
            known[role] = int(self.count([""], role)[0][0])
            write_cache_json(path, known)
        return int(known[role])

    @contextmanager
    def aside(self):
        """Texts counted in this block are no rows of the count-only engine's tallies and
        ``--verify-counts`` sample: proof probes, prefixes, truncation searches (their rows were
        measured, or decided, already)."""
        self._aside += 1
        try:
            yield self
        finally:
            self._aside -= 1

    # -- decide-only (decide.py, bounds.py) -------------------------------------------------
    def decider(self, role: str, probe: list[str]) -> DecideOnly | None:
        """Decide-only counting of ``role`` where bounds are proven for it (None: count every row);
        ``probe`` texts take part in the proof when it is made now."""
        with self.aside():
            return self.roles.decider(role, probe, lambda t: self.count_strings(t, role))

    def bounds(self, role: str, probe: list[str]):
        """The proven decide-only shortcuts for ``role`` (None: none; count everything)."""
        decider = self.decider(role, probe)
        return decider.proof if decider is not None else None

    def proof(self, role: str):
        """The decide-only proof already established for ``role`` (None: none, or not yet)."""
        return self.roles.proof(role)
