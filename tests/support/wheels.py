"""Tokenizer files shipped in installed wheels (tests/requirements-tokenizers.txt, --no-deps)."""

from __future__ import annotations

from pathlib import Path

import pytest


def wheel_file(package: str, relative: str) -> Path | None:
    """A file shipped in an installed wheel, or None."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.exists() else None


def required_wheel_file(package: str, relative: str) -> Path:
    """A file shipped in an installed wheel; the test is skipped where the wheel is not installed."""
    path = wheel_file(package, relative)
    if path is None:
        pytest.skip(f"{package}'s {relative} not installed: pip install --no-deps -r tests/requirements-tokenizers.txt")
    return path
