"""Limits for a memory budget from the data: the longest inputs and targets (and the largest
batch) whose predicted peak fits, capped by the model's own limits, as ``clean --limit`` rules."""

from __future__ import annotations

import math

from lengthscan.memory.api import estimate
from lengthscan.memory.budget import largest_fitting, usable_bytes
from lengthscan.memory.epoch import Layout
from lengthscan.memory.options import MemoryOptions, Shape

#: Largest batch size searched.
MAX_BATCH = 4096


def recommend_limits(config, layout: Layout, batch_size: int, budget_bytes: int, *,
                     options: MemoryOptions = MemoryOptions(), margin: float = 0.1, caps: dict | None = None,
                     sampling_rate: int | None = None, parts: tuple[int, int] | None = None) -> dict:
    """The largest limits whose batches of ``batch_size`` fit ``budget x (1 - margin)``.

    Two sides (inputs ``a`` and targets ``b``): the input limit is the largest at the data's
    longest target (capped), then the target limit the largest at the smaller of that input limit
    and the longest input; a cleaned dataset's every batch is then within a shape that fits.
    When even one input token does not fit beside the longest target, the target limit is
    searched first. Decoder-only models search the concatenated sequence and split it (see
    :func:`split_sequence`; ``parts``: the longest input and target). ``caps`` maps ``a``/``b`` to
    the model's limits (None: none); ``sampling_rate`` turns a samples limit into seconds.
    """
    caps = caps or {}
    usable = usable_bytes(budget_bytes, margin)
    a_max = None if layout.a is None else int(layout.a.max())
    b_max = None if layout.b is None else int(layout.b.max())

    def shape(a, b, rows=batch_size) -> Shape:
        return Shape(rows, None if a is None else int(layout.pad_a(a)), None if b is None else int(layout.pad_b(b)),
                     padding=True)

    def search(side: str, make, data_max: int) -> dict:
        cap = caps.get(side)
        high = cap if cap else max(8 * data_max, 1024)
        value = largest_fitting(config, budget_bytes, make, high, options=options, margin=margin)
        capped = None if value is None or value < high else ("model limit" if cap else "search range")
        return {"value": value, "cap": cap, "capped_by": capped, "longest": data_max}

    out = {"batch_size": batch_size, "budget_bytes": budget_bytes, "margin": margin, "usable_bytes": usable}
    a = b = None
    if a_max is not None and b_max is not None:
        b0 = min(b_max, caps.get("b") or b_max)
        a = search("a", lambda n: shape(n, b0), a_max)
        a["at"] = {layout.b_name: b0}
        if a["value"] is not None:
            a_at = min(a["value"], a_max)
            b = search("b", lambda n: shape(a_at, n), b_max)
            b["at"] = {layout.a_name: a_at}
        else:
            a0 = min(a_max, caps.get("a") or a_max)
            b = search("b", lambda n: shape(a0, n), b_max)
            b["at"] = {layout.a_name: a0}
            if b["value"] is not None:
                b_at = min(b["value"], b_max)
                a = search("a", lambda n: shape(n, b_at), a_max)
                a["at"] = {layout.b_name: b_at}
    elif a_max is not None:
        a = search("a", lambda n: shape(n, None), a_max)
    else:
        b = search("b", lambda n: shape(None, n), b_max)
    out["a"], out["b"] = _named(a, layout.a_name), _named(b, layout.b_name)
    if parts is not None and a["value"] is not None:  # decoder-only, input + target: split the sequence
        out["split"] = split_sequence(a["value"], *parts)
    out["rules"] = clean_rules(layout, out["a"], out["b"], sampling_rate, out.get("split"))
    bound = shape(a_max, b_max)
    top = largest_fitting(config, budget_bytes, lambda n: Shape(n, bound.input_len, bound.target_len, padding=True),
                          MAX_BATCH, options=options, margin=margin)
    out["largest_batch_size"] = {"value": top, "capped_by": "search range" if top == MAX_BATCH else None,
                                 "at": {k: v for k, v in ((layout.a_name, a_max), (layout.b_name, b_max)) if k}}
    # what no limit removes: the state and a batch of one row of one token (or the shortest audio)
    one = shape(None if a_max is None else 1, None if b_max is None else 1, rows=1)
    if layout.a_name == "input_samples":
        one = Shape(1, int(layout.a.min()), one.target_len, padding=False)
    out["smallest_batch_bytes"] = estimate(config, one, options).peak_bytes
    return out


def _named(entry: dict | None, name: str | None) -> dict | None:
    return None if entry is None else {"measure": name, **entry}


def clean_rules(layout: Layout, a: dict | None, b: dict | None, sampling_rate: int | None,
                split: dict | None = None) -> list[str]:
    """The ``--limit`` rules for ``lengthscan clean`` that keep every batch within the limits found."""
    if split is not None:
        return [f"{k}<={v}" for k, v in split.items()]
    rules = []
    if a is not None and a["value"] is not None:
        if layout.a_name == "input_samples":
            if sampling_rate:
                # a clip of d seconds has at most ceil(d x rate) samples: round seconds down to a millisecond
                rules.append(f"input_seconds<={math.floor(a['value'] * 1000 / sampling_rate) / 1000:g}")
        else:
            rules.append(f"input_tokens<={a['value']}")
    if b is not None and b["value"] is not None:
        rules.append(f"target_tokens<={b['value']}")
    return rules


def split_sequence(total: int, input_longest: int, target_longest: int) -> dict:
    """Input and target limits summing to ``total`` for a decoder-only model fed input + target.

    Targets keep their longest row unless that leaves the inputs less than both their own longest
    row and half of ``total``: ``target = min(target_longest, max(total - input_longest, total // 2))``.
    """
    target = min(target_longest, max(total - input_longest, total // 2))
    return {"input_tokens": total - target, "target_tokens": target}


def as_sequence(memory: dict) -> None:
    """A conversation's prediction in its own words: the decoder's input is the rendered sequence,
    so every ``input_tokens`` the epoch was priced on is named ``sequence_tokens`` (sides, the worst
    batch's lengths, the limits found and the rows they were found at)."""
    def renamed(d: dict | None) -> dict | None:
        return None if d is None else {("sequence_tokens" if k == "input_tokens" else k): v for k, v in d.items()}

    memory["sides"] = {k: "sequence_tokens" if v == "input_tokens" else v for k, v in memory["sides"].items()}
    memory["worst_batch"]["lengths"] = renamed(memory["worst_batch"]["lengths"])
    memory["any_shuffle"]["rows"] = renamed(memory["any_shuffle"]["rows"])
    limits = memory.get("limits")
    if limits:
        for side in ("a", "b"):
            entry = limits.get(side)
            if entry:
                entry["measure"] = "sequence_tokens" if entry["measure"] == "input_tokens" else entry["measure"]
                if entry.get("at"):
                    entry["at"] = renamed(entry["at"])
        limits["largest_batch_size"]["at"] = renamed(limits["largest_batch_size"].get("at"))
