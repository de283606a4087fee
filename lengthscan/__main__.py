"""``python -m lengthscan``."""

from .cli import main

raise SystemExit(main())
