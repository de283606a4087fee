"""RL prompts measured as TRL's ``GRPOTrainer`` tokenizes them (trl 1.16's ``_tokenize_prompts``):
a conversation through the chat template with ``add_generation_prompt=True`` (tokenized with
``add_special_tokens=False``, as ``apply_chat_template(tokenize=True)`` does), a string as
``tokenizer(text)`` does. This TRL never truncates a prompt (its ``GRPOConfig`` has no
``max_prompt_length``); each prompt is generated ``num_generations`` times, up to
``max_completion_length`` new tokens each. So per row:

* ``prompt_tokens``;
* ``sequence_tokens``: the longest sequence the prompt can become, prompt + ``max_completion_length``;
* ``group_tokens``: its ``num_generations`` sequences together, what one prompt's group costs the
  policy's forward at most.

``max_prompt_length`` (``--max-prompt-length``: earlier TRL releases and the experimental trainers,
whose tokenizer cuts prompts from the left) keeps a prompt's last N tokens: the budgets then count
the kept tokens, and ``prompt_tokens`` stays the whole prompt (the rows over N are the ones cut).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthscan.measure.chat.conversations import RowProblem, parse_tools
from lengthscan.measure.preference.pairs import text_only
from lengthscan.measure.preference.render import TemplateRows, given_texts
from lengthscan.measure.records import FieldSpec, Measured

#: Per-row measurements of an RL prompt field, primary first
RL_METRICS = ("sequence_tokens", "prompt_tokens", "group_tokens")
#: the RL trainers lengthscan measures prompts for -> the TRL class
TRAINERS = {"grpo": "GRPOTrainer"}


def rl_specs(column: str) -> tuple[FieldSpec, ...]:
    return tuple(FieldSpec("rl", column, "tokens", metric=m) for m in RL_METRICS)


@dataclass(frozen=True)
class PromptFormat:
    prompt: str
    trainer: str = "grpo"
    tools: str | None = None
    max_completion_length: int = 512  # GRPOConfig's default
    num_generations: int = 8          # GRPOConfig's default
    max_prompt_length: int | None = None  # a cut from the left (not in the installed TRL's GRPOConfig)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.prompt, self.tools) if c)


class PromptCounter(TemplateRows):
    """Measures RL prompts for one tokenizer (a ``TokenCounter``) and template; picklable."""

    def __init__(self, counter, fmt: PromptFormat, template: str | None = None):
        super().__init__(counter, template)
        self.format = fmt

    def to_dict(self) -> dict:
        fmt = self.format
        return {"trainer": TRAINERS[fmt.trainer], "columns": {k: v for k, v in (("prompt", fmt.prompt),
                                                                                ("tools", fmt.tools)) if v},
                "template": self.renderer.template.to_dict(), "max_completion_length": fmt.max_completion_length,
                "num_generations": fmt.num_generations, "max_prompt_length": fmt.max_prompt_length,
                "prompt_truncation": "none: this TRL's GRPOTrainer never truncates a prompt"
                if fmt.max_prompt_length is None else "left: a prompt keeps its last max_prompt_length tokens",
                **({"processes": dict(self.shared)} if self.shared else {})}

    def signature(self) -> str:
        fmt = self.format
        return (f"{self.renderer.template.hash}|{fmt.prompt}|{fmt.tools}|{fmt.max_completion_length}|"
                f"{fmt.num_generations}|{fmt.max_prompt_length}")

    def measure(self, columns: dict, spec_of: dict, *, rendered: list | None = None) -> Measured:
        """One batch; ``rendered``: the prompts as a worker rendered them (``rendered``)."""
        fmt = self.format
        n = len(columns[fmt.prompt])
        values = {m: np.full(n, -1, np.int64) for m in RL_METRICS}
        flags = np.zeros(n, np.int8)
        errors: list = [None] * n
        row_texts = self.texts_of_rows(columns)[1] if rendered is None else given_texts(rendered)
        texts_of = self.chunk_texts(row_texts, flags, errors, "a prompt")
        for jobs, ids in self.overlapped(n, texts_of):
            for i, (conversational, k) in jobs.items():
                size = len(ids[conversational][k])
                kept = size if fmt.max_prompt_length is None else min(size, fmt.max_prompt_length)
                values["prompt_tokens"][i] = size
                values["sequence_tokens"][i] = kept + fmt.max_completion_length
                values["group_tokens"][i] = fmt.num_generations * (kept + fmt.max_completion_length)
        return Measured({spec_of[m]: values[m] for m in RL_METRICS}, flags,
                        errors if any(e is not None for e in errors) else None)

    def texts_of_rows(self, columns: dict):
        prompts = columns[self.format.prompt]
        tools = columns.get(self.format.tools) if self.format.tools else None

        def row_texts(i: int):
            if prompts[i] is None:
                return None
            text, conversational = self._text(prompts[i], tools[i] if tools is not None else None)
            return [text], conversational

        return len(prompts), row_texts

    def _text(self, prompt, tools) -> tuple[str, bool]:
        if isinstance(prompt, str):
            return prompt, False
        if not (isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in prompt)):
            raise RowProblem("invalid_conversation", "the prompt is neither a string nor a list of messages")
        text_only(prompt, "prompt")  # `or None`: TRL passes no tools rather than an empty list
        return self.render([dict(m) for m in prompt], parse_tools(tools) or None, add_generation_prompt=True), True
