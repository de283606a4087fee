"""``python -m lengthscan``."""

from .cli import run

raise SystemExit(run())
