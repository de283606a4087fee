"""``report.html``: one self-contained page rendered from ``report.json``'s dict (formatting only).

The page inlines the vendored Vega runtime once (``assets/``, about 0.84 MB), the chart specs
built by ``charts.py`` from binned data only (display histograms, joint histogram cells,
percentiles: never raw rows), and tables rendered here. Every string from the data goes through
Jinja2's autoescape; the chart JSON sits in a ``<script type="application/json">`` with ``<``,
``>`` and ``&`` written as ``\\u003c``/``\\u003e``/``\\u0026``, so a text holding ``</script>`` or
``<!--`` cannot end the block. The page loads nothing: no CDN, no remote font, no source map.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from importlib import resources
from pathlib import Path

from lengthscan.report import charts
from lengthscan.report.actions import CHANGING, DONE, changed_label, changed_rows, row_action, rule_actions
from lengthscan.report.findings import findings
from lengthscan.report.fmt import (
    count,
    counting_line,
    field_groups,
    mean,
    num,
    padded_sides,
    percent,
    share,
    size,
    source_line,
    unit,
)
from lengthscan.report.image_charts import image_sizes_spec
from lengthscan.report.memory_chart import memory_spec
from lengthscan.report.packing import packing_view

__all__ = ["findings", "render_html", "script_json", "write_html"]

#: The runtime, in load order (each file is a UMD bundle that sets a global).
RUNTIME = ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js")
#: Bytes of chart JSON a page may hold: with the runtime (0.84 MB) and the tables, the page stays
#: under 5,000,000 bytes however many splits and cells the report has.
CHART_BUDGET = 3_000_000
#: Rows of the clean's worst-rows table and characters of a preview shown.
WORST_SHOWN, PREVIEW_CHARS = 100, 240


def render_html(data: dict, *, redact: bool = False) -> str:
    """The page for one ``report.json`` dict. ``redact=True`` leaves data text out: no previews
    or audio paths of rows, only row ids, decisions and lengths."""
    specs: dict[str, dict] = {}
    view = _view(data, specs, redact=redact)
    return _environment().get_template("report.html.j2").render(
        data=data, view=view, findings=findings(data), redact=redact,
        charts_json=script_json({"config": charts.CONFIG, "charts": specs}),
        runtime=_runtime(), style=_asset("report.css"), script=_asset("report.js"))


@cache
def _environment():
    """The page's Jinja2 environment, built once per process: compiling report.html.j2 takes longer than
    rendering it (0.3-0.8 s), and a process that writes many reports (a notebook, the test suite, a
    library caller) compiled it for every one. The loader still reloads the template if its file changes."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("lengthscan.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=num, count=count, unit=unit, mean=mean, gib=size, breakable=breakable)
    env.globals.update(share=share, percent=percent, shape_text=shape_text, row_action=row_action)
    return env


def breakable(text) -> str:
    """A rule or reason (escaped) that wraps after its ``:`` only: ``input_tokens<=256`` or
    ``sequence_tokens<=512:`` stay whole on a line, a longer piece or words wrap as text does."""
    from markupsafe import Markup, escape

    if text is None:
        return ""
    pieces = [p for p in re.split(r"(?<=:)", str(text)) if p]
    return Markup("<wbr>".join(Markup('<span class="nw">{}</span>').format(p) if len(p) <= 24 and " " not in p
                               else escape(p) for p in pieces))


def write_html(path: Path, data: dict, *, redact: bool = False) -> None:
    """Write ``render_html(data)`` to ``path`` (UTF-8)."""
    Path(path).write_text(render_html(data, redact=redact), encoding="utf-8")


