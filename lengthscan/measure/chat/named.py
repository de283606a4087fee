"""``--chat-template NAME``: a chat template TRL ships in its wheel (``trl/chat_templates/NAME.jinja``:
``qwen3``, ``llama3``, ``gemma3``, ``qwen3_training`` with ``{% generation %}`` blocks, ...), found
without importing TRL; a name that is no shipped template gets the closest ones."""

from __future__ import annotations

import difflib
import os
from pathlib import Path


class UnknownTemplate(ValueError):
    """A name that is neither a file nor a template TRL ships (exit 2)."""


def looks_like_name(spec: str) -> bool:
    """``spec`` is a bare name (no folder part) that is not a file here."""
    return os.sep not in spec and "/" not in spec and not os.path.exists(spec)


def shipped_folder() -> Path | None:
    """TRL's ``chat_templates`` folder, where TRL is installed (None where it is not)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        folder = Path(root) / "chat_templates"
        if folder.is_dir():
            return folder
    return None


def shipped_names() -> list[str]:
    folder = shipped_folder()
    return sorted(p.stem for p in folder.glob("*.jinja")) if folder is not None else []


def shipped_template(name: str) -> Path:
    """The file of TRL's template ``name`` (``qwen3`` or ``qwen3.jinja``); ``UnknownTemplate`` naming
    the closest shipped names, or how to get them."""
    stem = name[:-len(".jinja")] if name.endswith(".jinja") else name
    folder = shipped_folder()
    if folder is None:
        raise UnknownTemplate(f"--chat-template {name}: no such file, and no template of that name: named templates "
                              "are the ones TRL ships (pip install trl), else give a Jinja file")
    path = folder / f"{stem}.jinja"
    if path.is_file():
        return path
    names = shipped_names()
    close = difflib.get_close_matches(stem, names, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UnknownTemplate(f"--chat-template {name}: no such file, and TRL ships no template of that name; {hint}"
                          f"its templates: {', '.join(names)}")


def training_swap(text: str) -> tuple[str, str, str] | None:
    """(original name, training name, training text) where ``SFTTrainer(assistant_only_loss=True)``
    renders with TRL's training template instead of ``text``: a template without ``{% generation %}``
    blocks that is, character for character, one of the originals TRL ships beside a
    ``NAME_training.jinja`` (trl's ``get_training_chat_template`` compares them so, and trains with
    the ``_training`` one); None otherwise (TRL itself refuses an unknown template without blocks)."""
    folder = shipped_folder()
    if folder is None:
        return None
    for training in sorted(folder.glob("*_training.jinja")):
        original = training.with_name(training.name[:-len("_training.jinja")] + ".jinja")
        try:
            if original.is_file() and original.read_text(encoding="utf-8") == text:
                return original.stem, training.stem, training.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None
