"""Number formatting shared by the HTML page and its findings (pure, no I/O)."""

from __future__ import annotations

import math

#: Unit words by the last part of a measurement's name.
UNITS = {"tokens": "tokens", "seconds": "s", "samples": "samples", "frames": "frames"}


def num(value, digits: int = 2) -> str:
    """``1,432``; ``4.27``; ``0.0042``; ``-`` for None. Integral floats print as integers."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if not value.is_integer():
            if abs(value) < 1:
                return f"{value:.{digits}g}"
            return f"{value:,.{digits}f}".rstrip("0").rstrip(".")
    return f"{int(value):,}"


def mean(value) -> str:
    """A mean with the digits that matter: ``97,236``, ``607.2``, ``4.27``."""
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 1000 else 1 if abs(value) >= 100 else 2
    return num(round(float(value), digits), digits)


def count(value) -> str:
    """An estimated row count: a whole number with thousands separators."""
    return "-" if value is None else f"{value:,.0f}"


def share(part, whole) -> str:
    """``4.9%``, ``6%``, ``43%``; ``<0.1%`` for a small non-zero share; ``-`` when ``whole`` is 0."""
    if not whole:
        return "-"
    pct = 100 * part / whole
    if 0 < pct < 0.1:
        return "<0.1%"
    text = f"{pct:.1f}" if pct < 10 else f"{pct:.0f}"
    return text.removesuffix(".0") + "%"


def percent(fraction) -> str:
    """A fraction as the findings write it, one decimal: ``24.3%``, ``99.1%``; ``<0.1%`` for a small
    non-zero one; ``-`` for None."""
    if fraction is None:
        return "-"
    if 0 < fraction < 0.0005:
        return "<0.1%"
    return f"{fraction:.1%}"


def padded_sides(data: dict) -> dict:
    """What a batch's two padded sides are, in words: ``{"input": "input", "target": "label"}``, or
    ``"sequence"`` for the input side of conversations (the rendered sequence is what is padded)."""
    chat = any(f.get("role") == "chat" for f in data.get("fields") or [])
    return {"input": "sequence" if chat else "input", "target": "label"}


def field_groups(data: dict) -> list[tuple[list[str], str, str]]:
    """The measurements by where they come from, as the report says it: ``(names, columns, what)``,
    e.g. ``(["input_tokens"], "document", "text")``; a conversation's metrics come from its
    ``messages`` (or ``prompt`` and ``completion``) column, its image metrics from ``--images`` too."""
    chat = data.get("chat") or {}
    cols = chat.get("columns") or {}
    conversation = ", ".join(cols[k] for k in ("messages", "prompt", "completion") if cols.get(k))
    groups: dict = {}
    for f in data.get("fields") or []:
        column, what = f["column"], f.get("kind") or "text"
        if f.get("role") == "chat":
            column, what = conversation or column, "conversations"
            if f["name"] in ("image_tokens", "images") and cols.get("images"):
                column, what = f"{column}, {cols['images']}", "conversations and their images"
        groups.setdefault((column, what), []).append(f["name"])
    return [(names, column, what) for (column, what), names in groups.items()]


def unit(measure: str) -> str:
    """The unit word of a measurement (``input_tokens`` -> ``tokens``); ratios keep their name."""
    return UNITS.get(measure.rsplit("_", 1)[-1], "") if "/" not in measure else ""


def with_unit(value, measure: str) -> str:
    """``1,432 tokens``, ``30 s``."""
    u = unit(measure)
    return f"{num(value)} {u}" if u else num(value)


def times(a, b) -> str:
    """``a`` as a multiple of ``b``: ``17x``, ``2.8x``."""
    if not b:
        return "-"
    r = a / b
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


def size(nbytes) -> str:
    """Bytes in binary units: ``23.41 GiB``, ``512.0 MiB``, ``10.81 TiB``; ``-`` for None."""
    if nbytes is None:
        return "-"
    gib = nbytes / 1024 ** 3
    if abs(gib) >= 1024:
        return f"{gib / 1024:,.2f} TiB"
    return f"{gib:,.2f} GiB" if abs(gib) >= 1 else f"{nbytes / 1024 ** 2:,.1f} MiB"


def source_line(source: dict) -> str:
    """How a remote source was read: bytes of the total, requests, the unit, blocks and seed."""
    sampling = source.get("sampling") or {}
    unit = sampling.get("unit")
    how = f"; sample by {unit}" if unit else "; every row"
    if sampling.get("blocks_drawn") is not None:
        how += f", {sampling['blocks_drawn']:,} of {sampling['blocks_total']:,} blocks"
    if unit:
        how += f", seed {sampling.get('seed')}"
    if source.get("bytes_read") is None:
        return f"{source.get('resolved')}{how}"
    total = source["bytes_total"] or 0
    part = f" ({source['bytes_read'] / total:.1%})" if total else ""
    retries = f", {source['retries']:,} retried" if source.get("retries") else ""
    files, requests = source["files"], source["requests"]
    return (f"{size(source['bytes_read'])} of {size(total)}{part} in {files:,} file{'s' if files != 1 else ''}, "
            f"{requests:,} request{'s' if requests != 1 else ''}{retries}{how}; {source.get('resolved')}")


def counting_line(tokenizer: dict) -> str | None:
    """Which engine counted each role's tokens, in one line (None when nothing was counted): the
    count-only engine's name and tallies, else why it was not used."""
    counting = tokenizer.get("counting") or {}
    if not counting:
        return None
    parts, reasons = [], []
    for role, c in counting.items():
        if str(c.get("engine", "")).startswith("tiktoken"):
            tally = ""
            if "verified" in c:
                tally = (f" ({c['texts']:,} texts, {c['by_tokenizer']:,} left to the tokenizer, {c['verified']:,} "
                         "recounted by it and equal)")
            parts.append(f"{role}: {c['engine']} count-only, proven exact{tally}")
        else:
            parts.append(f"{role}: {c.get('engine')}")
            if c.get("reason") and c["reason"] not in reasons:
                reasons.append(c["reason"])
    return "; ".join(parts) + "".join(f" ({r})" for r in reasons)
