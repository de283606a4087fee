"""``python -m lengthscan``."""

from lengthscan.cli.main import run

if __name__ == "__main__":  # importing the module (as documentation tools do) runs nothing
    raise SystemExit(run())
