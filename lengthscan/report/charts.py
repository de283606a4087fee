"""Vega-Lite chart specs from ``report.json``'s dict: plain dicts, binned data only (pure, no I/O).

Why Vega-Lite: a chart is a JSON document, so this module builds and tests every chart in Python
and the page only hands the specs to the runtime. Its scales do what long tails need (log x on
log-spaced bins, a symlog y that still shows a bin of one row, zoom and pan bound to the scales,
tooltips with counts), and the runtime (vega + vega-lite + vega-embed, BSD-3-Clause, maintained by
the UW Interactive Data Lab and the Vega community) is about 0.84 MB minified, against 4.8 MB for
Plotly's full bundle and 1.1 MB for ECharts. See ``assets/README.md`` and ``docs/report-json.md``.

Conventions the page's script relies on: a spec may carry ``usermeta.toggle``, ``{channel:
{option: {"scale": ..., "axis": ...}}}``; choosing an option sets those properties on every
layer's encoding of the channel that has a ``scale`` (``null`` marks pixel-positioned labels and
is left alone).
"""

from __future__ import annotations

import math

from lengthscan.report.actions import changed_label
from lengthscan.report.fmt import num, unit

BLUE, GREY, RED, ORANGE, GREEN, INK = "#4c78a8", "#bcc3cc", "#d62728", "#f58518", "#54a24b", "#555"
#: Percentile markers drawn on histograms (the tables list every percentile).
MARKERS = ("p50", "p90", "p99", "p99.9")
HEIGHT = 210
#: Log-axis room right of the last bar or line (a share of the axis), so their labels fit.
RIGHT_ROOM = 0.1
#: The width in pixels label placement assumes for a chart (half the page), so labels do not overlap.
LABEL_WIDTH = 460
#: Where the first row of line labels sits (pixels from the plot's top) and each row's height.
LABEL_TOP, LABEL_ROW = 4, 12

#: Shared look, passed once to the runtime (vega-embed's ``config``).
CONFIG = {
    "font": "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif",
    "view": {"stroke": None},
    "axis": {"labelColor": "#555", "titleColor": "#333", "gridColor": "#edf0f3", "domainColor": "#aab",
             "tickColor": "#aab", "labelFontSize": 11, "titleFontSize": 11, "titleFontWeight": 600},
    "legend": {"labelFontSize": 11, "titleFontSize": 11, "orient": "top", "direction": "horizontal"},
    "bar": {"stroke": "white", "strokeWidth": 0.5},
}


def base_spec(height: int = HEIGHT) -> dict:
    """The Vega-Lite settings every chart starts from: the container's width, ``height`` pixels tall."""
    return {"width": "container", "height": height, "autosize": {"type": "fit-x", "contains": "padding"}}


def _range_label(lo: float, hi: float, measure: str, integral: bool) -> str:
    """``128-152`` for integer bins ``[128, 153)``; ``[0.43, 0.51) s`` otherwise."""
    if integral:
        top = int(hi) - 1
        return f"{int(lo):,}" if top <= lo else f"{int(lo):,}-{top:,}"
    return f"[{num(lo, 3)}, {num(hi, 3)}) {unit(measure)}".rstrip()


def histogram_bins(field: dict, series: str = "rows") -> list[dict]:
    """One record per display bin: edges (a zero lower edge is drawn at half the next edge, so it
    fits a log axis), count, share, cumulative share, and a readable range."""
    edges, counts = field["display_histogram"]["edges"], field["display_histogram"]["counts"]
    total = sum(counts) or 1
    integral = all(float(e).is_integer() for e in edges)
    out, cum = [], 0
    for i, c in enumerate(counts):
        lo, hi = edges[i], edges[i + 1]
        cum += c
        out.append({"lo": lo if lo > 0 else hi / 2, "hi": hi, "count": c, "share": c / total, "cum": cum / total,
                    "range": _range_label(lo, hi, field["name"], integral), "series": series})
    return out


