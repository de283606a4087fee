"""Loading a tokenizer by name or directory, and hashing its files for cache keys and reports."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_WEIGHT_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt", ".gguf")


class TokenizerError(RuntimeError):
    """The tokenizer could not be loaded."""


def load_tokenizer(name_or_path: str, *, revision: str | None = None, trust_remote_code: bool = False):
    """``AutoTokenizer.from_pretrained`` for a local directory or a hub name, quietly."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError ...
        where = "directory" if Path(name_or_path).is_dir() else "name (hub unreachable or no such repo?)"
        raise TokenizerError(f"cannot load tokenizer {name_or_path!r} as a {where}: {exc}") from exc


def hash_tokenizer(tokenizer, name_or_path: str | None = None) -> str:
    """SHA-256 over the tokenizer's files: those of a local directory, else what it saves."""
    if name_or_path and Path(name_or_path).is_dir():
        return _hash_dir(Path(name_or_path))
    with tempfile.TemporaryDirectory(prefix="lengthscan-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        return _hash_dir(Path(tmp))


def _hash_dir(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES)):
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def tokenizer_max_length(tokenizer) -> int | None:
    """The tokenizer's ``model_max_length`` when real, not transformers' 1e30 placeholder."""
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**9:
        return value
    return None
