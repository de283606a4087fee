"""Loading a tokenizer by name or directory, and hashing its files for cache keys and reports."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from lengthscan.sources.source import first_line

_WEIGHT_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt", ".gguf")


class TokenizerError(RuntimeError):
    """The tokenizer could not be loaded."""


def load_tokenizer(name_or_path: str, *, revision: str | None = None, trust_remote_code: bool = False):
    """``AutoTokenizer.from_pretrained`` for a local directory or a hub name, quietly."""
    from lengthscan.sources.hub import hub_offline, looks_local, offline_reason

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if not str(name_or_path).strip():
        raise TokenizerError("the tokenizer is an empty name: give a tokenizer folder or a hub name")
    local = Path(name_or_path).expanduser().exists()
    if looks_local(name_or_path) and not local:
        raise TokenizerError(f"cannot load tokenizer {name_or_path!r}: no such file or directory (a local path; "
                             "a hub name looks like 'gpt2' or 'org/name')")
    path = Path(name_or_path).expanduser()
    if local:
        refuse_special_files(path, name_or_path)
    if path.is_file():
        folder = tokenizer_folder_of(path)
        if folder is None:
            return _load_tokenizer_file(path)
        name_or_path = str(folder)
    offline = not local and hub_offline()  # fast, once: no minute of retries without a network
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError ...
        if offline:
            raise TokenizerError(f"cannot load tokenizer {name_or_path!r}: {offline_reason()} and it is not in the "
                                 "local Hugging Face cache; give a local directory with the tokenizer's files, or "
                                 "run once with network to cache it") from None
        if local:
            raise TokenizerError(f"cannot load tokenizer {name_or_path!r}: {_local_problem(path, exc)}") from exc
        raise TokenizerError(f"cannot load tokenizer {name_or_path!r} as a hub name (no such repo, or no access?): "
                             f"{first_line(exc)}") from exc


def refuse_special_files(path: Path, name: str) -> None:
    """A FIFO, socket or device given as the tokenizer, or in the folder it is loaded from, is a
    ``TokenizerError`` naming it: transformers (and the length cache's reading of
    ``tokenizer_config.json``) would open it by name and block, or never end."""
    from lengthscan.sources.streams import special_entry

    path = Path(path)
    folder = path if path.is_dir() else tokenizer_folder_of(path) if path.is_file() else None
    for place in (path, folder):
        if place is not None and (special := special_entry(place)) is not None:
            raise TokenizerError(f"cannot load tokenizer {name!r}: {special} (a read of it would block or never end)")


def tokenizer_folder_of(path: Path) -> Path | None:
    """The folder to load for a tokenizer file given as ``--tokenizer``: its own folder where that
    holds the tokenizer's configuration (special tokens, chat template) beside it; None for a lone
    ``tokenizer.json``, loaded by itself."""
    if path.name in TOKENIZER_FILES and (path.parent / "tokenizer_config.json").is_file():
        return path.parent
    return None


def _load_tokenizer_file(path: Path):
    """A lone ``tokenizers`` JSON file (``tokenizer.json``): ``PreTrainedTokenizerFast`` over it, its
    post-processor adding the special tokens it names (no tokenizer_config.json: no chat template)."""
    if path.suffix != ".json":
        raise TokenizerError(f"cannot load tokenizer {str(path)!r}: a {path.suffix or 'suffixless'} file without "
                             "tokenizer_config.json beside it; give a tokenizer.json, or the folder that holds the "
                             "tokenizer's files (as save_pretrained writes them)")
    from transformers import PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as exc:  # tokenizers' own parse errors
        raise TokenizerError(f"cannot load tokenizer {str(path)!r}: not a tokenizers JSON file "
                             f"({first_line(exc)})") from None
    tokenizer.name_or_path = str(path)  # a file: what it does not say (special tokens) is known unknown
    return tokenizer


#: files a saved tokenizer folder holds (one of them at least)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "merges.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "source.spm")


def _local_problem(path: Path, exc: Exception) -> str:
    """What is wrong with a local tokenizer folder, in words a user can act on."""
    import json

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return (f"the folder holds no tokenizer files (one of {', '.join(TOKENIZER_FILES[:5])} ...); give the folder "
                "that save_pretrained wrote")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        try:
            if (path / name).is_file():
                json.loads((path / name).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as bad:
            return f"{path / name} is not valid JSON ({bad})"
    return " ".join(str(exc).split())[:400] or type(exc).__name__


def hash_tokenizer(tokenizer, name_or_path: str | None = None) -> str:
    """SHA-256 over the tokenizer's files: those of a local directory, else what it saves."""
    if name_or_path and Path(name_or_path).is_dir():
        return _hash_dir(Path(name_or_path))
    if name_or_path and Path(name_or_path).is_file():
        folder = tokenizer_folder_of(Path(name_or_path))
        return _hash_dir(folder) if folder is not None else _hash_files([Path(name_or_path)])
    with tempfile.TemporaryDirectory(prefix="lengthscan-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        return _hash_dir(Path(tmp))


def _hash_dir(path: Path) -> str:
    return _hash_files(sorted(p for p in path.iterdir() if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES)))


def _hash_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
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
