"""Preference pairs measured as TRL's ``DPOTrainer`` prepares them (trl 1.16's ``_prepare_dataset``
and ``DataCollatorForPreference``), from one batch tokenizer call for all their texts:

* **String rows**: the tokenizer's EOS text appended to chosen and rejected (unless they end with
  it); ``prompt``, ``prompt + chosen`` and ``prompt + rejected`` tokenized as ``tokenizer(text)``
  does (its special tokens: BOS at the prompt's start);
* **Conversational rows**: the prompt rendered with ``add_generation_prompt=True``, ``prompt +
  chosen`` and ``prompt + rejected`` without, by the chat template, tokenized with
  ``add_special_tokens=False`` (``apply_chat_template(tokenize=True)``), the row's tools passed;
* the prompt is the common start of the tokenized prompt and both sequences (where the template or
  a merge across the boundary changes the prompt's end, the completion starts where they differ);
  ``chosen_tokens``/``rejected_tokens`` the rest; ``sequence_tokens`` the longer side,
  ``pair_tokens`` twice it (chosen and rejected go through one forward, padded to the longest);
* with ``max_length`` (``DPOConfig.max_length``): the collator keeps each sequence's first
  ``max_length`` tokens (``keep_start``) or its last (``keep_end``); a pair whose two sequences are
  the same after the cut collapses (no preference left to learn; also a pair equal to begin with);
  with ``keep_start`` DPOTrainer drops the rows whose prompt alone fills ``max_length``.
"""

from __future__ import annotations

import numpy as np

from lengthscan.measure.chat.conversations import RowProblem
from lengthscan.measure.chat.spans import common_prefix
from lengthscan.measure.preference import PAIR_METRICS, PAIR_NOTES
from lengthscan.measure.preference.pairs import PairFormat, pair_rows
from lengthscan.measure.preference.render import TemplateRows, given_texts
from lengthscan.measure.records import Measured


