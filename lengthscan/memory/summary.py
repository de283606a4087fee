"""Data mode's prediction in a few plain lines for the terminal (``lengthscan memory SRC``)."""

from __future__ import annotations


def summary_lines(memory: dict) -> list[str]:
    """The prediction in a few plain lines for the terminal."""
    from lengthscan.report.fmt import size

    w, a = memory["worst_batch"], memory["any_shuffle"]
    left = f" ({memory['left_out']:,} without a length left out)" if memory["left_out"] else ""
    lines = [(f"{memory['model_type']} ({memory['family']}): {memory['batches']:,} batches of {memory['batch_size']} "
              f"({memory['sampler']}, seed {memory['seed']}) over {memory['simulated_rows']:,} rows of split "
              f"{memory['split']}{left}"),
             (f"worst batch #{w['index']}: {_shape_text(w['shape'], memory)}, predicted peak {size(w['peak_bytes'])} "
              f"at {w['phase']}"),
             f"  rows {_rows_text(w['rows'])}"]
    parallel = (memory.get("options") or {}).get("parallel") or {}
    if parallel.get("strategy"):
        from lengthscan.memory.parallel import Parallel

        lines.insert(1, f"note: {Parallel(**parallel).note()}")
    if memory.get("objective"):
        lines.insert(1, f"note: {memory['objective']['note']}")
    elif memory.get("objective_hint"):
        lines.insert(1, f"note: {memory['objective_hint']}")
    for name, value in sorted(w["terms"].items(), key=lambda kv: -kv[1])[:6]:
        lines.append(f"  {name:26} {size(value):>12}")
    p = memory["per_batch"]
    lines.append("per-batch peaks: " + " · ".join(f"{k} {size(p[k])}" for k in ("p50", "p90", "p99", "max"))
                 + ("" if p["grid_bits"] is None else f" ({p['exact']:,} exact, the rest upper bounds)"))
    lines.append(f"any shuffle: {_shape_text(a['shape'], memory)}, peak {size(a['peak_bytes'])}")
    pk = memory.get("packing")
    if pk:
        pw = pk["worst_batch"]
        lines.append(f"packed ({pk['strategy']}, L {pk['max_length']:,}): {pk['batches']:,} batches; "
                     f"worst #{pw['index']} {pw['shape']['batch_size']} x {pw['shape']['input_len']:,} tokens, "
                     f"predicted peak {size(pw['peak_bytes'])} at {pw['phase']} "
                     f"(attention follows {pk['attention_follows']})"
                     + ("" if pk.get("fits") is None else f"; {'fits' if pk['fits'] else 'does NOT fit'} the budget"))
    if memory.get("allocator"):
        lines += allocator_lines(memory["allocator"])
    for over in memory.get("over_model_limits") or []:
        lines.append(f"note: {over['rows']:,} rows over the model limit {over['name']}: training fails on them "
                     "whatever the memory")
    if memory.get("budget_bytes") is not None:
        usable = memory["usable_bytes"]
        verdict = (f"the worst batch {_fits(memory['fits'])}" if "unpacked_fits" not in memory else
                   f"the packed worst batch {_fits(memory['fits'])}; unpacked, the worst batch "
                   f"{_fits(memory['unpacked_fits'])}")
        lines.append(f"budget {size(memory['budget_bytes'])} ({size(usable)} usable with a "
                     f"{memory['margin']:.0%} margin): {verdict}; any shuffle {_fits(memory['any_shuffle_fits'])}")
        lim = memory["limits"]
        if lim["rules"]:
            lines.append("limits that fit: " + " ".join(f"--limit '{r}'" for r in lim["rules"]))
            lines.append(f"  {lim['clean_command']}")
        else:
            lines.append(f"no length limit fits at batch size {memory['batch_size']}: a batch of one shortest row "
                         f"alone needs {size(lim['smallest_batch_bytes'])} (weights, gradients, optimizer state)")
        top = lim["largest_batch_size"]
        lines.append(f"largest batch size at the longest rows: {top['value'] if top['value'] else 'none'}"
                     + (" (search limit)" if top["capped_by"] else ""))
        if memory.get("alternatives"):
            from lengthscan.memory.alternatives import advice_line

            lines.append(advice_line(memory["alternatives"], size))
    return lines


def _fits(fits: bool) -> str:
    return "fits" if fits else "does NOT fit"


def _shape_text(shape: dict, memory: dict) -> str:
    sides = memory["sides"]
    parts = [f"{shape['batch_size']} rows"]
    if (memory.get("objective") or {}).get("name") in ("dpo", "reward"):  # chosen and rejected: one forward
        parts = [f"{shape['batch_size']} pairs ({2 * shape['batch_size']} rows)"]
    for key in ("input_len", "target_len"):
        if key in sides and shape.get(key) is not None:
            parts.append(f"{shape[key]:,} {sides[key]}")
    if memory["family"] == "speech-seq2seq":
        parts.insert(1, "30 s of mel frames")
    return " x ".join(parts)


def _rows_text(rows: list[int], most: int = 16) -> str:
    text = ", ".join(str(r) for r in rows[:most])
    return text + (f", ... ({len(rows)} rows)" if len(rows) > most else "")


def allocator_lines(al: dict) -> list[str]:
    """The caching allocator's figures, each said to be modelled."""
    from lengthscan.report.fmt import size

    oom = al.get("out_of_memory")
    line = (f"reserved (modelled, allocator {al['alloc_conf']}): peak {size(al['reserved_peak_bytes'])} for "
            f"{size(al['allocated_peak_bytes'])} allocated at most (+{size(al['overhead_bytes'])} cached by the "
            f"allocator) over {al['steps']:,} of {al['of_steps']:,} batches")
    if al.get("worst_replayed_last"):
        line += " (then the worst batch)"
    if oom:
        where = "the worst batch" if oom.get("worst_batch") else f"batch #{oom['step']}"
        line += f"; out of memory at {where} (a {size(oom['tried_bytes'])} segment)"
    elif al.get("first_step_over_usable") is not None:
        line += f"; the reserve passes the usable budget at batch #{al['first_step_over_usable']}"
    lines = [line]
    if al.get("variants"):
        lines.append("  " + " · ".join(
            f"{name}: peak {size(v['reserved_peak_bytes'])}" + (" (out of memory)" if v["out_of_memory"] else "")
            for name, v in al["variants"].items()))
    if al.get("unpacked"):
        lines.append("  the epoch's unpacked batches (the packed ones are not replayed yet)")
    if al.get("bounded") is False:
        lines.append("  no --budget: an unbounded device, so the allocator never releases its cache to retry (under "
                     "max_split_size_mb the oversize blocks it cannot reuse pile up): give --budget for the "
                     "device's figures")
    lines.append(f"  modelled: PyTorch's caching allocator rules replayed on the predicted allocations; the CUDA "
                 f"context ({size(al['cuda_context_bytes'])}) is outside it; no GPU has confirmed these figures yet")
    return lines

