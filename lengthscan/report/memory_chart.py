"""The memory panel's chart: the predicted peak of every simulated batch, the budget lines and the
worst batch (``report.json["memory"]``, from ``lengthscan memory SRC``)."""

from __future__ import annotations

import math

from lengthscan.report.charts import BLUE, INK, ORANGE, RED, base_spec
from lengthscan.report.fmt import size

#: Bars drawn for the per-batch memory chart: past this, each bar is the highest of a run of batches.
MEMORY_BARS = 1500
GIB = 1024 ** 3
#: a peak (or a budget line) this many times the median batch's puts the y axis on a log scale first
DWARFS = 20


def memory_spec(memory: dict) -> dict | None:
    """Predicted peak of every batch across the epoch (GiB), the worst batch marked, with the
    usable budget (red), the budget (grey) and the any-shuffle bound (orange) as lines. None: no data."""
    peaks = memory.get("per_batch_peak_bytes")
    values, every = (peaks["max"], peaks["every"]) if isinstance(peaks, dict) else (peaks or [], 1)
    if not values:
        return None
    total = (memory.get("per_batch") or {}).get("batches") or len(values) * every
    k = math.ceil(len(values) / MEMORY_BARS)
    values, every = [max(values[i:i + k]) for i in range(0, len(values), k)], every * k
    bars = []
    for i, v in enumerate(values):
        lo, hi = i * every, min((i + 1) * every, total)
        bars.append({"lo": lo, "hi": hi, "gib": v / GIB,
                     "range": f"batch {lo:,}" if hi - lo == 1 else f"batches {lo:,}-{hi - 1:,} (highest)"})
    worst = memory["worst_batch"]
    lines = [{"value": memory["any_shuffle"]["peak_bytes"] / GIB, "kind": "bound",
              "label": f"any shuffle {size(memory['any_shuffle']['peak_bytes'])}"}]
    if memory.get("budget_bytes"):
        lines += [{"value": memory["budget_bytes"] / GIB, "kind": "budget",
                   "label": f"budget {size(memory['budget_bytes'])}"},
                  {"value": memory["usable_bytes"] / GIB, "kind": "usable",
                   "label": f"usable {size(memory['usable_bytes'])} ({memory['margin']:.0%} margin)"}]
    top = max(max(b["gib"] for b in bars), *(ln["value"] for ln in lines))
    peaks_lo, peaks_hi = min(b["gib"] for b in bars), max(b["gib"] for b in bars)
    whole = {"scale": {"type": "linear", "zero": True, "domain": [0, top * 1.1], "nice": False}}
    zoomed = {"scale": {"type": "linear", "zero": False, "domain": [peaks_lo * 0.95, peaks_hi * 1.1 or 1],
                        "nice": False}}
    options = {"with budget": whole, "batches only": zoomed}
    if top > 4 * peaks_hi:  # the lines would flatten the bars: show the batches first
        options = {"batches only": zoomed, "with budget": whole}
    typical = sorted(b["gib"] for b in bars)[len(bars) // 2]
    if peaks_hi > DWARFS * typical or top > DWARFS * typical:  # one batch (or a line) dwarfs the rest: log first
        low = min([peaks_lo, *(ln["value"] for ln in lines)])
        log = {"scale": {"type": "log", "clamp": True, "domain": [low / 1.5, top * 1.5], "nice": False}}
        options = {"log scale": log, **options}
    y = dict(next(iter(options.values())))
    x = {"type": "quantitative", "scale": {"type": "linear", "domain": [0, total], "nice": False},
         "title": "batch (epoch order)", "axis": {"format": ",~d", "grid": False}}
    bar = {
        "data": {"values": bars},
        "mark": {"type": "rect", "color": BLUE, "clip": True, "stroke": None},
        "params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
        "encoding": {
            "x": {"field": "lo", **x},
            "x2": {"field": "hi"},
            "y": {"field": "gib", "type": "quantitative", "title": "predicted peak (GiB)", **y},
            "y2": {"datum": 0},
            "tooltip": [{"field": "range", "title": "batch"}, {"field": "gib", "title": "peak GiB", "format": ".4~f"}],
        },
    }
    point = {
        "data": {"values": [{"x": worst["index"] + 0.5, "gib": worst["peak_bytes"] / GIB,
                             "detail": f"worst batch #{worst['index']:,}: {size(worst['peak_bytes'])}"}]},
        "mark": {"type": "point", "filled": True, "color": RED, "size": 70, "clip": True},
        "encoding": {"x": {"field": "x", **x}, "y": {"field": "gib", "type": "quantitative", **y},
                     "tooltip": [{"field": "detail", "title": "worst"}]},
    }
    # the lines are named in a legend above the plot, not written over the bars they cross
    style = {"usable": (RED, [6, 3]), "budget": (INK, [2, 2]), "bound": (ORANGE, [4, 3])}
    shown = sorted(lines, key=lambda ln: list(style).index(ln["kind"]))
    labels = [ln["label"] for ln in shown]
    legend = {"title": None, "orient": "top", "direction": "horizontal", "symbolType": "stroke",
              "symbolStrokeWidth": 2, "labelLimit": 320}
    layers = [bar, point, {
        "data": {"values": shown},
        "mark": {"type": "rule", "strokeWidth": 2, "clip": True},
        "encoding": {"y": {"field": "value", "type": "quantitative", **y},
                     "color": {"field": "label", "type": "nominal", "legend": legend,
                               "scale": {"domain": labels, "range": [style[ln["kind"]][0] for ln in shown]}},
                     "strokeDash": {"field": "label", "type": "nominal", "legend": legend,
                                    "scale": {"domain": labels, "range": [style[ln["kind"]][1] for ln in shown]}},
                     "tooltip": [{"field": "label", "title": "line"}]}}]
    spec = base_spec(230)
    spec["layer"] = layers
    spec["usermeta"] = {"toggle": {"y": options}}
    return spec