def script_json(obj) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` left raw,
    so neither ``</script>`` nor ``<!--`` can appear; non-finite numbers become null."""
    text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


@cache
def _asset(name: str) -> str:
    return (resources.files("lengthscan.report") / "assets" / name).read_text(encoding="utf-8")


@cache
def _runtime() -> str:
    """The vendored bundles, without their ``sourceMappingURL`` comments (nothing to fetch)."""
    parts = []
    for name in RUNTIME:
        lines = _asset(name).splitlines()
        parts.append("\n".join(ln for ln in lines if not ln.startswith("//# sourceMappingURL=")))
    text = ";\n".join(parts)
    if "</script" in text.lower() or "<!--" in text:
        raise ValueError("a vendored runtime file would end its <script> block")
    return text


def _view(data: dict, specs: dict, *, redact: bool) -> dict:
    """What the template shows, with chart ids registered in ``specs``."""

    used = [0]

    def add(spec: dict) -> str | None:
        """Register a chart; None (a note instead) once the charts' data would pass the budget."""
        size = len(script_json(spec))
        if used[0] + size > CHART_BUDGET:
            return None
        used[0] += size
        key = f"chart-{len(specs)}"
        specs[key] = spec
        return key

    decisions = data.get("decisions") or {}
    clean = data.get("clean") or {}
    after = {s["split"]: s for s in clean.get("after") or []}
    by_split = {s["split"]: s for s in decisions.get("splits") or []}
    splits = []
    for split in data["splits"]:
        a = after.get(split["split"])
        fields = []
        for name, f in split["fields"].items():
            af = (a or {}).get("fields", {}).get(name)
            spec = charts.histogram_spec(f, limits=_limits(split, name), rules=_rules(decisions, name), after=af)
            fields.append({"name": name, "f": f, "after": af, "chart": add(spec)})
        pair = split.get("pair")
        joint = None
        if pair and pair["joint"]["cells"]:
            joint = add(charts.joint_spec(pair, x_limits=_axis_limits(split, decisions, pair["x"]),
                                          y_limits=_axis_limits(split, decisions, pair["y"])))
        images = (split.get("chat") or {}).get("images")
        sizes = add(image_sizes_spec(images["kilopixels"])) if images else None
        splits.append({"s": split, "fields": fields, "joint": joint, "after": a, "image_sizes": sizes,
                       "decisions": by_split.get(split["split"]), "pcts": _pct_keys(split)})
    batches = data.get("batches")
    return {
        "splits": splits,
        "kind": "clean" if data.get("clean") else ("audit with limits" if decisions else "audit"),
        "rows": sum(s["sample"]["rows_total"] for s in data["splits"]),
        "measured": sum(s["sample"]["rows_measured"] for s in data["splits"]),
        "sampled": [s for s in data["splits"] if s["sample"]["mode"] == "sample"],
        "decisions": bool(decisions.get("splits")),
        "decisions_chart": add(charts.decisions_spec(decisions)) if decisions.get("splits") else None,
        "actions": _actions_view(decisions),
        "batches_charts": [add(spec) for spec in _padding_charts(batches, clean.get("batches_before"),
                                                                 padded_sides(data))],
        "sides": padded_sides(data),
        "field_groups": field_groups(data),
        "worst_groups": (worst := _worst_groups(clean.get("worst_rows") or data.get("longest_rows"), redact=redact)),
        "previews": _previews(worst),
        "memory": _memory_view(data.get("memory"), add),
        "source_line": source_line(data["source"]) if data["source"].get("location") == "remote" else None,
        "counting_line": counting_line(data.get("tokenizer") or {}),
        "bytes_read": size(data["source"].get("bytes_read")),
        "bytes_total": size(data["source"].get("bytes_total")),
        "packing": packing_view(data.get("packing"), add),
    }


def _actions_view(decisions: dict) -> dict:
    """What the rules did, named by action: the changing actions the rules take (columns), each
    split's rows per action, and rule -> action for the tags of rows."""
    by_rule = rule_actions(decisions)
    changed = [changed_rows(s, by_rule) for s in decisions.get("splits") or []]
    present = set(by_rule.values()) | {a for c in changed for a in c}
    return {"by_rule": by_rule, "changed": changed, "done": DONE, "label": changed_label(decisions),
            "changing": [a for a in CHANGING if a in present] or ["truncate"]}


def _memory_view(memory: dict | None, add) -> dict | None:
    """The memory panel: its chart, the worst batch's terms (largest first) and rows with lengths."""
    if not memory or memory.get("mode") != "data":
        return None
    worst = memory["worst_batch"]
    total = worst["peak_bytes"] or 1
    terms = [{"name": k, "bytes": v, "share": v / total}
             for k, v in sorted(worst["terms"].items(), key=lambda kv: -kv[1])]
    names = list(worst.get("lengths") or {})
    rows = [{"row": r, "lengths": [worst["lengths"][n][i] for n in names]} for i, r in enumerate(worst["rows"])]
    spec = memory_spec(memory)
    return {"m": memory, "chart": add(spec) if spec else None, "terms": terms, "length_names": names, "rows": rows}


def shape_text(shape: dict, sides: dict) -> str:
    """``8 rows × 1,024 input_tokens × 128 target_tokens``."""
    parts = [f"{shape['batch_size']:,} rows"]
    parts += [f"{shape[k]:,} {sides[k]}" for k in ("input_len", "target_len")
              if k in sides and shape.get(k) is not None]
    return " × ".join(parts)


def _padding_charts(batches: dict | None, before: dict | None, sides: dict) -> list[dict]:
    if not batches or not batches.get("by_batch_size"):
        return []
    specs = (charts.batches_spec(batches, part, before=before, what=sides[part]) for part in ("input", "target"))
    return [spec for spec in specs if spec is not None]


def _pct_keys(split: dict) -> list[str]:
    first = next(iter(split["fields"].values()), None)
    return list(first["percentiles"]) if first else []


def _limits(split: dict, name: str) -> list[tuple]:
    """(value, detail) of the model and tokenizer limits on one measurement, once each."""
    seen, out = set(), []
    for check in split.get("limits", []):
        if check["measure"] == name and check["limit"] not in seen:
            seen.add(check["limit"])
            out.append((check["limit"], f"{check['name']} ({check['origin']}): {check['over_in_measured']:,} rows over"
                        + (f", {check['unknown_by_bound']:,} not known (decide-only bounds)"
                           if check.get("unknown_by_bound") else "")))
    return out


def _rules(decisions: dict, name: str) -> list[tuple]:
    """(threshold, op, detail) of the ``--limit`` rules on one measurement (not on ratios)."""
    return [(r["threshold"], r["op"], f"{r['rule']} -> {r['action']} ({r['origin']})")
            for r in decisions.get("rules") or [] if r["metric"] == name and r.get("threshold") is not None]


def _axis_limits(split: dict, decisions: dict, name: str) -> list[tuple]:
    return ([(v, d, "limit") for v, d in _limits(split, name)]
            + [(v, d, "rule") for v, _, d in _rules(decisions, name)])


def _worst_groups(rows, *, redact: bool) -> list[dict]:
    """The clean's worst rows grouped by the measurement they are longest in, in their order."""
    groups: dict = {}
    for r in _worst_rows(rows, redact=redact):
        groups.setdefault(r["field"] or "rows", []).append(r)
    return [{"field": name, "rows": items} for name, items in groups.items()]


def _worst_rows(rows, *, redact: bool) -> list[dict]:
    """The clean's worst rows as shown: previews cut to ``PREVIEW_CHARS``; none when redacted."""
    out = []
    for r in (rows or [])[:WORST_SHOWN]:
        item = {k: r.get(k) for k in ("split", "row", "id", "decision", "reason", "field")}
        item["lengths"] = r.get("lengths") or {}
        item["after"] = _after(r, item["lengths"])
        item["preview"] = {} if redact else {str(k): _cut(v) for k, v in (r.get("preview") or {}).items()}
        item["audio"] = None if redact else r.get("audio")
        out.append(item)
    return out


def _previews(groups: list[dict]) -> str | None:
    """What of the data's own rows the page shows (``text``, ``audio paths``, both), None: nothing."""
    rows = [r for g in groups for r in g["rows"]]
    shown = (("text", any(r["preview"] for r in rows)), ("audio paths", any(r["audio"] for r in rows)))
    kinds = [k for k, found in shown if found]
    return " and ".join(kinds) or None


def _after(row: dict, lengths: dict):
    """A cleaned row's measurements that cleaning changed, as (name, value after), the row's own
    measurement first; ``[]``: unchanged; None: dropped, or no ``after`` recorded (an audit)."""
    after = row.get("after")
    if "after" not in row or after is None:
        return None
    changed = [(k, v) for k, v in after.items() if v != lengths.get(k)]
    return sorted(changed, key=lambda kv: kv[0] != row.get("field"))


def _cut(text) -> str:
    """A preview on a few lines: whitespace runs collapsed, newlines shown as ⏎, cut short."""
    text = " ⏎ ".join(" ".join(line.split()) for line in ("" if text is None else str(text)).splitlines())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"
