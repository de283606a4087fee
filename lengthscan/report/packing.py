"""The packing panel of the report and its findings in words (``report.json["packing"]``)."""

from __future__ import annotations

from lengthscan.report.charts import base_spec


def packing_findings(packing: dict | None) -> list[str]:
    """"With bfd at 2,048, 1.2% of rows lose 3.4 M tokens (4.1%) ..." for each split."""
    if not packing:
        return []
    out = []
    multi = len(packing["splits"]) > 1
    for s in packing["splits"]:
        where = f"split {s['split']}: " if multi else ""
        asked = packing["max_length"]
        bins = f" (bins of {s['max_length']:,} tokens)" if s["strategy"] == "multipack" else ""
        head = f"{where}With {s['strategy']} packing at {asked:,} tokens{bins}"
        eff = f"{s['efficiency']:.1%}" if s["efficiency"] is not None else "n/a"
        text = f"{head}, {s['packs']:,} packs are {eff} full and an epoch takes {s['steps_per_epoch']:,} steps"
        plain = s["without_packing"]
        if plain["padding_share"] is not None:
            text += (f" (without packing: {plain['steps_per_epoch']:,} steps, {plain['padding_share']:.1%} of the "
                     "positions padding)")
        out.append(text + ".")
        if s["tokens_lost"]:
            share = s["rows_losing_tokens"] / max(s["rows"], 1)
            lost = (f"{head}, {share:.1%} of rows ({s['rows_losing_tokens']:,}) lose {_tokens(s['tokens_lost'])} "
                    f"({s['tokens_lost_share']:.1%} of all tokens): {_how_lost(s['strategy'])}")
            if s.get("bfd_split_efficiency") is not None and s["efficiency"] is not None:
                split_eff = s["bfd_split_efficiency"]
                lost += (f"; bfd_split keeps them, its packs {split_eff:.1%} full (bfd's {s['efficiency']:.1%})")
            out.append(lost + ".")
            if s.get("trained_tokens_lost") is not None:
                out.append(trained_finding(head, s))
        elif s["rows_split"] and s["strategy"] == "bfd_split":
            out.append(f"{head}, {s['rows_split']:,} rows are split across packs (no token is lost, but a split "
                       "row's parts are trained as separate sequences).")
        elif s["rows_split"] and s["strategy"] == "wrapped":
            out.append(f"{head}, {s['rows_split']:,} rows are cut across packs, and the rows in a pack attend to "
                       "each other (wrapped has no padding-free mode).")
        if s.get("trl_failing_batches"):
            out.append(f"{head}, TRL's pack_dataset fails: {s['trl_failing_batches']:,} of its 1,000-row batches hold "
                       "only empty rows (ArrowNotImplementedError in _pack_bfd); remove empty rows first.")
        if s["rows_without_length"]:
            out.append(f"{where}{s['rows_without_length']:,} rows have no length (no text, or over --max-chars): "
                       "they are packed as empty rows here; TRL fails on a missing text and packs a text over "
                       "--max-chars at full length.")
    return out


def trained_finding(head: str, s: dict) -> str:
    """The trained tokens (the loss mask) a packing cuts off: what it costs assistant-only SFT."""
    n, trained = s["trained_tokens_lost"], s.get("trained_tokens")
    share = f" ({s['trained_tokens_lost_share']:.1%})" if trained else ""
    text = (f"{head}, {_tokens(n)} of the {trained or 0:,} trained tokens{share} are cut off (the loss mask of "
            f"--train-on), in {s['rows_losing_trained_tokens']:,} rows")
    if s.get("rows_losing_every_trained_token"):
        text += f"; {s['rows_losing_every_trained_token']:,} of them lose every trained token"
    if s.get("rows_losing_tokens_without_trained_count"):
        text += (f"; {s['rows_losing_tokens_without_trained_count']:,} rows losing tokens have no trained count "
                 "(a template that rewrites earlier turns, or images, whose labels are not expanded)")
    return text + "."


def fill_spec(split: dict) -> dict | None:
    """A histogram of the packs' fill."""
    fill = split.get("fill") or {}
    counts, edges = fill.get("counts") or [], fill.get("edges") or []
    if not any(counts):
        return None
    values = [{"from": edges[i], "to": edges[i + 1], "packs": c} for i, c in enumerate(counts)]
    spec = base_spec(160)
    spec.update({
        "data": {"values": values},
        "mark": {"type": "bar", "color": "#4c78a8"},
        "encoding": {
            "x": {"field": "from", "type": "quantitative", "bin": {"binned": True, "step": edges[1] - edges[0]},
                  "title": f"pack fill (tokens / {split['max_length']:,})", "axis": {"format": "%"}},
            "x2": {"field": "to"},
            "y": {"field": "packs", "type": "quantitative", "title": "packs"},
            "tooltip": [{"field": "from", "format": ".0%", "title": "fill from"},
                        {"field": "to", "format": ".0%", "title": "to"}, {"field": "packs", "format": ","}],
        },
    })
    return spec


def packing_view(packing: dict | None, add) -> dict | None:
    """The packing panel: each split's figures, its table over L and its fill chart."""
    if not packing:
        return None
    return {"p": packing, "splits": [{"s": s, "chart": add(spec) if (spec := fill_spec(s)) else None}
                                     for s in packing["splits"]]}


def _how_lost(strategy: str) -> str:
    if strategy == "bfd":
        return "bfd cuts each row at L and discards the rest"
    if strategy == "knapsack":
        return "LLaMA-Factory cuts each row to cutoff_len - 1 tokens"
    return "axolotl drops every row longer than L (and of a single token) whole"


def _tokens(n: int) -> str:
    return f"{n / 1e6:.1f} M tokens" if n >= 1_000_000 else f"{n:,} tokens"
