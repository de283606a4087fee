"""Preference rows as TRL reads them: ``prompt`` (explicit, or implicit in both answers), ``chosen``
and ``rejected``, both strings or both lists of messages, and the row's tools.

Without a prompt column, the prompt is what ``trl.data_utils.extract_prompt`` finds: the chosen and
rejected values' common start (characters of strings, messages of conversations), less a space
that ends it, exactly as the installed TRL cuts it (including its rule that two values equal up to
the shorter one's length keep that one's last element apart)."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.chat.conversations import RowProblem, parse_tools


@dataclass(frozen=True)
class PairFormat:
    """The columns of a preference field, and the trainer's truncation."""

    chosen: str
    rejected: str
    prompt: str | None = None
    tools: str | None = None
    max_length: int | None = None       # DPOConfig.max_length (None: not cut)
    truncation_mode: str = "keep_start"  # DPOConfig.truncation_mode
    trainer: str = "dpo"                 # "dpo" (DPOTrainer) or "reward" (RewardTrainer)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.chosen, self.rejected, self.prompt, self.tools) if c)


@dataclass
class Pair:
    prompt: str | list
    chosen: str | list
    rejected: str | list
    tools: list | None = None
    implicit: bool = False

    @property
    def conversational(self) -> bool:
        return isinstance(self.chosen, list)


def pair_rows(columns: dict, fmt: PairFormat) -> list:
    """Per row: a ``Pair``, None (a value is missing) or a ``RowProblem``."""
    chosen, rejected = columns[fmt.chosen], columns[fmt.rejected]
    prompts = columns.get(fmt.prompt) if fmt.prompt else None
    tools = columns.get(fmt.tools) if fmt.tools else None
    out: list = []
    for i in range(len(chosen)):
        try:
            out.append(_row(prompts[i] if prompts is not None else None, chosen[i], rejected[i],
                            tools[i] if tools is not None else None, explicit=prompts is not None,
                            extract=fmt.trainer == "dpo"))
        except RowProblem as problem:
            out.append(problem)
    return out


def _row(prompt, chosen, rejected, tools, *, explicit: bool, extract: bool = True):
    if chosen is None or rejected is None or (explicit and prompt is None):
        return None
    values = [chosen, rejected, *([prompt] if explicit else [])]
    strings = [isinstance(v, str) for v in values]
    if any(strings) and not all(strings):
        raise RowProblem("invalid_conversation", "prompt, chosen and rejected must all be strings or all lists of "
                                                 "messages")
    if not all(strings):
        for what, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
            if value is not None and not _messages(value):
                raise RowProblem("invalid_conversation", f"the {what} is not a list of messages {{role, content}}")
        chosen, rejected = [dict(m) for m in chosen], [dict(m) for m in rejected]
        prompt = [dict(m) for m in prompt] if prompt is not None else None
        for what, value in (("prompt", prompt or []), ("chosen", chosen), ("rejected", rejected)):
            text_only(value, what)
    if not explicit and extract:
        prompt, chosen, rejected = extract_prompt(chosen, rejected)
    elif not explicit:  # RewardTrainer takes each side whole
        prompt = "" if isinstance(chosen, str) else []
    return Pair(prompt, chosen, rejected, parse_tools(tools), implicit=not explicit and extract)


def _messages(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in value)


def text_only(messages: list, what: str) -> None:
    """Refuse (``RowProblem``) a message whose content holds a part that is not text: lengthscan
    measures text pairs and prompts (TRL prepares images through its vision path)."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            kinds = {p.get("type") for p in content if isinstance(p, dict)} - {"text"}
            if kinds or not all(isinstance(p, dict) for p in content):
                named = ", ".join(sorted(map(str, kinds))) or "non-dict"
                raise RowProblem("unsupported_content", f"the {what} has {named} parts: lengthscan measures text "
                                                        "preference pairs and prompts")


def extract_prompt(chosen, rejected) -> tuple:
    """(prompt, chosen, rejected) as ``trl.data_utils.extract_prompt`` splits them."""
    shortest = min(len(chosen), len(rejected))
    if shortest == 0:
        raise RowProblem("invalid_conversation", "an empty chosen or rejected value: TRL's extract_prompt fails on it")
    for idx in range(shortest):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":  # remove space before the prompt
                idx -= 1
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]
