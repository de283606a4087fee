"""Which method counts a role: the backend's ``encode_batch_fast`` where it is proven to give
``__call__``'s ids, else ``__call__`` (see ``counter.py``; ``choice.py`` turns the method into
the role's counting strategy), and the proof remembered.

The proof is structural (transformers' own ``__call__`` and ``_encode_plus``, no separate target
mode) and empirical (the same ids on probe texts and the role's first texts). It depends only on
the tokenizer's files and the installed transformers and tokenizers, so it is remembered under
those: a later run with a tokenizer folder whose files hash the same reads the proven backend back
(``Memo``) and never imports transformers, which costs over a second a run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

METHOD_FAST = "backend.encode_batch_fast"
METHOD_CALL = "__call__"
#: The role of rendered chat texts: tokenized as ``apply_chat_template`` does, without special tokens.
CHAT_ROLE = "chat"

PROBES = (
    "",
    " ",
    "   leading and trailing   ",
    "Hello world. Hello, World!",
    "naïve café – “quoted” déjà vu",
    "e\u0301 combining, Å vs A\u030a",
    "ＡＢＣ ﬁ ½ Ⅻ ㎏ ｶﾀｶﾅ",
    "emoji 😀👍🏽 family 👨‍👩‍👧",
    "中文字符测试，日本語のテキスト。한국어",
    "مرحبا بالعالم",
    "tabs\tand\nnewlines\r\nmixed  \u00a0nbsp",
    "def f(x):\n    return x ** 2  # comment",
    "1234567890 3.14159 1e-10 0x1F",
    "a" * 300,
    "word " * 100,
)


@dataclass
class RoleMethod:
    """How one role is tokenized, and why: the fast path's proof (or why there is none)."""

    method: str
    reason: str
    backend: Tokenizer | None = None  # the proven backend copy (METHOD_FAST)


def prove(tok, role: str, texts: list[str], call_ids, backend=None, *, owned: bool = False) -> RoleMethod:
    """The method for ``role`` of a loaded transformers tokenizer; ``call_ids(texts, role)`` is
    ``__call__``'s ids. ``backend``: the copy another role was proven with (every fast role runs
    input mode, so one copy serves them all; copying a large vocabulary's costs a second).
    ``owned``: lengthscan loaded ``tok`` and nobody else calls it: its own backend serves where it
    is in input mode already and has no other mode to switch to (``shared_backend``)."""
    reason = structural_reason(tok, role)
    if reason is not None:
        return RoleMethod(METHOD_CALL, reason)
    if backend is None:
        backend = shared_backend(tok) if owned else None
        backend = backend if backend is not None else copy_backend(tok)
    probe = list(PROBES) + special_token_probes(tok) + [t for t in texts[:64] if len(t) <= 20_000]
    fast_ids = [e.ids for e in backend.encode_batch(probe, add_special_tokens=role != CHAT_ROLE)]
    theirs = [list(ids) for ids in call_ids(probe, role)]
    bad = next((i for i, (a, b) in enumerate(zip(fast_ids, theirs)) if a != b), None)
    if bad is not None:
        return RoleMethod(METHOD_CALL, f"backend ids differ from __call__ on probe {probe[bad][:40]!r}")
    return RoleMethod(METHOD_FAST, f"proven: same ids as __call__ on {len(probe)} probe texts", backend)


