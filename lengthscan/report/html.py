"""``report.html``: one self-contained page rendered from ``report.json``'s dict (formatting only)."""

from __future__ import annotations

import json
from pathlib import Path


def render_html(data: dict) -> str:
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("lengthscan.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    return env.get_template("report.html.j2").render(data=data, bars=_bars, raw_json=json.dumps(data["source"]))


def write_html(path: Path, data: dict) -> None:
    path.write_text(render_html(data), encoding="utf-8")


def _bars(display: dict) -> list[dict]:
    """Rows of the CSS bar chart: bin label, count, width in percent of the tallest bin."""
    counts = display["counts"]
    top = max(counts, default=0) or 1
    edges = display["edges"]
    out = []
    for i, c in enumerate(counts):
        lo, hi = edges[i], edges[i + 1] - 1
        out.append({"label": f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}", "count": c, "width": 100 * c / top})
    return out


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}f}"
    return f"{int(value):,}"