def markers(field: dict) -> list[dict]:
    """The percentile markers and the maximum of one field, for the rule layers."""
    out = [{"label": k, "value": field["percentiles"].get(k), "detail": f"{k} {num(field['percentiles'].get(k))}"}
           for k in MARKERS]
    out.append({"label": "max", "value": field["max"], "detail": f"max {num(field['max'])}"})
    return [m for m in out if m["value"] is not None]


def histogram_spec(field: dict, *, limits=(), rules=(), after: dict | None = None) -> dict:
    """A field's histogram on log x with percentile markers, limits (red) and ``--limit`` rules
    (orange) as vertical lines; ``after`` overlays the cleaned histogram (grey before, blue after)."""
    bins = histogram_bins(field, "before" if after else "rows")
    if after is not None:
        bins += histogram_bins(after, "after")
    lines = [dict(m, kind="percentile") for m in markers(field)]
    lines += [{"label": f"limit {num(v)}", "value": v, "detail": d, "kind": "limit"} for v, d in limits]
    lines += [{"label": f"{op} {num(v)}", "value": v, "detail": d, "kind": "rule"} for v, op, d in rules]
    lines = _merge_lines([ln for ln in lines if ln["value"] is not None])
    lo = min((b["lo"] for b in bins), default=1)
    hi = max([b["hi"] for b in bins] + [ln["value"] for ln in lines] + [lo * 2])
    lo = min([lo] + [ln["value"] for ln in lines if ln["value"] > 0])
    fmt = axis_format(field["name"])
    x_axis = {"format": fmt, "labelOverlap": "greedy", "grid": False}
    room = hi * (hi / lo) ** RIGHT_ROOM  # space for the labels of lines at the right end
    log_x = {"scale": {"type": "log", "domain": [lo, room], "nice": False},
             "axis": dict(x_axis, values=log_ticks(lo, hi))}
    lin_x = {"scale": {"type": "linear", "domain": [0, hi * 1.05], "nice": False},
             "axis": dict(x_axis, format=",~g" if unit(field["name"]) == "s" else ",", tickCount=6)}
    placed, rows = _place_labels(lines, lo, room)
    # the bars stop below the rows of line labels (LABEL_ROW px each): a label never lies over a bar
    band = [HEIGHT, LABEL_TOP + LABEL_ROW * rows + 4 if rows else 0]
    y_axis = {"format": ",~f", "tickCount": 5}
    lin_y = {"scale": {"type": "linear", "zero": True, "range": band}, "axis": y_axis}
    log_y = {"scale": {"type": "symlog", "zero": True, "range": band}, "axis": y_axis}
    x_title = f"{field['name']} ({unit(field['name'])})" if unit(field["name"]) else field["name"]
    bar = {
        "data": {"values": bins},
        "mark": {"type": "rect", "opacity": 0.9 if after else 1, "stroke": "white", "strokeWidth": 0.5},
        "params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
        "encoding": {
            "x": {"field": "lo", "type": "quantitative", "title": x_title, **log_x},
            "x2": {"field": "hi"},
            "y": {"field": "count", "type": "quantitative", "title": "rows", **lin_y},
            "y2": {"datum": 0},
            "tooltip": [{"field": "series", "title": "rows"} if after else None,
                        {"field": "range", "title": unit(field["name"]) or field["name"]},
                        {"field": "count", "title": "rows", "format": ","},
                        {"field": "share", "title": "share", "format": ".2%"},
                        {"field": "cum", "title": "rows up to here", "format": ".2%"}],
        },
    }
    bar["encoding"]["tooltip"] = [t for t in bar["encoding"]["tooltip"] if t]
    if after is not None:
        bar["encoding"]["color"] = {"field": "series", "type": "nominal", "title": None,
                                    "scale": {"domain": ["before", "after"], "range": [GREY, BLUE]}}
        bar["encoding"]["order"] = {"field": "series", "sort": "descending"}
    else:
        bar["mark"]["color"] = BLUE
    spec = base_spec()
    spec["layer"] = [bar, *_line_layers(placed)]
    spec["usermeta"] = {"toggle": {"x": {"log x": log_x, "linear x": lin_x},
                                   "y": {"linear y": lin_y, "log y": log_y}}}
    return spec


