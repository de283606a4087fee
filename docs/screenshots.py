"""Write docs/assets/demo-audit.svg: the terminal summary of ``lengthscan demo`` (the offline demo's audit),
as rich records it, for the README and the site (a text file, so the repository holds no binary).

    python docs/screenshots.py

Rerun it when the terminal summary changes; the numbers are those of this Python's standard library.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"


def main() -> None:
    from rich.console import Console
    from rich.text import Text

    from lengthscan.demo import run_demo
    from lengthscan.report.terminal import render_summary

    with tempfile.TemporaryDirectory() as tmp:
        # a fresh cache, so the summary is a first run's (the counting method, not "cached lengths"),
        # shown under the default cache folder's name
        os.environ["LENGTHSCAN_CACHE"] = str(Path(tmp) / "cache")
        result = run_demo(out=str(Path(tmp) / "lengthscan-demo"), command="lengthscan demo")
        console = Console(record=True, width=104, file=open("/dev/null", "w"), force_terminal=True)
        console.print(Text("$ lengthscan demo", style="bold"))
        render_summary(result.to_dict(), console)
        console.print(Text("wrote ./lengthscan-demo/lengths.parquet, report.json, report.html "
                           "(open report.html in a browser)", style="dim"))
        svg = console.export_svg(title="lengthscan demo")
        svg = svg.replace(os.environ["LENGTHSCAN_CACHE"].replace(" ", "&#160;"), "~/.cache/lengthscan")
    ASSETS.mkdir(exist_ok=True)
    path = ASSETS / "demo-audit.svg"
    path.write_text(svg, encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
