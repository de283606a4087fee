"""``python -m lengthscan``."""

from lengthscan.cli.main import run

raise SystemExit(run())
