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
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lengthscan.measure.records import FLAG_EMPTY, FLAG_MISSING, FLAG_TOO_LONG, TokenizerInfo
from lengthscan.measure.text.chunking import chunks
from lengthscan.measure.text.fastpath import (
    CHAT_ROLE,
    METHOD_CALL,  # noqa: F401 - re-exported: the method names are the counter's
    METHOD_FAST,
    PROBES,
    Memo,
    RoleMethod,
    prove,
)
from lengthscan.measure.text.loading import (
    hash_tokenizer,
    load_tokenizer,
    refuse_special_files,
    tokenizer_max_length,
)

#: Texts longer than this many characters are recorded as too long instead of tokenized, so one
#: pathological row cannot hang the audit or exhaust memory (``--max-chars`` raises it).
DEFAULT_MAX_CHARS = 10_000_000

#: Characters handed to the tokenizer in one call: bounds memory whatever the row sizes.
CHUNK_CHARS = 4_000_000

#: ``count_engine`` values: the count-only BPE engine where it is proven exact, or the tokenizer always.
COUNT_ENGINES = ("auto", "tokenizers")


class TokenCounter:
    """Counts tokens per role for one tokenizer; picklable (reloads by name in workers).

    ``tokenizer`` is a local directory, a hub name, or an already loaded tokenizer object.
    """

    def __init__(self, tokenizer, *, revision: str | None = None, trust_remote_code: bool = False,
                 max_chars: int = DEFAULT_MAX_CHARS, name: str | None = None, count_engine: str = "auto",
                 verify_counts: int = 0):
        if count_engine not in COUNT_ENGINES:
            raise ValueError(f"count_engine {count_engine!r}: one of {', '.join(COUNT_ENGINES)}")
        self.count_engine = count_engine
        self.verify_counts = int(verify_counts)
        self.revision = revision
        self.trust_remote_code = trust_remote_code
        if isinstance(tokenizer, (str, os.PathLike)):
            self.name = str(tokenizer)
            self._tokenizer = None  # loaded on first use: a rerun on cached lengths never needs it
            if Path(self.name).exists():  # its files are read before it is loaded (its config, its hash)
                refuse_special_files(Path(self.name), self.name)
            if not Path(self.name).is_dir():
                self._load()  # a hub name: load now, so a bad name fails before any work
        else:
            self.name = name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            self._tokenizer = tokenizer
        self.max_chars = max_chars
        self._methods: dict[str, RoleMethod] = {}
        self._bounds: dict = {}
        self._aside = 0  # > 0: texts counted now are no rows (probes, prefixes, truncation searches)
        self._hash: str | None = None
        self._snapshot = None  # the private backend copy, shared by roles (both in input mode)
        self._engine = None    # (count-only engine or None, reason), built once for every role

    @property
    def tokenizer(self):
        """The transformers tokenizer, loaded on first use."""
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def _load(self) -> None:
        self._tokenizer = load_tokenizer(self.name, revision=self.revision, trust_remote_code=self.trust_remote_code)

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    # -- identity ---------------------------------------------------------------------------
    @property
    def hash(self) -> str:
        if self._hash is None:
            local = Path(self.name).exists()  # a folder, or a tokenizer file: hashed without loading it
            self._hash = hash_tokenizer(None if local else self.tokenizer, self.name)
        return self._hash

    def info(self, cached: set[str] = frozenset()) -> TokenizerInfo:
        """What the report says of the tokenizer; ``cached`` roles had their lengths from the cache.

        When every length came from the cache the tokenizer was never loaded: its class and
        ``model_max_length`` are then read from ``tokenizer_config.json``.
        """
        methods = {role: "cached lengths" for role in sorted(cached)}
        methods.update(self.methods())
        remembered = self._memo().info() if not self.loaded and self._memo() is not None else {}
        if self.loaded:
            cls, fast, max_len = (self._loaded_info()[k] for k in ("cls", "is_fast", "model_max_length"))
        elif remembered:
            cls, fast, max_len = (remembered.get(k) for k in ("cls", "is_fast", "model_max_length"))
        else:
            config = self._config()
            cls, fast = f"{config.get('tokenizer_class', '?')} (not loaded)", False
            max_len = tokenizer_max_length(SimpleNamespace(model_max_length=config.get("model_max_length")))
        return TokenizerInfo(name=self.name, cls=cls, is_fast=fast, hash=self.hash, methods=methods,
                             model_max_length=max_len, counting=self.counting())

    def _loaded_info(self) -> dict:
        tok = self._tokenizer
        return {"cls": type(tok).__name__, "is_fast": bool(getattr(tok, "is_fast", False)),
                "model_max_length": tokenizer_max_length(tok)}

    def methods(self) -> dict[str, str]:
        """role -> how it is counted (``backend.encode_batch_fast``, ``__call__``), for the roles counted so far."""
        return {role: m.method for role, m in self._methods.items()}

    def counting(self) -> dict:
        """role -> which engine counted it and why, with what the count-only engine did."""
        out = {}
        for role, m in self._methods.items():
            if m.engine is not None:
                out[role] = m.engine.to_dict(m.engine_reason)
            else:
                out[role] = {"engine": "tokenizers" if m.method == METHOD_FAST else "__call__",
                             "reason": m.engine_reason or m.reason}
        return out

    def model_max_length(self) -> int | None:
        """The tokenizer's real ``model_max_length`` (None for transformers' placeholder)."""
        if self.loaded:
            return tokenizer_max_length(self._tokenizer)
        remembered = self._memo().info() if self._memo() is not None else {}
        if remembered:
            return remembered.get("model_max_length")
        return tokenizer_max_length(SimpleNamespace(model_max_length=self._config().get("model_max_length")))

    def _config(self) -> dict:
        import json

        path = Path(self.name)
        path = (path.parent if path.is_file() else path) / "tokenizer_config.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def method_reasons(self) -> dict[str, str]:
        return {role: m.reason for role, m in self._methods.items()}

    # -- counting ---------------------------------------------------------------------------
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

    def ids(self, texts: list[str], role: str) -> list[list[int]]:
        """Token ids of strings for ``role`` as ``__call__`` gives them (by the proven fast path
        where there is one)."""
        method = self._methods.get(role) or self._decide(role, texts)
        if method.method != METHOD_FAST:
            return [list(ids) for ids in self._call_ids(texts, role)]
        out = []
        for start, stop in chunks(texts, CHUNK_CHARS):
            out += [e.ids for e in method.backend.encode_batch_fast(texts[start:stop], add_special_tokens=True)]
        return out

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

    def decide_count(self, texts: list, role: str, limit: int):
        """Decide-only counting against an upper ``limit``: (lengths, flags, at_least, at_most);
        see ``bounds.decide_count``."""
        from lengthscan.measure.text.bounds import decide_count

        return decide_count(self, texts, role, limit)

    def backend_for(self, role: str):
        """The backend tokenizer ``role`` is counted with (after its method is decided)."""
        return self._methods[role].backend

    def proof(self, role: str):
        """The decide-only proof already established for ``role`` (None: none, or not yet)."""
        return self._bounds.get(role)

    def bounds(self, role: str, probe: list[str]):
        """The proven decide-only shortcuts for ``role`` (None: none; count everything)."""
        if role in self._bounds:
            return self._bounds[role]
        method = self._methods.get(role) or self._decide(role, probe or ["probe text"])
        proof = None
        if method.method == METHOD_FAST:
            from lengthscan.measure.text.bounds import holds_on, prove

            with self.aside():
                specials = int(self.count_strings([""], role)[0])
                proof = prove(method.backend, specials)
                texts = [t for t in list(PROBES) + list(probe) if t]
                if not holds_on(proof, method.backend, texts, lambda t: self.count_strings(t, role)):
                    proof = None
            if proof is not None and proof.unit is None and not proof.prefix_ok and not proof.pieces:
                proof = None
        self._bounds[role] = proof
        return proof

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

    def count_strings(self, texts: list[str], role: str, rows=None) -> np.ndarray:
        """Exact lengths of non-empty strings (no triage of None, "" or over-long texts). ``rows``
        (a mask; None: all) says which texts are rows, for the count-only engine's tallies."""
        method = self._methods.get(role) or self._decide(role, texts)
        out = np.empty(len(texts), np.int64)
        if self._aside:
            rows = np.zeros(len(texts), bool)
        for start, stop in chunks(texts, CHUNK_CHARS):
            part = texts[start:stop]
            if method.engine is not None:
                out[start:stop] = method.engine.count(part, None if rows is None else rows[start:stop])
            elif method.method == METHOD_FAST:
                encodings = method.backend.encode_batch_fast(part, add_special_tokens=True)
                out[start:stop] = [len(e) for e in encodings]
            else:
                out[start:stop] = [len(ids) for ids in self._call_ids(part, role)]
        return out

    def _call_ids(self, texts: list[str], role: str) -> list[list[int]]:
        tok = self.tokenizer
        if role == "target":
            return tok(text_target=texts)["input_ids"]
        if role == CHAT_ROLE:
            return tok(texts, add_special_tokens=False)["input_ids"]
        return tok(texts)["input_ids"]

    def fast_backend(self, role: str, probe: list[str]):
        """The backend ``role`` is counted with when the fast path is proven for it (None: use
        ``__call__``); ``probe`` texts take part in the proof when it is made now."""
        method = self._methods.get(role) or self._decide(role, probe)
        return method.backend if method.method == METHOD_FAST else None

    # -- proof of the fast path (fastpath.py) -----------------------------------------------
    def _decide(self, role: str, texts: list[str]) -> RoleMethod:
        memo = self._memo()
        method = memo.method(role) if memo is not None and not self.loaded else None
        if method is None:
            method = prove(self.tokenizer, role, texts, self._call_ids)
            if memo is not None:
                memo.remember(role, method, self._loaded_info())
        if method.method == METHOD_FAST:
            if self._snapshot is not None:
                method.backend = self._snapshot  # one backend copy for every role (all in input mode)
            self._snapshot = method.backend
            self._engine_for(method, role, [t for t in texts[:64] if len(t) <= 20_000])
        self._methods[role] = method
        return method

    def _memo(self) -> Memo | None:
        """Where a local tokenizer folder's proven fast paths are remembered (None: not one)."""
        if self.trust_remote_code or not Path(self.name).is_dir():
            return None
        from lengthscan.sources.cache_dir import cache_root

        return Memo(cache_root() / "fastpath", self.hash)

    def _engine_for(self, method: RoleMethod, role: str, probe: list[str]) -> None:
        """The count-only engine for a role on the proven fast path, where it is proven too (chat
        renderings need offsets: always the tokenizer)."""
        if role == CHAT_ROLE:
            method.engine_reason = "conversations need offsets for their trained tokens: counted by tokenizers"
            return
        if self.count_engine == "tokenizers":
            method.engine_reason = "--count-engine tokenizers"
            return
        from lengthscan.measure.text.countbpe.counting import engine_for, role_engine
        from lengthscan.sources.cache_dir import cache_root

        if self._engine is None:  # one engine for every role: they share the backend snapshot
            self._engine = engine_for(method.backend, cache_root() / "countbpe")
        engine, method.engine_reason = self._engine
        if engine is not None:
            method.engine, why = role_engine(engine, method.backend, role, probe, verify=self.verify_counts,
                                             recount=lambda texts, r: [len(ids) for ids in self._call_ids(texts, r)])
            method.engine_reason = why or method.engine_reason

    # -- pickling: workers reload by name ---------------------------------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_methods"] = {}
        state["_bounds"] = {}
        state["_snapshot"] = None
        state["_engine"] = None
        if Path(self.name).is_dir():
            state["_tokenizer"] = None  # workers load it from the directory, once each
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
