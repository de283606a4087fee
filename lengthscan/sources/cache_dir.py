"""Where lengthscan keeps what it caches between runs: ``$LENGTHSCAN_CACHE``, else ``~/.cache/lengthscan``.

At the bottom of the stages, so every stage can name its own subfolder: ``sources/`` (row-count
manifests), ``lengths/`` (the length cache), ``tokenizers/``, ``fastpath/`` and ``countbpe/`` (the
counters' proofs), ``demo/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_cache_text(path: Path, text: str) -> None:
    """Write a cache file atomically (a temporary beside it, then renamed); a read-only or full
    cache costs time, never correctness, so an OSError is swallowed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def write_cache_json(path: Path, data) -> None:
    """``write_cache_text`` of ``data`` as JSON."""
    write_cache_text(path, json.dumps(data))


def cache_root() -> Path:
    """The cache folder: ``$LENGTHSCAN_CACHE`` if set, else ``~/.cache/lengthscan``."""
    return Path(os.environ.get("LENGTHSCAN_CACHE") or Path.home() / ".cache" / "lengthscan")


def file_stamp(path: str) -> tuple:
    """What identifies a file's content for the caches without reading it: path, size, mtime, and
    the inode's change time and number. A rewrite that keeps size and mtime (``touch -r``, a copy
    with ``cp -p``, a tool that restores timestamps) still changes ctime, which no user call sets."""
    st = os.stat(path)
    return os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