def axis_format(measure: str) -> str:
    """d3 format of an axis: SI prefixes for counts (``10k``), plain numbers for seconds (``0.5``)."""
    return ",~g" if unit(measure) == "s" else "~s"


def log_ticks(lo: float, hi: float, most: int = 9) -> list[float]:
    """Readable ticks for a log axis over ``[lo, hi]``: 1-2-5, else 1-3, else powers of ten."""
    if lo <= 0 or hi <= lo:
        return []
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = [float(f"{m}e{e}") for e in range(first, last + 1) for m in mantissas]
        ticks = [int(t) if t.is_integer() else t for t in ticks if lo <= t <= hi]
        if len(ticks) <= most:
            break
    return ticks


def _merge_lines(lines: list[dict]) -> list[dict]:
    """Lines of one kind at the same value become one line with both labels (``p99.9, max``)."""
    merged: dict = {}
    for ln in lines:
        key = (ln["kind"], ln["value"])
        if key in merged:
            merged[key] = dict(merged[key], label=f"{merged[key]['label']}, {ln['label']}",
                               detail=f"{merged[key]['detail']}; {ln['detail']}")
        else:
            merged[key] = ln
    return list(merged.values())


def _place_labels(lines: list[dict], lo: float, hi: float) -> tuple[list[dict], int]:
    """The lines with their labels staggered in rows at the top (``px``: pixels from the top,
    ``right``: drawn left of the line) so that neighbours do not overlap; and the rows used."""
    span = math.log(hi / lo) if lo > 0 and hi > lo else 1.0
    placed, rows_end = [], []
    for ln in sorted(lines, key=lambda d: d["value"]):
        pos = math.log(max(ln["value"], lo) / lo) / span if lo > 0 else 0.0
        width = (len(ln["label"]) * 6.2 + 10) / LABEL_WIDTH
        right = pos + width > 1
        start, end = (pos - width, pos) if right else (pos, pos + width)
        row = next((r for r, last in enumerate(rows_end) if start >= last), len(rows_end))
        if row == len(rows_end):
            rows_end.append(end)
        rows_end[row] = end
        placed.append(dict(ln, px=LABEL_TOP + LABEL_ROW * row, right=right))
    return placed, len(rows_end)


def _line_layers(placed: list[dict]) -> list[dict]:
    """Vertical rules, and their labels where ``_place_labels`` put them."""
    if not placed:
        return []
    style = {"percentile": (INK, [2, 3], 1), "limit": (RED, [6, 3], 2), "rule": (ORANGE, [6, 3], 2)}
    layers = []
    for kind, (color, dash, width) in style.items():
        vals = [p for p in placed if p["kind"] == kind]
        if not vals:
            continue
        layers.append({"data": {"values": vals},
                       "mark": {"type": "rule", "color": color, "strokeDash": dash, "strokeWidth": width},
                       "encoding": {"x": {"field": "value", "type": "quantitative"},
                                    "tooltip": [{"field": "detail", "title": kind}]}})
        for right in (False, True):
            side = [p for p in vals if p["right"] == right]
            if side:
                layers.append({"data": {"values": side},
                               "mark": {"type": "text", "align": "right" if right else "left", "dx": -3 if right else 3,
                                        "baseline": "top", "fontSize": 10, "color": color},
                               "encoding": {"x": {"field": "value", "type": "quantitative"},
                                            "y": {"field": "px", "type": "quantitative", "scale": None},
                                            "text": {"field": "label"}}})
    return layers


