"""Plain-language findings about preference pairs, from ``report.json``'s dict: what the trainer's
``max_length`` does to them (pairs it collapses, rows DPOTrainer drops, prompts it cuts,
completions it shortens), the pairs that are equal as given, and how much of the pair the two
answers share."""

from __future__ import annotations

from lengthscan.report.fmt import share


def preference_findings(data: dict) -> list[str]:
    """Sentences about the report's preference pairs (``[]`` without them)."""
    how = data.get("preference")
    if not how:
        return []
    if how.get("trainer") == "GRPOTrainer":
        return _rl_findings(data, how)
    if how.get("trainer") == "RewardTrainer":
        return _reward_findings(data, how)
    splits = [s for s in data.get("splits", []) if s.get("preference")]
    multi = len(splits) > 1
    limit, mode = how.get("max_length"), how.get("truncation_mode")
    out: list[str] = []
    for split in splits:
        p = split["preference"]
        n = p["measured"]
        if not n:
            continue
        where = f" in split {split['split']}" if multi else ""
        if limit is None:
            if p["collapsed"]:
                out.append(f"{_n(p['collapsed'], 'pair')}{where} ({share(p['collapsed'], n)}) "
                           f"{_verb(p['collapsed'], 'has', 'have')} the same chosen and rejected tokens: nothing to "
                           f"learn (lengths.parquet's pair_collapsed column lists them; clean drops them unless "
                           f"--keep-empty-targets).")
            out.append("No --pair-max-length given: pass DPOConfig.max_length to see the pairs its truncation "
                       "collapses and the rows DPOTrainer drops.")
        else:
            cut = f"truncating at {limit:,} tokens ({mode})"
            if p["collapsed"]:
                out.append(f"{cut.capitalize()} collapses {_n(p['collapsed'], 'pair')}{where} "
                           f"({share(p['collapsed'], n)}): chosen and rejected become the same sequence, a pair "
                           f"that teaches nothing (lengths.parquet's pair_collapsed column lists them); raise "
                           f"max_length or drop them.")
            if p["trainer_drops"]:
                out.append(f"{_n(p['trainer_drops'], 'row')}{where} ({share(p['trainer_drops'], n)}) "
                           f"{_verb(p['trainer_drops'], 'has', 'have')} a prompt of {limit:,} tokens or more: "
                           f"DPOTrainer drops them before training (keep_start).")
            if p["prompt_cut"]:
                out.append(f"{_n(p['prompt_cut'], 'row')}{where} ({share(p['prompt_cut'], n)}) "
                           f"{_verb(p['prompt_cut'], 'loses the start of its', 'lose the start of their')} prompt to "
                           f"{cut}.")
            if p["completion_cut"]:
                out.append(f"{_n(p['completion_cut'], 'pair')}{where} ({share(p['completion_cut'], n)}) "
                           f"{_verb(p['completion_cut'], 'loses', 'lose')} completion tokens to {cut}.")
            if not (p["collapsed"] or p["trainer_drops"] or p["prompt_cut"] or p["completion_cut"]):
                out.append(f"{cut.capitalize()} cuts no pair{where}.")
        if p["completion_tokens"]:
            out.append(f"Chosen and rejected{where} share {share(2 * p['shared_tokens'], p['completion_tokens'])} of "
                       f"their completion tokens (their common first tokens); each pair costs "
                       f"{p['pair_tokens'] / n:,.0f} tokens on average in the padded chosen+rejected forward.")
    return out


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _rl_findings(data: dict, how: dict) -> list[str]:
    """Sentences about RL prompts: the longest prompt, the sequence and group budgets, no truncation."""
    out: list[str] = []
    splits = data.get("splits", [])
    budget, group = how["max_completion_length"], how["num_generations"]
    for split in splits:
        fields = split.get("fields") or {}
        prompt = fields.get("prompt_tokens")
        if not prompt or not prompt.get("count"):
            continue
        where = f" in split {split['split']}" if len(splits) > 1 else ""
        longest, cap = prompt["max"], how.get("max_prompt_length")
        if cap is None:
            out.append(f"Prompts{where} run to {longest:,} tokens (p99 {prompt['percentiles']['p99']:,}); "
                       f"{how['trainer']} never truncates them (this TRL has no max_prompt_length), so with "
                       f"max_completion_length {budget:,} a sequence reaches {longest + budget:,} tokens and a "
                       f"prompt's group of {group} generations {group * (longest + budget):,}.")
            continue
        hist = prompt.get("histogram") or {}
        over = sum(c for v, c in zip(hist.get("values", []), hist.get("counts", [])) if v > cap)
        kept = min(longest, cap)
        out.append(f"{over:,} of {prompt['count']:,} prompts{where} ({share(over, prompt['count'])}) exceed "
                   f"max_prompt_length {cap:,}: cut from the left, they lose their start (the instructions "
                   f"or the question), silently; a sequence reaches {kept + budget:,} tokens and a group of "
                   f"{group} generations {group * (kept + budget):,}." if over else
                   f"No prompt{where} exceeds max_prompt_length {cap:,} (the longest: {longest:,} tokens).")
    return out


def _reward_findings(data: dict, how: dict) -> list[str]:
    """Sentences about reward-model pairs: equal pairs, the pairs RewardTrainer drops over max_length."""
    out: list[str] = []
    splits = [s for s in data.get("splits", []) if s.get("preference")]
    limit = how.get("max_length")
    for split in splits:
        p, where = split["preference"], f" in split {split['split']}" if len(splits) > 1 else ""
        if not p["measured"]:
            continue
        if p["collapsed"]:
            out.append(f"{_n(p['collapsed'], 'pair')}{where} ({share(p['collapsed'], p['measured'])}) "
                       f"{_verb(p['collapsed'], 'has', 'have')} the same chosen and rejected tokens: they teach the "
                       f"reward model nothing.")
        if limit is not None:
            dropped = p["trainer_drops"]
            out.append(f"{_n(dropped, 'pair')}{where} ({share(dropped, p['measured'])}) "
                       f"{_verb(dropped, 'has', 'have')} a side over {limit:,} tokens: RewardTrainer drops them "
                       f"(it filters, never truncates)." if dropped else
                       f"No pair{where} has a side over {limit:,} tokens: RewardTrainer keeps every pair.")
    return out


def _verb(count: int, one: str, many: str) -> str:
    return one if count == 1 else many

