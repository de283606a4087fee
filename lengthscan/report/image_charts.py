"""The HTML report's chart of image sizes: rows by the megapixels of their costliest image."""

from __future__ import annotations

from lengthscan.report.charts import base_spec

#: Megapixel bins (the last is open).
EDGES = (0, 0.25, 0.5, 1, 2, 4, 8, 16, 32)


def image_sizes_spec(kilopixels: dict) -> dict | None:
    """A bar chart of rows per megapixel bin (from ``ImageTally.kilopixels``), or None when empty."""
    counts = [0] * len(EDGES)
    for value, n in zip(kilopixels.get("values", []), kilopixels.get("counts", [])):
        mp = value / 1000
        k = max(i for i, lo in enumerate(EDGES) if mp >= lo)
        counts[k] += n
    if not any(counts):
        return None
    labels = [f"{lo:g}-{hi:g} MP" for lo, hi in zip(EDGES, EDGES[1:])] + [f">= {EDGES[-1]:g} MP"]
    return {**base_spec(180), "data": {"values": [{"size": lab, "rows": c, "order": i}
                                                  for i, (lab, c) in enumerate(zip(labels, counts))]},
            "mark": {"type": "bar", "color": "#4c78a8"},
            "encoding": {"x": {"field": "size", "type": "ordinal", "sort": {"field": "order"},
                               "title": "costliest image of the row (megapixels, EXIF orientation applied)"},
                         "y": {"field": "rows", "type": "quantitative", "title": "rows"},
                         "tooltip": [{"field": "size"}, {"field": "rows"}]}}