class PairCounter(TemplateRows):
    """Measures preference pairs for one tokenizer (a ``TokenCounter``) and template; picklable."""

    def __init__(self, counter, fmt: PairFormat, template: str | None = None):
        super().__init__(counter, template)
        self.format = fmt

    def to_dict(self) -> dict:
        fmt = self.format
        reward = fmt.trainer == "reward"
        return {"trainer": "RewardTrainer" if reward else "DPOTrainer", "columns": {k: v for k, v in (
                    ("prompt", fmt.prompt), ("chosen", fmt.chosen), ("rejected", fmt.rejected), ("tools", fmt.tools))
                    if v},
                "prompt": "explicit" if fmt.prompt else "none (each side whole)" if reward else
                "implicit (TRL's extract_prompt)",
                "template": self.renderer.template.to_dict(), "eos_token": self.counter.facts().eos_token,
                "max_length": fmt.max_length, "truncation_mode": None if reward else fmt.truncation_mode,
                **({"processes": dict(self.shared)} if self.shared else {})}

    def signature(self) -> str:
        fmt = self.format
        return (f"{self.renderer.template.hash}|{fmt.prompt}|{fmt.chosen}|{fmt.rejected}|{fmt.tools}|"
                f"{fmt.max_length}|{fmt.truncation_mode}|{fmt.trainer}")

    @property
    def id_columns(self) -> tuple[str, ...]:
        """The columns ``clean --tokenize`` writes, as the trainer names its prepared ids."""
        return ("chosen_ids", "rejected_ids") if self.format.trainer == "reward" else (
            "prompt_ids", "chosen_ids", "rejected_ids")

    def measure(self, columns: dict, spec_of: dict, *, with_ids: bool = False,
                rendered: list | None = None) -> Measured:
        """One batch; ``with_ids`` keeps each row's ids as the trainer prepares them (``id_columns``);
        ``rendered``: the rows' texts as a worker rendered them (``rendered``)."""
        pairs = pair_rows(columns, self.format)
        n = len(pairs)
        values = {m: np.full(n, -1, np.int64) for m in PAIR_METRICS}
        notes = {k: np.zeros(n, bool) if t == "bool" else np.full(n, -1, np.int64) for k, t in PAIR_NOTES.items()}
        flags = np.zeros(n, np.int8)
        errors: list = [None] * n
        row_texts = self._row_texts(pairs) if rendered is None else given_texts(rendered)
        texts_of = self.chunk_texts(row_texts, flags, errors, "a text")
        kept: list | None = [None] * n if with_ids else None
        for jobs, ids in self.overlapped(n, texts_of):
            for i, (conversational, start) in jobs.items():
                notes["implicit_prompt"][i] = pairs[i].implicit
                found = ids[conversational][start:start + 3]
                self._fill(i, *found, values, notes)
                if kept is not None:
                    kept[i] = self._prepared(int(values["prompt_tokens"][i]), *found)
        return Measured({spec_of[m]: values[m] for m in PAIR_METRICS}, flags,
                        errors if any(e is not None for e in errors) else None, notes=notes, ids=kept)

    def texts_of_rows(self, columns: dict):
        pairs = pair_rows(columns, self.format)
        return len(pairs), self._row_texts(pairs)

    def _row_texts(self, pairs: list):
        def row_texts(i: int):
            pair = pairs[i]
            if isinstance(pair, RowProblem):
                raise pair
            return None if pair is None else (self._texts(pair), pair.conversational)

        return row_texts

    def _prepared(self, plen: int, prompt, with_chosen, with_rejected) -> tuple:
        """The row's ids as the trainer's prepared dataset holds them (``id_columns``); ``plen``: the
        prompt's tokens as ``_fill`` found them."""
        if self.format.trainer == "reward":
            return list(with_chosen), list(with_rejected)
        return list(prompt[:plen]), list(with_chosen[plen:]), list(with_rejected[plen:])

    def _texts(self, pair) -> list[str]:
        """The row's prompt, prompt + chosen and prompt + rejected texts as DPOTrainer tokenizes them."""
        if not pair.conversational:
            eos = self.counter.facts().eos_token
            if eos is None:
                raise RowProblem("template_error", "the tokenizer has no EOS token, which DPOTrainer appends to "
                                                   "string completions")
            chosen = pair.chosen if pair.chosen.endswith(eos) else pair.chosen + eos
            rejected = pair.rejected if pair.rejected.endswith(eos) else pair.rejected + eos
            # RewardTrainer splits no prompt off: its tokens are not needed
            return ["" if self.format.trainer == "reward" else pair.prompt, pair.prompt + chosen,
                    pair.prompt + rejected]
        render = self.render
        if self.format.trainer == "reward":  # each side whole, no generation prompt: the prompt is not split off
            return ["", render(pair.prompt + pair.chosen, pair.tools), render(pair.prompt + pair.rejected, pair.tools)]
        return [render(pair.prompt, pair.tools, add_generation_prompt=True),
                render(pair.prompt + pair.chosen, pair.tools), render(pair.prompt + pair.rejected, pair.tools)]

    def _fill(self, i: int, prompt, with_chosen, with_rejected, values: dict, notes: dict) -> None:
        if self.format.trainer == "reward":
            self._fill_reward(i, with_chosen, with_rejected, values, notes)
            return
        plen = min(common_prefix(prompt, with_chosen), common_prefix(prompt, with_rejected))
        chosen, rejected = len(with_chosen) - plen, len(with_rejected) - plen
        longer = plen + max(chosen, rejected)
        for name, value in (("prompt_tokens", plen), ("chosen_tokens", chosen), ("rejected_tokens", rejected),
                            ("sequence_tokens", longer), ("pair_tokens", 2 * longer)):
            values[name][i] = value
        notes["shared_tokens"][i] = common_prefix(with_chosen[plen:], with_rejected[plen:])
        limit, mode = self.format.max_length, self.format.truncation_mode
        if limit is None:
            notes["pair_collapsed"][i] = list(with_chosen) == list(with_rejected)
            return
        if mode == "keep_start":
            cut_chosen, cut_rejected = with_chosen[:limit], with_rejected[:limit]
            notes["chosen_kept"][i] = max(0, min(limit, len(with_chosen)) - plen)
            notes["rejected_kept"][i] = max(0, min(limit, len(with_rejected)) - plen)
            notes["trainer_drops"][i] = plen >= limit
        else:
            cut_chosen, cut_rejected = with_chosen[-limit:], with_rejected[-limit:]
            notes["chosen_kept"][i], notes["rejected_kept"][i] = min(chosen, limit), min(rejected, limit)
            notes["prompt_cut"][i] = longer > limit
        notes["pair_collapsed"][i] = not notes["trainer_drops"][i] and list(cut_chosen) == list(cut_rejected)

    def _fill_reward(self, i: int, chosen, rejected, values: dict, notes: dict) -> None:
        """RewardTrainer: each side one sequence (its prompt in it); ``prompt_tokens`` the tokens both
        start with; ``max_length`` drops a pair with either side over it (nothing is cut)."""
        shared = common_prefix(chosen, rejected)
        longer = max(len(chosen), len(rejected))
        sizes = {"prompt_tokens": shared, "chosen_tokens": len(chosen), "rejected_tokens": len(rejected),
                 "sequence_tokens": longer, "pair_tokens": 2 * longer}
        for name, value in sizes.items():
            values[name][i] = value
        notes["shared_tokens"][i] = shared
        notes["pair_collapsed"][i] = list(chosen) == list(rejected)
        limit = self.format.max_length
        if limit is not None:
            notes["trainer_drops"][i] = longer > limit
