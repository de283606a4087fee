"""Loading what a model's limits are read from: its config (required), its feature extractor and
tokenizer (optional), from a local folder, a ``config.json`` file or a hub name; a clear
``ModelError`` for what does not load."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lengthscan.sources.source import first_line


class ModelError(ValueError):
    """The model's config could not be loaded."""


@dataclass(frozen=True)
class ModelContext:
    """What limits are read from: the config, and the feature extractor and tokenizer when there are."""

    name: str
    config: object | None
    feature_extractor: object | None
    tokenizer: object | None


def load_model_context(name_or_path: str, *, revision: str | None = None, trust_remote_code: bool = False,
                       tokenizer=None) -> ModelContext:
    """Config (required), feature extractor and tokenizer (optional) of a directory, config file or hub name.

    ``tokenizer`` is a loaded tokenizer, a name or directory to load one from, or None to try the
    model's own. A ``config.json`` file path also looks for the other two beside it.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    name = str(name_or_path)
    path = Path(name).expanduser()
    config = read_config(name, revision=revision, trust_remote_code=trust_remote_code)
    if path.is_file():
        source = str(path.parent) if path.name == "config.json" else None
    else:
        source = str(path) if path.is_dir() else name
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    feature_extractor = _optional("AutoFeatureExtractor", source, kwargs) if source else None
    if feature_extractor is None and source and (Path(source) / "preprocessor_config.json").is_file():
        _unreadable_preprocessor(Path(source) / "preprocessor_config.json", kwargs)
    if isinstance(tokenizer, (str, os.PathLike)):
        from lengthscan.measure.text.loading import load_tokenizer

        tokenizer = load_tokenizer(str(tokenizer), revision=revision, trust_remote_code=trust_remote_code)
    elif tokenizer is None and source:
        tokenizer = _optional("AutoTokenizer", source, kwargs)
        # AutoTokenizer builds a tokenizer of special tokens only where there are no tokenizer
        # files (a config-only directory) instead of failing: that is no tokenizer
        if tokenizer is not None and len(tokenizer.get_vocab()) <= len(set(tokenizer.all_special_ids)):
            tokenizer = None
    return ModelContext(name, config, feature_extractor, tokenizer)


def read_config(name: str, *, revision=None, trust_remote_code: bool = False):
    """``AutoConfig`` of a model directory, ``config.json`` file or hub name; ModelError (one line:
    a local path that does not exist, a hub name offline, a config that does not load) otherwise."""
    from lengthscan.sources.hub import hub_offline, looks_local, offline_reason

    if not str(name).strip():
        raise ModelError("the model is an empty name: give a model folder, a config.json or a hub name")
    path = Path(name).expanduser()
    local = looks_local(name)
    if local and not path.exists():
        raise ModelError(f"cannot load model {name!r}: no such directory or config file (a local path; a hub name "
                         "looks like 'gpt2' or 'org/name')")
    if local:
        from lengthscan.sources.streams import special_entry

        for place in (path, path.parent if path.is_file() else None):
            if place is not None and (special := special_entry(place)) is not None:
                raise ModelError(f"cannot load model {name!r}: {special} (a read of it would block or never end)")
    offline = not local and hub_offline()  # fast, once: no minute of retries without a network
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path) if local else name, revision=revision,
                                          trust_remote_code=trust_remote_code)
    except Exception as exc:  # OSError, ValueError, KeyError (unknown model_type), JSON errors ...
        if offline:
            raise ModelError(f"cannot load model {name!r}: {offline_reason()} and its config is not in the local "
                             "Hugging Face cache; give a local directory (config.json, and the tokenizer or "
                             "feature extractor files), or run once with network to cache it") from None
        where = "local path" if local else "hub name (no such repo, or no access?)"
        raise ModelError(f"cannot load the config of model {name!r} as a {where}: {first_line(exc)}") from exc


def _unreadable_preprocessor(path: Path, kwargs: dict) -> None:
    """A local ``preprocessor_config.json`` that does not load is an error naming it, not a silent
    fall back to default rates (a missing one just means the model has no feature extractor)."""
    import json

    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read the feature extractor's settings: {first_line(exc)}") from None


def _optional(auto_class: str, source: str, kwargs: dict):
    """``transformers.<auto_class>.from_pretrained(source)``, or None: these parts are optional."""
    import transformers

    try:
        return getattr(transformers, auto_class).from_pretrained(source, **kwargs)
    except Exception:  # no preprocessor/tokenizer files, offline, unsupported: all mean "none"
        return None
