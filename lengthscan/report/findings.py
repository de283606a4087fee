"""Plain-language findings computed from ``report.json``'s dict: what a reader should know first.

``findings(data)`` returns short sentences (plain text, no markup) in order of importance: rows
over the model's limits (with what they cost in padding), what the ``--limit`` rules do, what
cleaning changed, rows without a length, suspicious ratios, long tails, padding, and the caveat of
a sample. The HTML page shows them at the top; the terminal summary can reuse them.
"""

from __future__ import annotations

from lengthscan.measure.records import BOUNDED_FLAGS, FLAG_NAMES
from lengthscan.report.actions import DID, WOULD, changed_label, changed_rows, rule_actions
from lengthscan.report.chat_findings import chat_findings
from lengthscan.report.fmt import count, num, padded_sides, share, times, unit, with_unit
from lengthscan.report.image_findings import image_findings
from lengthscan.report.packing import packing_findings
from lengthscan.report.preference_findings import preference_findings
from lengthscan.report.video_findings import video_findings

#: Flags of rows decide-only mode decided by a proven bound (they have bounds, not lengths).
BOUNDED_FLAG_NAMES = tuple(FLAG_NAMES[code] for code in BOUNDED_FLAGS)

#: A field whose longest row is this many times its p99 has a tail worth a sentence.
LONG_TAIL = 2.5
#: Tokens per second this many times the median (or below median / this) suggest a bad transcript.
RATIO_OUTLIER = 3.0


def findings(data: dict) -> list[str]:
    """Sentences about the report, most important first; ``[]`` for a report with nothing to say."""
    out: list[str] = []
    splits = data.get("splits", [])
    multi = len(splits) > 1
    sampled = [s for s in splits if s["sample"]["mode"] == "sample"]
    clean = data.get("clean")
    # after a clean, data["splits"] and clean["batches_before"] describe the source, clean["after"]
    # and data["batches"] the cleaned dataset
    before = "Before cleaning: " if clean else ""
    source_batches = clean.get("batches_before") if clean else data.get("batches")
    now = (clean or {}).get("after") or splits
    for split in splits:
        own = source_batches if _batches_of(source_batches, split["split"], splits) else None
        out += [before + t for t in _limit_findings(split, own, multi=multi)]
    out += chat_findings(data)
    out += image_findings(data)
    out += video_findings(data)
    out += preference_findings(data)
    # a clean whose --fail-over gate failed published nothing: what it would have done, not what it did
    published = clean is not None and clean.get("published", True) and not (data.get("decisions") or {}).get("gate")
    out += _decision_findings(data.get("decisions"), cleaned=published)
    out += _clean_findings(data)
    for split in splits:
        out += [before + t for t in _flag_findings(split, multi=multi)]
    for split in now:
        out += _ratio_findings(split, multi=multi)
        out += _tail_findings(split, multi=multi)
    out += _padding_findings(data.get("batches"), (clean or {}).get("batches_before"), sides=padded_sides(data))
    out += packing_findings(data.get("packing"))
    model = data.get("model") or {}
    out += [f"Model note: {note}" + ("" if note.endswith((".", "!", "?")) else ".")
            for note in model.get("notes") or []]
    if splits and not model and not any(s.get("limits") for s in splits):
        out.append("No model or tokenizer limit was checked: pass --model to compare the lengths with the model's "
                   "own limits.")
    for split in sampled:
        out += _block_findings(split, multi=multi)
    if sampled:
        s = sampled[0]["sample"]
        blocks = f" in {s['blocks_drawn']:,} blocks" if s.get("blocks_drawn") is not None else ""
        out.append(f"Measured on a sample of {s['rows_measured']:,} of {s['rows_total']:,} rows{blocks} (seed "
                   f"{s['seed']}): counts over limits are estimates with 95% intervals, and a sample can miss the "
                   "rarest, longest rows. `lengthscan clean` decides on every row.")
    return out


