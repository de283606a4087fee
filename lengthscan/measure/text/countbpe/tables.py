"""The rank tables of the count-only engine: derived from a BPE model once per process
(``proof.derive_model``), by one thread at a time per model, and cached on disk beside a digest
that a later run checks before it trusts the table."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np

from lengthscan.measure.text.countbpe.locks import acquire
from lengthscan.measure.text.countbpe.proof import Derived, derive_model

_DERIVED: dict[str, Derived] = {}  # rank tables built in this process, by the BPE model's hash
_LOCKS: dict[str, threading.Lock] = {}  # one per rank table: held while it is being made
_MAKING = threading.Lock()
_DERIVING: set[str] = set()  # the rank tables being derived now (not read from the cache)
#: id(backend) -> (that backend, its model's table key): handed once from the proof made for a
#: backend (``prefetch.prove_for``) to the engine built on it (``derived_of``), which then need not
#: serialize the model again (a third of a second on a 200k vocabulary)
_HANDED: dict[int, tuple[object, str]] = {}


def state_key(state: bytes) -> str:
    """The key of the rank table of the BPE model whose ``__getstate__`` is ``state`` (and of the
    libraries that derive and read it)."""
    from importlib import metadata

    versions = "-".join(metadata.version(p) for p in ("tokenizers", "lengthscan"))
    return hashlib.sha256(versions.encode() + b"\n" + state).hexdigest()[:32]


def hand_over(backend, state: bytes) -> None:
    """The table of ``backend``'s model (its ``state``) is made or read in this process: the
    engine's build on that same backend object takes it without serializing the model again."""
    key = state_key(state)
    if key in _DERIVED:
        _HANDED.clear()  # one at a time: a backend whose engine is never built is not held for long
        _HANDED[id(backend)] = (backend, key)


def derived_of(backend, cache_dir: Path | None, *, cached_only: bool = False, ready=None) -> Derived | None:
    """``derived_for`` the model of ``backend`` (a ``tokenizers.Tokenizer``); ``ready`` is called
    once the model is read, before the table is looked up."""
    held = _HANDED.pop(id(backend), None)
    if held is not None and held[0] is backend and held[1] in _DERIVED:
        if ready is not None:
            ready()
        return _DERIVED[held[1]]
    state = backend.model.__getstate__()
    if ready is not None:
        ready()
    return derived_for(state, cache_dir, cached_only=cached_only)


def derived_for(state: bytes, cache_dir: Path | None, *, cached_only: bool = False, model: dict | None = None,
                bpe=None, pairs: list | None = None) -> Derived | None:
    """The rank table of the BPE model whose ``__getstate__`` is ``state`` (``model``: that state
    read already; ``bpe``: the model itself, only read, and ``pairs``: its merges read, see
    ``derive_model``), made once per process and cached
    in ``cache_dir``. ``cached_only``: None where it is not made yet, or is being made by another
    thread (``prefetch.py``), which a call without it waits for."""
    key = state_key(state)
    if key in _DERIVED:
        return _DERIVED[key]
    with _MAKING:
        lock = _LOCKS.setdefault(key, threading.Lock())
    if not acquire(lock, lambda: key in _DERIVING, cached_only):
        return None
    try:
        if key in _DERIVED:  # made by the thread that held the lock
            return _DERIVED[key]
        path = cache_dir / f"ranks-{key}.npz" if cache_dir is not None else None
        derived = load_table(path) if path is not None else None
        if derived is None:
            if cached_only:
                return None
            _DERIVING.add(key)
            try:
                derived = derive_model(model if model is not None else json.loads(state), bpe, pairs)
            finally:
                _DERIVING.discard(key)
            if path is not None:
                save_table(path, derived)
        _DERIVED[key] = derived
        return derived
    finally:
        lock.release()


def save_table(path: Path, d: Derived) -> None:
    words = list(d.ranks)
    arrays = {"blob": np.frombuffer(b"".join(words), np.uint8),
              "sizes": np.fromiter(map(len, words), np.int64, len(words)),
              "ranks": np.fromiter(d.ranks.values(), np.int64, len(words)),
              "meta": np.array([d.merged, d.whole_only, int(d.ignore_merges)], np.int64)}
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, **arrays, digest=np.frombuffer(table_digest(arrays), np.uint8))
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs time, never correctness
        pass
    finally:  # stopped half-way (an error, Ctrl-C, a prover ended at exit): no half-written file left
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def table_digest(arrays: dict) -> bytes:
    """SHA-256 of the table's arrays, names, types and shapes included."""
    h = hashlib.sha256()
    for name in ("blob", "sizes", "ranks", "meta"):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}\n".encode())
        h.update(a.tobytes())
    return h.digest()


def load_table(path: Path) -> Derived | None:
    """The cached table, or None: missing, unreadable, or (with a warning, the file removed) not
    the table that was written, which would count wrong without a word."""
    from lengthscan.sources.cache_dir import MISMATCH, NO_CHECKSUM, distrust, regular_cache_file

    if not regular_cache_file(path):  # missing; or a FIFO, a device, a folder (removed, with a warning)
        return None
    try:
        with np.load(path) as z:
            arrays = {name: z[name] for name in ("blob", "sizes", "ranks", "meta")}
            digest = z["digest"].tobytes() if "digest" in z.files else None
    except (OSError, ValueError, KeyError, EOFError) as exc:
        distrust(path, f"content that does not read ({type(exc).__name__})")
        return None
    if digest != table_digest(arrays):
        distrust(path, NO_CHECKSUM if digest is None else MISMATCH)
        return None
    blob, sizes, ranks, meta = arrays["blob"].tobytes(), arrays["sizes"], arrays["ranks"], arrays["meta"]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    table = {blob[s:e]: int(r) for s, e, r in zip(starts.tolist(), ends.tolist(), ranks.tolist())}
    return Derived(table, int(meta[0]), int(meta[1]), bool(meta[2]))
