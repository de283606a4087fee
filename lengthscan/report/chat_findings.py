"""Plain-language findings about conversations, from ``report.json``'s dict (pure, no I/O).

Which share of the tokens is trained; conversations over a sequence limit and how many of them a
truncation (TRL's ``max_length`` slice) would leave with no trained token; what a clean kept of the
trained tokens; rows without a trained token or a final end-of-turn token; templates that rewrite
earlier turns; content parts a template did not render; ShareGPT conversion.
"""

from __future__ import annotations

import math

from lengthscan.report.fmt import share


def chat_findings(data: dict) -> list[str]:
    """Sentences about the conversations of the report (``[]`` without a chat field)."""
    chat = data.get("chat")
    if not chat:
        return []
    out: list[str] = []
    splits = [s for s in data.get("splits", []) if s.get("chat")]
    multi = len(splits) > 1
    for split in splits:
        where = f" of split {split['split']}" if multi else ""
        c = split["chat"]
        if c["sequence_tokens"]:
            out.append(f"{share(c['completion_tokens'], c['sequence_tokens'])} of the tokens{where} are trained "
                       f"({c['completion_tokens']:,} of {c['sequence_tokens']:,}; {chat['trained_tokens']}).")
        for limit, origin in sequence_limits(data, split):
            out.append(_over_sentence(split, limit, origin, where))
        out += _row_sentences(c, where, chat)
        out += _audio_sentences(c.get("audios"), chat.get("audios") or {}, where)
    out += _kept_sentences(data)
    if chat.get("sharegpt_note"):
        out.append(chat["sharegpt_note"] + ".")
    return out


def _audio_sentences(tally: dict | None, counter: dict, where: str) -> list[str]:
    """The clips the processor cuts off silently (what the model never hears)."""
    if not tally or not tally["rows_truncated"]:
        return []
    return [f"{tally['rows_truncated']:,} conversations{where} have audio {counter.get('processor')} cuts off silently "
            f"at {counter.get('max_seconds'):g} s: {tally['seconds_lost']:,.1f} s the model never hears (the "
            "audio_truncated and audio_lost_ms columns name them; split the clips, or drop the rows with "
            "--limit 'audio_tokens<...')."]


def sequence_limits(data: dict, split: dict) -> list[tuple[int, str]]:
    """The upper sequence_tokens limits in play: the model's (or tokenizer's) and the rules'."""
    limits = [(int(c["limit"]), c["origin"]) for c in split.get("limits", []) if c["measure"] == "sequence_tokens"]
    for r in (data.get("decisions") or {}).get("rules", []):
        if r["metric"] == "sequence_tokens" and r["op"] in ("<=", "<"):
            cap = math.floor(r["threshold"]) if r["op"] == "<=" else math.ceil(r["threshold"]) - 1
            limits.append((cap, f"--limit {r['rule']}"))
    out: dict = {}
    for value, origin in limits:  # one sentence a value: the first origin (the model's) names it
        out.setdefault(value, origin)
    return list(out.items())


def _over_sentence(split: dict, limit: int, origin: str, where: str) -> str:
    field = split["fields"]["sequence_tokens"]
    measured = field.get("count") or 0
    over = _count_above(field.get("histogram") or {}, limit)
    hist = split["chat"].get("trained_from") or {}
    lost = sum(n for v, n in zip(hist.get("values", []), hist.get("counts", [])) if v >= limit)
    text = (f"{share(over, measured)} of conversations{where} ({over:,} of {measured:,}) exceed {limit:,} tokens "
            f"({origin})")
    if over:
        text += (f"; truncating them to {limit:,} tokens (TRL's max_length slice) would leave {lost:,} with no "
                 f"trained token")
    return text + "."


def _count_above(hist: dict, limit: int) -> int:
    return sum(n for v, n in zip(hist.get("values", []), hist.get("counts", [])) if v > limit)