def _block_findings(split: dict, *, multi: bool) -> list[str]:
    """A block sample whose blocks differ more than rows do (sorted or grouped data): a sentence
    per measurement, with the rows the sample is worth."""
    from lengthscan.stats.design import DEFF_FINDING

    out = []
    where = f" (split {split['split']})" if multi else ""
    for name, f in split.get("fields", {}).items():
        design = f.get("design") or {}
        if design.get("too_few_blocks"):
            out.append(f"The sample holds only {design['blocks']:,} blocks{where}: too few to bound {name}'s "
                       "percentiles, so its intervals are left open. A larger --sample draws more blocks; "
                       "--sample-unit row spreads the same rows over the whole corpus.")
            continue
        deff = design.get("design_effect")
        if deff is None or deff <= DEFF_FINDING:
            continue
        out.append(f"The blocks of the sample differ more than rows do{where}: {name}'s design effect is {deff:,.1f}, "
                   f"so its {design['rows']:,} rows in {design['blocks']:,} blocks are worth about "
                   f"{design['effective_rows']:,} rows drawn one by one (the data looks sorted or grouped by source "
                   "or length). The intervals account for it; more blocks (a larger --sample) or --sample-unit row "
                   "narrow them.")
    return out


def _noun(measure: str, n: float) -> str:
    """What a row of this measurement is called: inputs, targets, clips."""
    role = measure.split("_", 1)[0]
    word = "clip" if role == "input" and unit(measure) in ("s", "samples", "frames") else role
    return word if round(n) == 1 else word + "s"


def _short(origin: str) -> str:
    """The head of a limit's origin: ``config.max_source_positions 1500 x 2`` without the reasoning."""
    for stop in (" (", ": "):
        origin = origin.split(stop, 1)[0]
    return origin


def _limit_findings(split: dict, batches: dict | None, *, multi: bool) -> list[str]:
    out, within = [], []
    is_sample = split["sample"]["mode"] == "sample"
    where = f" in split {split['split']}" if multi else ""
    for check in split.get("limits", []):
        m, n, limit = check["measure"], check["over_in_measured"], check["limit"]
        unknown = check.get("unknown_by_bound") or 0
        if not n and unknown:
            out.append(f"No {m} row counted in full{where} exceeds {with_unit(limit, m)} ({_short(check['origin'])}); "
                       f"{unknown:,} rows, decided by a decide-only bound, are not known against {num(limit)} "
                       "(--no-decide-only counts them).")
            continue
        if not n:
            within.append(f"{m} <= {num(limit)}")
            continue
        worst = (check.get("worst_rows") or [None])[0]
        longest = f"; the longest is {with_unit(worst['value'], m)} (row {worst['row']})" if worst else ""
        if is_sample:
            lo, hi = check["interval"]
            est = check["estimated_over"]
            text = (f"About {count(est)} {_noun(m, est)}{where} exceed {with_unit(limit, m)} "
                    f"({_short(check['origin'])}; 95% interval {count(lo)}-{count(hi)}, "
                    f"from {n:,} of {check['measured']:,} sampled rows)"
                    f"{longest.replace('the longest is', 'the longest seen is')}")
        else:
            verb = "exceeds" if n == 1 else "exceed"
            text = f"{n:,} {_noun(m, n)}{where} {verb} {with_unit(limit, m)} ({_short(check['origin'])}){longest}"
        text += _padding_clause(m, batches) + "."
        if unknown:
            text += f" {unknown:,} more rows, decided by a decide-only bound, are not known against {num(limit)}."
        out.append(text)
    if within and not out:
        lengthless = any(n for role in split.get("roles", {}).values() for flag, n in role["flags"].items()
                         if flag not in ("empty", "truncated", *BOUNDED_FLAG_NAMES))
        scope = ("No sampled row with a length exceeds" if is_sample else "Every row with a length is within") \
            if lengthless else ("No sampled row exceeds" if is_sample else "Every row is within")
        none = " (rows without a length are not in it: see below)" if lengthless else ""
        out.append(f"{scope} the known limits{where}: {', '.join(within)}{none}.")
    return out


