"""The terminal summary: rich tables from ``report.json``'s dict. Formatting only."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from lengthscan.report.actions import DONE, changed_label, changed_rows, row_action, rule_actions
from lengthscan.report.fmt import counting_line, field_groups, source_line

SHOWN = ("p50", "p90", "p99", "p99.9")


def render_summary(data: dict, console: Console) -> None:
    """Print the header, one table of lengths per split, limits, and where the outputs are."""
    tok = data.get("tokenizer") or {}
    console.print(Text.assemble(("lengthscan ", "bold"), f"{data['lengthscan_version']}  ",
                                ("source ", "dim"), data["source"]["spec"]))
    if data["source"].get("location") == "remote":
        _say(console, source_line(data["source"]), head="read ")
        for note in data["source"].get("notes", []):
            _say(console, f"note: {note}", indent="  ", style="yellow")
    methods = ", ".join(f"{role}: {m}" for role, m in tok.get("methods", {}).items())
    if tok.get("name"):  # audio alone has no tokenizer
        _say(console, f"{tok.get('name')} ({tok.get('class')}; {methods})", head="tokenizer ")
    if (counted := counting_line(tok)) is not None:
        _say(console, counted, head="counted ")
    columns = "; ".join(f"{', '.join(names)} <- {column}" for names, column, _ in field_groups(data))
    console.print(Text.assemble(("fields ", "dim"), columns))
    chat = data.get("chat")
    if chat:
        template = chat["template"]
        blocks = "with" if template["generation_blocks"] else "without"
        console.print(Text.assemble(("chat ", "dim"), f"template {template['origin']} ({blocks} generation blocks); "
                                    f"--train-on {chat['train_on']}: {chat['trained_tokens']}; end of turn "
                                    f"{chat.get('end_of_turn_token') or '-'}"))
        if chat.get("images"):
            im = chat["images"]
            cap = f"; --max-pixels {im['max_pixels']:,}" if im.get("max_pixels") else ""
            console.print(Text.assemble(("images ", "dim"), f"{im['processor']} ({im['image_processor']}) from "
                                        f"{im['source']}: image token {im['image_token']}{cap}"))
        if chat.get("videos"):
            _videos(console, chat["videos"], data.get("splits") or [])
        if chat.get("audios"):
            au = chat["audios"]
            cut = f", clips cut at {au['max_seconds']:g} s" if au.get("max_seconds") else ""
            if au.get("chunk_seconds"):
                cut = f", {au['tokens_per_chunk']:,} tokens per {au['chunk_seconds']:g}-s chunk (never cut)"
            console.print(Text.assemble(("audio ", "dim"), f"{au['processor']} from {au['source']}: "
                                        f"{au['sampling_rate']:,} Hz, audio token {au['audio_token']}{cut}"))
    model = data.get("model")
    if model:
        console.print(Text.assemble(("model ", "dim"), f"{model.get('model')} ({model.get('model_type')}, "
                                    f"{model.get('family')})"))
        for note in model.get("notes", []):
            _say(console, f"note: {note}", indent="  ", style="dim")
    found = _findings(data)
    if found:
        console.print(Text("\nfindings", style="bold"))
        for line in found:
            _say(console, f"- {line}", indent="  ")
    audio = data.get("audio")
    if audio and audio.get("sampling_rate"):
        rule = audio.get("frame_rule") or {}
        frames = f"; frames: {rule.get('origin')}" if rule else ""
        console.print(Text.assemble(("audio ", "dim"), f"samples at {audio['sampling_rate']:,} Hz{frames}"))
    sampled = False
    for split in data["splits"]:
        sample = split["sample"]
        sampled |= sample["mode"] == "sample"
        console.print(Text.assemble(("\nsplit ", "dim"), (split["split"], "bold"), "  ", sample["reason"]))
        console.print(_field_table(split))
        if sample["mode"] == "sample":
            console.print(_interval_table(split))
        if split.get("pair"):
            ratio = split["pair"]["ratio"]
            if ratio["count"]:
                console.print(f"  {ratio['name']}: median {_num(ratio['percentiles']['p50'])}, "
                              f"p99 {_num(ratio['percentiles']['p99'])}, max {_num(ratio['max'])} "
                              f"over {ratio['count']:,} rows with both")
        for check in split.get("limits", []):
            _say(console, limit_line(check, sampled=sample["mode"] == "sample"), indent="  ")
    if sampled:
        console.print(Text("\nA sample can miss rare extremes: the longest rows may not be in it. "
                           "`lengthscan clean` always decides on every row; use --full to measure all.",
                           style="yellow"))
    if data.get("decisions"):
        _render_decisions(data["decisions"], data.get("clean"), console)
    if data.get("cache_hits"):
        console.print(Text(f"reused cached lengths for {data['cache_hits']} column(s)", style="dim"))


def _say(console: Console, text: str, *, head: str = "", indent: str = "", style: str | None = None) -> None:
    """``text`` wrapped at the console's width with a hanging indent (continuation lines start two
    columns in), without the trailing spaces rich's padding would add; ``head`` printed dim first."""
    import textwrap

    first = indent + head
    lines = textwrap.wrap(text, width=max(40, console.width - 1), initial_indent=first,
                          subsequent_indent=indent + "  ", break_on_hyphens=False) or [first]
    out = Text()
    for i, line in enumerate(lines):
        if i == 0 and head:
            out.append(indent)
            out.append(head, style="dim")
            out.append(line[len(first):], style=style)
        else:
            out.append(line, style=style)
        if i < len(lines) - 1:
            out.append("\n")
    console.print(out, soft_wrap=True)


