"""A small JSON config named on the command line (``--adapter-config``, ``--quantization-config``)."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: str, *, flag: str, folder_file: str, missing: str, max_bytes: int, error) -> dict:
    """The JSON object at ``path`` (a folder: its ``folder_file``), or ``error`` naming ``flag`` and why not."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / folder_file
    if not p.exists():
        raise error(f"{flag} {path}: no such file ({missing})")
    if not p.is_file():
        raise error(f"{flag} {path}: not a regular file")
    if p.stat().st_size > max_bytes:
        raise error(f"{flag} {path}: {p.stat().st_size:,} bytes is not such a config")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{flag} {path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{flag} {path}: not a JSON object")
    return data