def _batches_of(batches: dict | None, name: str, splits: list[dict]) -> bool:
    """Whether ``batches`` were simulated on this split (they name it; else train or the first)."""
    if not batches:
        return False
    if batches.get("split") is not None:
        return batches["split"] == name
    names = [s["split"] for s in splits]
    return name == ("train" if "train" in names else names[0])


def _batch_entry(batches: dict | None) -> dict | None:
    """The batch-size entry findings talk about: batch size 8 when simulated, else the first."""
    entries = (batches or {}).get("by_batch_size") or []
    return next((e for e in entries if e.get("batch_size") == 8), entries[0] if entries else None)


def _padding_clause(measure: str, batches: dict | None) -> str:
    """``; a batch of 8 containing it pads labels to 2,145 tokens (17x the median batch)``."""
    entry = _batch_entry(batches)
    role = measure.split("_", 1)[0]
    if entry is None or role not in ("input", "target") or unit(measure) != _batch_unit(batches):
        return ""
    worst = (entry.get("worst_case") or {}).get(role)
    median = ((entry.get("strategies") or {}).get("random", {}).get("median_batch") or {}).get(role)
    if not worst or not median:
        return ""
    what = "labels" if role == "target" else "inputs"
    bs = entry["batch_size"]
    return (f"; a batch of {bs} containing it pads {what} to {with_unit(worst / bs, measure)} "
            f"({times(worst, median)} the median batch)")


def _batch_unit(batches: dict | None) -> str:
    return unit("x_" + (batches or {}).get("unit", "tokens"))


def _decision_findings(decisions: dict | None, *, cleaned: bool) -> list[str]:
    if not decisions:
        return []
    out = []
    multi = len(decisions["splits"]) > 1
    actions = rule_actions(decisions)
    for s in decisions["splits"]:
        where = f" of split {s['split']}" if multi else ""
        est = s.get("estimated")
        top = next((r for r in s.get("by_reason", []) if r["decision"] == "drop"), None)
        reason = f"; most drops: {top['reason']} ({top['rows']:,}{' sampled' if est else ''})" if top else ""
        if est:
            d, t = est["drop"], est["truncate"]
            out.append(f"The --limit rules would drop about {count(d['rows'])} rows (95%: {count(d['interval'][0])}-"
                       f"{count(d['interval'][1])}) and {changed_label(decisions, WOULD)} about {count(t['rows'])} "
                       f"({count(t['interval'][0])}-{count(t['interval'][1])}) of the {s['rows']:,}{where} "
                       f"({s['dropped']:,} and {s['truncated']:,} of {s['measured']:,} sampled){reason}.")
        else:
            parts = [f"{'dropped' if cleaned else 'drop'} {s['dropped']:,} ({share(s['dropped'], s['measured'])})"] \
                if s["dropped"] else []
            parts += [f"{(DID if cleaned else WOULD)[a]} {n:,} ({share(n, s['measured'])})"
                      for a, n in changed_rows(s, actions).items()]
            if not parts:
                head = "Cleaning kept every row" if cleaned else "The --limit rules would keep every row"
                out.append(f"{head} ({s['measured']:,} rows{where}) as it is.")
                continue
            head = "Cleaning" if cleaned else "The --limit rules would"
            listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
            out.append(f"{head} {listed} of {s['measured']:,} rows{where}{reason}.")
    if decisions.get("gate"):
        out.append(f"The --fail-over gate failed: {decisions['gate'].removeprefix('gate failed: ')}.")
    return out


def _clean_findings(data: dict) -> list[str]:
    clean = data.get("clean")
    if not clean or not clean.get("after"):
        return []
    before = {s["split"]: s for s in data["splits"]}
    published = clean.get("published", True) and not (data.get("decisions") or {}).get("gate")
    out = []
    for after in clean["after"]:
        old = before.get(after["split"])
        if old is None:
            continue
        changes = [f"{name} max {num(old['fields'][name]['max'])} -> {num(f['max'])}"
                   for name, f in after["fields"].items()
                   if name in old["fields"] and f["max"] != old["fields"][name]["max"]]
        rows = after["sample"]["rows_total"]
        where = f" of {after['split']}" if len(clean["after"]) > 1 else ""
        text = (f"After cleaning, {rows:,} rows{where} remain" if published else
                f"Had the clean been published, {rows:,} rows{where} would remain")
        out.append(text + (": " + ", ".join(changes) if changes else "") + ".")
        out += still_over(after, where)
    return out


