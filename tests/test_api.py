"""The public API: every exported name resolves to what it says, even after every submodule is imported
(a submodule named like a function would shadow it: ``lengthscan.audit`` must stay the function)."""

from __future__ import annotations

import importlib
import pkgutil

import lengthscan


def test_exports_are_not_shadowed_by_submodules():
    for info in pkgutil.walk_packages(lengthscan.__path__, "lengthscan."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    for name in lengthscan.__all__:
        value = getattr(lengthscan, name)
        assert not isinstance(value, type(lengthscan)), f"lengthscan.{name} is a module"
        assert callable(value) or isinstance(value, str), name
