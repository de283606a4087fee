"""torch hidden from a process that never uses it.

transformers imports torch whenever it is installed (1-2 s and a few hundred MB of a tokenizer's
loading, in every process that loads one). The ``lengthscan`` commands that never use torch hide it
in their own process (``cli.main.run``), and their worker processes hide it too (``engines.loop``):
``importlib.util.find_spec`` (how transformers and datasets probe for it) answers None and
``import torch`` raises ModuleNotFoundError, which every optional use of it catches.
"""

from __future__ import annotations

import sys

_STATE = {"hidden": False}


def torch_hidden() -> bool:
    """torch is hidden in this process (worker processes should hide it as well)."""
    return _STATE["hidden"]


def hide_torch() -> None:
    """Make torch look uninstalled to this process (once; not where it is imported already).
    ``sys.modules["torch"] = None`` is not enough: some code tests ``"torch" in sys.modules`` and
    then imports it."""
    if _STATE["hidden"] or "torch" in sys.modules:
        return
    import importlib.abc
    import importlib.util

    def hidden(name: str) -> bool:
        return name == "torch" or name.startswith("torch.")

    class HideTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if hidden(name):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by lengthscan)", name=name)
            return None

    find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: None if hidden(name) else find_spec(name, package)
    sys.meta_path.insert(0, HideTorch())
    _STATE["hidden"] = True