def _rule_number(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def still_over(after: dict, where: str = "") -> list[str]:
    """The written rows still over a model limit: the rules were looser than the model."""
    out = []
    for check in after.get("limits") or []:
        if check["over_in_measured"]:
            n = check["over_in_measured"]
            out.append(f"{n:,} cleaned row{'s' if n != 1 else ''}{where} still exceed {check['name']} "
                       f"({check['origin']}): the rules keep rows the model cannot take; add --limit "
                       f"'{check['measure']}<={_rule_number(check['limit'])}' (:truncate to cut them instead).")
    return out


def _flag_findings(split: dict, *, multi: bool) -> list[str]:
    out = []
    where = f" in split {split['split']}" if multi else ""
    for role, r in split.get("roles", {}).items():
        flags = {k: v for k, v in (r.get("flags") or {}).items() if v}
        empty = flags.pop("empty", 0)
        truncated = flags.pop("truncated", 0)  # measured: by the audio the file holds
        if truncated:
            out.append(_truncated_sentence(role, truncated, r.get("truncated_rows") or [], where))
        bounded = {k: flags.pop(k) for k in BOUNDED_FLAG_NAMES if k in flags}
        if bounded:
            n = sum(bounded.values())
            detail = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in bounded.items())
            out.append(f"{n:,} {role} rows{where} were decided by a proven bound, not counted in full (decide-only: "
                       f"{detail}); {role} statistics cover the rows counted in full, and lengths.parquet has "
                       f"{role}_tokens_at_least/_at_most for the others.")
        if flags:
            n = sum(flags.values())
            detail = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in flags.items())
            rows = "row has" if n == 1 else "rows have"
            out.append(f"{n:,} {role} {rows} no length{where} ({detail}): see {role}_flag and {role}_error "
                       "in lengths.parquet.")
        if empty:
            what = "target is" if role == "target" and empty == 1 else f"{role}s are" if empty > 1 else f"{role} is"
            tail = " (nothing to learn from; clean drops them by default)" if role == "target" else ""
            out.append(f"{empty:,} {what} empty{where}{tail}.")
        if r.get("decoded"):
            out.append(f"{r['decoded']:,} clips{where} were measured by decoding "
                       "(their header has no reliable length).")
    return out


def _truncated_sentence(role: str, n: int, listed: list, where: str) -> str:
    """Truncated audio files: measured by the audio they hold (a length, not a missing one)."""
    files = "file is" if n == 1 else "files are"
    shown = ", ".join(f"row {e['row']}: {with_unit(e['value'], e.get('measure', 'input_seconds'))}"
                      for e in listed[:5])
    more = f" and {n - len(listed[:5]):,} more" if shown and n > len(listed[:5]) else ""
    return (f"{n:,} {role} {files} truncated{where} (the header promises more audio than the file holds): "
            f"measured by the audio {'it holds' if n == 1 else 'they hold'}{f' ({shown}{more})' if shown else ''}, "
            f"and clean decides on that length like on any other; see {role}_flag and {role}_error in lengths.parquet.")


def _ratio_findings(split: dict, *, multi: bool) -> list[str]:
    pair = split.get("pair")
    if not pair or unit(pair["x"]) != "s" or not pair["ratio"].get("count"):
        return []
    ratio = pair["ratio"]
    median, top, low = ratio["percentiles"].get("p50"), ratio["max"], ratio["min"]
    if not median:
        return []
    where = f" in split {split['split']}" if multi else ""
    parts = []
    if top >= RATIO_OUTLIER * median:
        parts.append(f"the highest is {num(top)} ({times(top, median)} the median)")
    if low * RATIO_OUTLIER <= median:
        parts.append(f"the lowest is {num(low)}")
    if not parts:
        return []
    text = (f"{ratio['name']}{where}: median {num(median)}, but {' and '.join(parts)}: check those rows for "
            f"transcripts that do not match their audio (a rule such as {ratio['name']}<=z4 drops them).")
    return [text]


