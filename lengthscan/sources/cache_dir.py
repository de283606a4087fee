"""Where lengthscan keeps what it caches between runs: ``$LENGTHSCAN_CACHE``, else ``~/.cache/lengthscan``.

At the bottom of the stages, so every stage can name its own subfolder: ``sources/`` (row-count
manifests), ``lengths/`` (the length cache), ``tokenizers/``, ``demo/``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder: ``$LENGTHSCAN_CACHE`` if set, else ``~/.cache/lengthscan``."""
    return Path(os.environ.get("LENGTHSCAN_CACHE") or Path.home() / ".cache" / "lengthscan")


def file_stamp(path: str) -> tuple:
    """What identifies a file's content for the caches without reading it: path, size, mtime, and
    the inode's change time and number. A rewrite that keeps size and mtime (``touch -r``, a copy
    with ``cp -p``, a tool that restores timestamps) still changes ctime, which no user call sets."""
    st = os.stat(path)
    return os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