def joint_spec(pair: dict, *, x_limits=(), y_limits=()) -> dict:
    """The input x target heatmap on the joint histogram's log-spaced bins (divided by the scales:
    seconds are stored in milliseconds), with the limits of either axis as lines."""
    edges, xs, ys = pair["joint"]["edges"], pair.get("x_scale") or 1, pair.get("y_scale") or 1
    cells = [{"i": i, "j": j, "n": c} for i, j, c in pair["joint"]["cells"]]
    # cells stay [bin, bin, count] (a few bytes each, however many); edges and labels are computed
    # in the page, from the edges given once
    top = max((max(c["i"], c["j"]) for c in cells), default=0)
    transform = []
    for axis, key, scale, name in (("x", "i", xs, pair["x"]), ("y", "j", ys, pair["y"])):
        lo, hi = f"edges[datum.{key}]", f"edges[datum.{key} + 1]"
        transform += [{"calculate": f"max({lo}, {hi} / 2) / {scale}", "as": f"{axis}0"},
                      {"calculate": f"{hi} / {scale}", "as": f"{axis}1"},
                      {"calculate": _range_expr(lo, hi, scale, name), "as": f"{axis}r"}]
    spec = base_spec(300)
    spec["params"] = [{"name": "edges", "value": edges[:top + 2]}]
    rect = {
        "data": {"values": cells},
        "transform": transform,
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 0.3},
        "params": [{"name": "zoom", "select": "interval", "bind": "scales"}],
        "encoding": {
            "x": {"field": "x0", "type": "quantitative", "scale": {"type": "log", "nice": False},
                  "title": f"{pair['x']} ({unit(pair['x'])})",
                  "axis": {"format": axis_format(pair["x"]), "grid": False}},
            "x2": {"field": "x1"},
            "y": {"field": "y0", "type": "quantitative", "scale": {"type": "log", "nice": False},
                  "title": f"{pair['y']} ({unit(pair['y'])})",
                  "axis": {"format": axis_format(pair["y"]), "grid": False}},
            "y2": {"field": "y1"},
            "color": {"field": "n", "type": "quantitative", "title": "rows",
                      "scale": {"type": "log", "scheme": "blues"},
                      "legend": {"orient": "right", "direction": "vertical", "format": "~s"}},
            "tooltip": [{"field": "xr", "title": pair["x"]}, {"field": "yr", "title": pair["y"]},
                        {"field": "n", "title": "rows", "format": ","}],
        },
    }
    spec["layer"] = [rect]
    for channel, limits in (("x", x_limits), ("y", y_limits)):
        for value, detail, kind in limits:
            spec["layer"].append({
                "data": {"values": [{"value": value, "detail": detail}]},
                "mark": {"type": "rule", "color": RED if kind == "limit" else ORANGE, "strokeDash": [6, 3],
                         "strokeWidth": 2},
                "encoding": {channel: {"field": "value", "type": "quantitative"},
                             "tooltip": [{"field": "detail", "title": kind}]}})
    return spec


def _range_expr(lo: str, hi: str, scale: int, measure: str) -> str:
    """A Vega expression for a bin's readable range, as ``_range_label`` writes it."""
    if scale == 1:
        return f"format({lo}, ',') + ({hi} - 1 > {lo} ? '-' + format({hi} - 1, ',') : '')"
    return f"'[' + format({lo} / {scale}, ',~g') + ', ' + format({hi} / {scale}, ',~g') + ') {unit(measure)}'"


DECISION_COLORS = {"kept": "#9db9d8", "truncated": ORANGE, "dropped": RED}