def _findings(data: dict) -> list[str]:
    """The report's plain-language findings (the same sentences as report.html's)."""
    from lengthscan.report.findings import findings

    try:
        return findings(data)
    except Exception:  # findings are a summary: never let one hide the numbers below
        return []


def _render_decisions(decisions: dict, clean: dict | None, console: Console) -> None:
    """The resolved rules, what happens to the rows (estimated when sampled), and the gate."""
    console.print(Text.assemble(("\nlimits", "bold"), f" (percentiles resolved on the {decisions['basis']} split)"))
    for r in decisions["rules"]:
        console.print(f"  {r['rule']}: {r['metric']} {r['op']} {_num(r['threshold'])} -> {r['action']}  "
                      f"[dim]({r['origin']})[/dim]")
    verb = "would be" if clean is None else "were"
    actions = rule_actions(decisions)
    for s in decisions["splits"]:
        changed = changed_rows(s, actions) or {"truncate": 0}
        done = ", ".join(f"{n:,} {DONE[a]}" for a, n in changed.items())
        line = f"  split {s['split']}: {s['kept']:,} kept, {done}, {s['dropped']:,} dropped of {s['measured']:,} rows"
        est = s.get("estimated")
        if est:
            line += (f"; in all {s['rows']:,} rows about {est['truncate']['rows']:,.0f} {verb} "
                     f"{changed_label(decisions)} and {est['drop']['rows']:,.0f} dropped")
        console.print(line)
        for item in s["by_reason"][:5]:
            console.print(f"    {item['rows']:,} {row_action(item['decision'], item['reason'], actions)}: "
                          f"{item['reason']}")
    decide_only = decisions.get("decide_only") or {}
    if decide_only.get("on"):
        limits = ", ".join(f"{role}_tokens<={value:,}" for role, value in decide_only["limits"].items())
        console.print(Text(f"  decide-only mode is on ({limits}): tokens are counted only as far as each decision "
                           "needs; rows decided by a proven bound have ..._tokens_at_least/_at_most in "
                           "lengths.parquet instead of an exact length, and the cleaned dataset's statistics take "
                           "a kept one at its upper bound (--no-decide-only counts all)",
                           style="cyan"))
    if decisions.get("gate"):
        console.print(Text(f"  {decisions['gate']}", style="bold red"))
    elif decisions.get("fail_over"):
        console.print(Text(f"  gate passed (--fail-over {decisions['fail_over']})", style="green"))
    if clean and clean.get("published"):
        console.print(Text.assemble(("wrote ", "dim"), f"{clean['out_dir']}/dataset, rejects, lengths.parquet, "
                                                        "report.json, report.html"))


