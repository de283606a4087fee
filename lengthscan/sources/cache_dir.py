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