def _row_sentences(c: dict, where: str, chat: dict) -> list[str]:
    out = []
    if c["no_trained_tokens"]:
        out.append(f"{_rows(c['no_trained_tokens'])}{where} have no trained token (no assistant turn to "
                   f"learn from): clean drops them (no_trained_tokens) unless --keep-empty-targets.")
    if c["without_final_eot"]:
        eot = chat.get("end_of_turn_token") or "the end-of-turn token"
        out.append(f"{_rows(c['without_final_eot'])}{where} do not close their last trained turn with "
                   f"{eot}: a model trained on them does not learn to stop.")
    if c["rewrites_history"] and chat["template"]["origin"].startswith("mistral-common"):
        out.append(f"{_rows(c['rewrites_history'])}{where} have no completion count: mistral-common encodes earlier "
                   f"turns differently once later turns follow (tokenizers before v7 put the system prompt in the "
                   f"last user turn), so no per-turn prefix matches.")
    elif c["rewrites_history"]:
        out.append(f"{_rows(c['rewrites_history'])}{where} have no completion count: the template renders "
                   f"earlier turns differently once later turns follow (Qwen3 keeps <think> only on the last turn), "
                   f"so no per-turn prefix matches; measure with a training template that has {{% generation %}} "
                   f"blocks (TRL's trl/chat_templates/*_training.jinja) via --chat-template.")
    if c.get("reasoning"):
        out += _reasoning_findings(c, where)
    if c["parts_not_rendered"]:
        out.append(f"{_rows(c['parts_not_rendered'])}{where} have content parts the template does not "
                   f"render as text (content_parts_not_rendered): their lengths miss that text.")
    return out


def _kept_sentences(data: dict) -> list[str]:
    """After a clean: the trained tokens the cleaned dataset keeps."""
    clean = data.get("clean") or {}
    before = {s["split"]: s.get("chat") for s in data.get("splits", [])}
    out = []
    for after in clean.get("after") or []:
        old, new = before.get(after["split"]), after.get("chat")
        if not old or not new or not old["completion_tokens"]:
            continue
        if old["counted"] < old["measured"]:  # some source rows had no count: no share to give
            out.append(f"After cleaning, the dataset holds {new['completion_tokens']:,} trained tokens (the source: "
                       f"{old['completion_tokens']:,} over the {old['counted']:,} conversations with a count).")
            continue
        out.append(f"After cleaning, the dataset keeps {share(new['completion_tokens'], old['completion_tokens'])} "
                   f"of the trained tokens ({new['completion_tokens']:,} of {old['completion_tokens']:,}).")
        lost = new["without_final_eot"] - old["without_final_eot"]
        if lost > 0:
            out.append(f"Truncation cuts the final end-of-turn token of {_rows(lost)}: trained on, they do not teach "
                       f"the model to stop (final_eot_at_after is null in lengths.parquet); drop-turns keeps it.")
    return out


def _rows(n: int) -> str:
    return f"{n:,} conversation" + ("" if n == 1 else "s")


def _reasoning_findings(c: dict, where: str) -> list[str]:
    """--reasoning: the trained tokens that are reasoning, and the reasoning the template drops."""
    r, out = c["reasoning"], []
    if r["rows_with_reasoning"]:
        out.append(f"Reasoning{where} is {share(r['reasoning_tokens'], c['completion_tokens'])} of the trained tokens "
                   f"({r['reasoning_tokens']:,} of {c['completion_tokens']:,}), in {_rows(r['rows_with_reasoning'])} "
                   f"(a limit: --limit 'reasoning_tokens<=N').")
    if r["spans_dropped"]:
        out.append(f"The template drops {r['spans_dropped']:,} reasoning spans in {_rows(r['rows_dropping'])}{where} "
                   f"(it renders the thinking of some turns only, as Qwen3 keeps it after the last user turn): "
                   f"those tokens are never trained; split such conversations per turn to train on them.")
    return out