def structural_reason(tok, role: str) -> str | None:
    """None when the fast path is structurally sound for ``role``, else why not."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - older transformers
        return "transformers without TokenizersBackend: __call__ used"
    if not isinstance(tok, TokenizersBackend) or not getattr(tok, "is_fast", False):
        return f"{type(tok).__name__} is not a fast tokenizer"
    cls = type(tok)
    if cls.__call__ is not PreTrainedTokenizerBase.__call__:
        return f"{cls.__name__} overrides __call__"
    # transformers' own privates: __call__ goes through _encode_plus and the _switch_to_*_mode hooks
    if cls._encode_plus is not TokenizersBackend._encode_plus:
        return f"{cls.__name__} overrides _encode_plus"
    if role == "target" and hasattr(tok, "_switch_to_target_mode"):
        return f"{cls.__name__} has a separate target mode (text_target)"
    return None


def copy_backend(tok):
    """A private copy of the backend in input mode, untruncated and unpadded, as __call__ runs it
    (the fast path is only taken for a role whose ``__call__`` runs input mode)."""
    from tokenizers import Tokenizer

    if hasattr(tok, "_switch_to_input_mode"):  # transformers' own private hook, as __call__ runs it
        tok._switch_to_input_mode()
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(getattr(tok, "split_special_tokens", False))
    return backend


def input_backend(tok):
    """The loaded ``tok``'s backend as ``__call__`` runs it (input mode, untruncated, unpadded,
    splitting special tokens as ``tok`` does): its own where it is so, else a copy (``copy_backend``)."""
    own = _as_called(tok)
    return own if own is not None else copy_backend(tok)  # tok's own is left as it is


def _as_called(tok):
    """``tok``'s own backend, switched to input mode, where it is as ``__call__`` runs it
    (untruncated, unpadded, splitting special tokens as ``tok`` does); None where it is not."""
    if hasattr(tok, "_switch_to_input_mode"):
        tok._switch_to_input_mode()
    own = tok.backend_tokenizer
    if own.truncation is not None or own.padding is not None \
            or bool(own.encode_special_tokens) != bool(getattr(tok, "split_special_tokens", False)):
        return None
    return own


def shared_backend(tok):
    """``tok``'s own backend, to count with beside ``tok``'s own calls, where that is safe: a
    tokenizer without a target mode (whose switch would change the backend under the counting),
    its backend in input mode, untruncated, unpadded, splitting special tokens as ``tok`` does (its
    calls then leave it as it is: transformers sets a backend's truncation, padding or special-token
    splitting only where they differ from the call's); None otherwise."""
    if hasattr(tok, "_switch_to_target_mode"):
        return None
    return _as_called(tok)  # None: ``prove`` copies it (``copy_backend``), leaving ``tok``'s own as it is


def special_token_probes(tok) -> list[str]:
    specials = [t for t in getattr(tok, "all_special_tokens", []) if isinstance(t, str)][:8]
    return [f"{t} inside {t}text" for t in specials]


class Memo:
    """Proven fast paths remembered by tokenizer-files hash and library versions, with the backend
    snapshot and what the report says of the tokenizer (its class, ``model_max_length``)."""

    def __init__(self, root: Path, files_hash: str):
        versions = "-".join(_version(p) for p in ("transformers", "tokenizers", "lengthscan"))
        self.path = root / f"{files_hash[:32]}-{versions}.json"
        self._data: dict | None = None
        self._backend: Tokenizer | None = None  # the snapshot, loaded once
        self._loading = threading.Lock()

    def _read(self) -> dict:
        if self._data is None:
            from lengthscan.sources.cache_dir import read_cache_json

            data = read_cache_json(self.path) if self.path.exists() else None
            self._data = data if isinstance(data, dict) else {}
        return self._data

    def method(self, role: str) -> RoleMethod | None:
        """The remembered fast path of ``role`` with its backend, or None."""
        reason = (self._read().get("roles") or {}).get(role)
        backend = self.backend() if reason is not None else None
        if backend is None:
            return None
        return RoleMethod(METHOD_FAST, f"{reason} (remembered from an earlier run on these files)", backend)

    def backend(self) -> Tokenizer | None:
        """The proven backend snapshot, loaded once for every role (they share one backend copy;
        ``early.py`` may load it in a thread while the source is opened); None: none, or damaged."""
        with self._loading:
            if self._backend is None:
                self._backend = self._load_snapshot()
            return self._backend

    def _load_snapshot(self) -> Tokenizer | None:
        from tokenizers import Tokenizer

        from lengthscan.sources.cache_dir import read_cache_text

        snapshot = self.path.with_suffix(".tokenizer.json")
        if not snapshot.exists():
            return None
        text = read_cache_text(snapshot)  # a snapshot changed since it was proven is proven again
        if text is None:
            return None
        try:
            backend = Tokenizer.from_str(text)
        except Exception:  # a damaged cache file: prove again
            return None
        from lengthscan import heap

        heap.trim()  # the parsed JSON freed (three times the tokenizer's own size): its pages back
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(self._read().get("encode_special_tokens"))
        return backend

    def info(self) -> dict:
        return self._read().get("info") or {}

    def forget(self) -> None:
        """Read the file and the snapshot again when next asked (another process has written them)."""
        with self._loading:
            self._data = None
            self._backend = None

    def remembers(self) -> bool:
        """Some role's fast path is remembered here (a run on these files was made before)."""
        return bool(self._read().get("roles")) and self.path.with_suffix(".tokenizer.json").exists()

    def remember(self, role: str, method: RoleMethod, info: dict) -> None:
        """``role``'s fast path written to the file, read again under its lock first: the roles
        another process (a run's prover) remembered meanwhile stay."""
        if method.method != METHOD_FAST:
            return
        from lengthscan.sources.cache_dir import cache_file_locked, write_cache_json, write_cache_text

        snapshot = self.path.with_suffix(".tokenizer.json")
        if not snapshot.exists():
            write_cache_text(snapshot, method.backend.to_str())
        with cache_file_locked(self.path):
            self._data = None
            data = self._read()
            data.setdefault("roles", {})[role] = method.reason
            data["info"] = info
            data["encode_special_tokens"] = bool(method.backend.encode_special_tokens)
            write_cache_json(self.path, data)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "0"