def _field_table(split: dict) -> Table:
    """Lengths per field; the missing/empty columns only when some row has them (80 columns)."""
    fields = split["fields"]
    show_missing = any(f["missing"] + f["unmeasured"] for f in fields.values())
    show_empty = any(f["empty"] for f in fields.values())
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("field", no_wrap=True)
    heads = (["missing"] if show_missing else []) + (["empty"] if show_empty else [])
    for name in (*heads, "min", "mean", *SHOWN, "max"):
        table.add_column(name, justify="right", no_wrap=True)
    for name, f in fields.items():
        pct = f["percentiles"]
        cells = ([f"{f['missing'] + f['unmeasured']:,}"] if show_missing else []) + \
                ([f"{f['empty']:,}"] if show_empty else [])
        table.add_row(name, *cells, _cell(f["min"]), _cell(f["mean"], 1), *(_cell(pct[k]) for k in SHOWN),
                      _cell(f["max"]))
    return table


def _interval_table(split: dict) -> Table:
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("95% interval", no_wrap=True)
    for key in SHOWN:
        table.add_column(key, justify="right", no_wrap=True)
    for name, f in split["fields"].items():
        cells = []
        for key in SHOWN:
            lo, hi = f["intervals"][key]
            cells.append(f"{_cell(lo)}-{_cell(hi) if hi is not None else '?'}")
        table.add_row(name, *cells)
    return table


def limit_line(check: dict, *, sampled: bool) -> str:
    """One line on rows over a limit, with the extrapolated interval when sampled."""
    head = f"{check['name']} ({check['origin']}): {check['over_in_measured']:,} of {check['measured']:,} rows"
    worst = check.get("worst_rows") or []
    if worst:
        head += "; longest: " + ", ".join(f"row {w['row']} ({_num(w['value'])})" for w in worst[:3])
    if check.get("unknown_by_bound"):
        head += (f"; {check['unknown_by_bound']:,} more decided by a decide-only bound are not known against it "
                 "(--no-decide-only counts them)")
    if not sampled:
        return head
    lo, hi = check["interval"]
    return f"{head}; about {check['estimated_over']:,.0f} in the split (95%: {lo:,.0f}-{hi:,.0f})"


def _cell(value, digits: int = 3) -> str:
    """A table cell: exact below 100,000, then compact (496k, 12.3M); report.json has every digit."""
    if isinstance(value, (int, float)) and abs(value) >= 100_000:
        return f"{value / 1e6:.1f}M" if abs(value) >= 10_000_000 else f"{value / 1e3:.0f}k"
    return _num(value, digits)


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}g}" if abs(value) < 1 else f"{value:,.{digits if digits < 3 else 2}f}"
    return f"{int(value):,}"


def _videos(console, videos: dict, splits: list) -> None:
    """The video processor's settings, and each split's videos: their tokens and frames."""
    o = videos["options"]
    frames = f", {o['min_frames']}-{o['max_frames']} frames" if "min_frames" in o else ""
    if o.get("num_frames") and o.get("fps"):  # SmolVLM2 samples by both
        frames = f", at most {o['num_frames']} frames"
    sampled = (f"{o['num_frames']} frames" if o.get("num_frames") and not o.get("fps") else f"{o['fps']} fps{frames}"
               ) if o["do_sample_frames"] else "every frame (do_sample_frames off)"
    size = (f"{o['min_pixels']:,}-{o['max_pixels']:,} pixels" if "min_pixels" in o
            else f"at most {o['max_soft_tokens']:,} soft tokens a frame" if "max_soft_tokens" in o
            else f"{o['tokens_per_frame']:,} tokens a frame")
    console.print(Text.assemble(("videos ", "dim"), f"{videos['video_processor']} from {videos['source']}: {sampled}, "
                                f"{size} ({videos['config_file']})"))
    for split in splits:
        vd = (split.get("chat") or {}).get("videos")
        if vd and vd["videos"]:
            share = vd["video_tokens"] / vd["sequence_tokens"] if vd["sequence_tokens"] else 0
            console.print(Text.assemble(("  ", ""), f"{split.get('split')}: {vd['videos']:,} videos in "
                                        f"{vd['rows_with_videos']:,} rows, {vd['video_seconds']:,.1f} s, "
                                        f"{vd['video_tokens']:,} tokens ({share:.0%} of the sequence tokens), "
                                        f"{vd['video_frames']:,} frames kept"))