#: Measurements a batch is padded to (besides ``input_*`` and ``target_*``).
PADDED = ("sequence_tokens",)


def _tail_findings(split: dict, *, multi: bool) -> list[str]:
    over = {c["measure"] for c in split.get("limits", []) if c["over_in_measured"]}
    where = f" in split {split['split']}" if multi else ""
    out = []
    for name, f in split["fields"].items():
        p99, top = f["percentiles"].get("p99"), f["max"]
        if name in over or not p99 or top is None or f["count"] < 100 or top < LONG_TAIL * p99:
            continue
        median = f["percentiles"].get("p50")
        vs_median = f", {times(top, median)} the median" if median else ""
        # only a padded length (an input, a target, a rendered sequence) pads a batch to itself; a
        # conversation's completion, prompt or longest message is part of a sequence, not its length
        pads = (f": a batch holding it pads every row to {with_unit(top, name)}"
                if name in PADDED or name.startswith(("input_", "target_")) else "")
        out.append(f"{name}{where} has a long tail: 99% of rows are at most {with_unit(p99, name)}, the longest is "
                   f"{with_unit(top, name)} ({times(top, p99)} p99{vs_median}){pads}.")
    return out


def _padding_findings(batches: dict | None, before: dict | None = None, *, sides: dict | None = None) -> list[str]:
    entry = _batch_entry(batches)
    if entry is None:
        return []
    sides = sides or {"input": "input", "target": "label"}
    rnd, grouped = _strategy(entry, "random"), _strategy(entry, "group_by_length")
    was = _strategy(_batch_entry(before), "random")
    bs, eff = entry["batch_size"], entry.get("effective_batch_size")
    size = f"{bs}" + (f" (effective {eff})" if eff and eff != bs else "")
    parts = [(what, k) for what, k in ((sides["input"], "input_padding_share"),
                                        (sides["target"], "target_padding_share")) if rnd.get(k) is not None]
    if rnd.get("padding_share") is not None:
        key, what = "padding_share", "that"
        # one side padded (no target): its share is the whole share, said once
        by_side = ", ".join(f"{w}s {share(rnd[k], 1)}" for w, k in parts) if len(parts) > 1 else ""
        was_text = f"{share(was[key], 1)} before cleaning{_left_out(before)}" if was.get(key) is not None else ""
        details = "; ".join(t for t in (by_side, was_text) if t)
        text = f"Random batches of {size} are {share(rnd[key], 1)} padding" + (f" ({details})" if details else "")
    elif parts:  # inputs in seconds and labels in tokens: no single share
        key, what = parts[0][1], f"{parts[0][0]} padding"
        text = f"In random batches of {size}, " + " and ".join(f"{share(rnd[k], 1)} of {w} positions"
                                                             for w, k in parts) + " are padding"
        if was.get(key) is not None:
            text += f" ({what} {share(was[key], 1)} before cleaning{_left_out(before)})"
    else:
        return []
    if grouped.get(key) is not None:
        text += (f"; group_by_length brings {what} to {share(grouped[key], 1)}" if grouped[key] < rnd[key] else
                 f"; group_by_length does not lower it here ({share(grouped[key], 1)})")
    return [text + _left_out(batches) + "."]


def _left_out(batches: dict | None) -> str:
    """The rows a batch simulation left out (no length, or only a decide-only bound), if any."""
    if not (batches or {}).get("left_out"):
        return ""
    return f", over the {batches['simulated_rows']:,} of {batches['rows']:,} rows with an exact length"


def _strategy(entry: dict | None, name: str) -> dict:
    return ((entry or {}).get("strategies") or {}).get(name) or {}