def decisions_spec(decisions: dict) -> dict:
    """Kept, truncated and dropped rows per split as one stacked bar each (shares; counts on hover)."""
    values = []
    changed = changed_label(decisions)  # "truncated", "turns dropped", "cropped" ...
    colors = {("kept" if k == "kept" else changed if k == "truncated" else k): c for k, c in DECISION_COLORS.items()}
    for s in decisions["splits"]:
        est = s.get("estimated") or {}
        for order, (name, key) in enumerate((("kept", "keep"), ("truncated", "truncate"), ("dropped", "drop"))):
            rec = {"split": s["split"], "decision": changed if key == "truncate" else name, "rows": s[name],
                   "order": order,
                   "share": s[name] / s["measured"] if s["measured"] else 0}
            if key in est:
                lo, hi = est[key]["interval"]
                rec["estimate"] = f"about {est[key]['rows']:,.0f} of {s['rows']:,} (95%: {lo:,.0f}-{hi:,.0f})"
            values.append(rec)
    tooltip = [{"field": "split"}, {"field": "decision"}, {"field": "rows", "title": "rows measured", "format": ","},
               {"field": "share", "format": ".2%"}]
    if any("estimate" in v for v in values):
        tooltip.append({"field": "estimate", "title": "whole split"})
    spec = base_spec(34 * len(decisions["splits"]) + 10)
    spec.update({
        "data": {"values": values},
        "mark": {"type": "bar", "height": {"band": 0.7}},
        "encoding": {
            "y": {"field": "split", "type": "nominal", "title": None},
            "x": {"field": "rows", "type": "quantitative", "stack": "normalize", "title": "share of rows",
                  "axis": {"format": "%"}},
            "color": {"field": "decision", "type": "nominal", "title": None,
                      "scale": {"domain": list(colors), "range": list(colors.values())}},
            "order": {"field": "order"},
            "tooltip": tooltip,
        },
    })
    return spec


STRATEGY_COLORS = {"random": GREY, "group_by_length": BLUE}
BEFORE_COLORS = {"random (before cleaning)": "#e1e5ea", "group_by_length (before cleaning)": "#b3c9e0"}
PARTS = {"input": "input_padding_share", "target": "target_padding_share"}


def batches_spec(batches: dict, part: str, *, before: dict | None = None, what: str | None = None) -> dict | None:
    """Padding share of ``part`` (input or target) positions by batch size, random order next to
    ``group_by_length``; ``before`` (the batches before cleaning) adds lighter bars; ``what`` names the
    side (``sequence`` for conversations). None: no data."""
    values = _padding_values(batches, part, "")
    if before:
        values = _padding_values(before, part, " (before cleaning)") + values
    if not values:
        return None
    colors = {**(BEFORE_COLORS if before else {}), **STRATEGY_COLORS}
    what = what or ("label" if part == "target" else "input")
    spec = base_spec(170)
    spec.update({
        "data": {"values": values},
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "batch", "type": "ordinal", "title": "batch size", "sort": None, "axis": {"labelAngle": 0}},
            "xOffset": {"field": "strategy", "sort": list(colors)},
            "y": {"field": "share", "type": "quantitative", "title": f"{what} padding", "axis": {"format": "%"},
                  "scale": {"domain": [0, 1]}},
            "color": {"field": "strategy", "type": "nominal", "title": None,
                      "scale": {"domain": list(colors), "range": list(colors.values())},
                      "legend": {"columns": 2, "labelLimit": 260}},
            "tooltip": [{"field": "batch", "title": "batch size"}, {"field": "strategy", "title": "order"},
                        {"field": "share", "title": f"{what} padding", "format": ".1%"},
                        {"field": "largest", "title": "largest batch"}, {"field": "median", "title": "median batch"},
                        {"field": "batches", "title": "batches", "format": ","}],
        },
    })
    return spec


def _padding_values(batches: dict, part: str, suffix: str) -> list[dict]:
    values = []
    for entry in batches.get("by_batch_size") or []:
        for name, s in (entry.get("strategies") or {}).items():
            if s.get(PARTS[part]) is None:
                continue
            values.append({"batch": str(entry["batch_size"]), "strategy": name + suffix, "share": s[PARTS[part]],
                           "largest": _positions(s.get("largest_batch") or {}),
                           "median": _positions(s.get("median_batch") or {}), "batches": s.get("batches")})
    return values


def _positions(batch: dict) -> str:
    """``input 1,024 / target 256 positions``."""
    parts = [f"{k} {num(batch[k])}" for k in ("input", "target") if batch.get(k) is not None]
    return " / ".join(parts) + " positions" if parts else "-"
