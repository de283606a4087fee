"""Preference pair statistics that are not a length distribution: the pairs a trainer's truncation
collapses or drops, the prompts it cuts, the completions it shortens, the tokens chosen and
rejected share. Counts only, so they merge exactly across batches, processes and machines."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class PairTally:
    """Counts over the measured preference pairs of one split."""

    measured: int = 0          # pairs with lengths
    collapsed: int = 0         # chosen and rejected the same after the trainer's cut (or as given)
    trainer_drops: int = 0     # DPOTrainer filters the row out (its prompt alone fills max_length)
    prompt_cut: int = 0        # keep_end: the prompt loses its first tokens
    completion_cut: int = 0    # a side keeps fewer completion tokens than it has
    implicit_prompt: int = 0   # the prompt found by TRL's extract_prompt
    pair_tokens: int = 0       # the padded concatenated forwards' tokens, over measured pairs
    shared_tokens: int = 0     # the chosen and rejected completions' common first tokens, over measured pairs
    completion_tokens: int = 0  # chosen + rejected tokens, over measured pairs

    def add(self, values: dict, notes: dict | None) -> None:
        measured = values["sequence_tokens"] >= 0
        self.measured += int(measured.sum())
        self.pair_tokens += int(values["pair_tokens"][measured].sum())
        self.completion_tokens += int((values["chosen_tokens"] + values["rejected_tokens"])[measured].sum())
        if notes is None:
            return
        self.shared_tokens += int(np.maximum(notes["shared_tokens"][measured], 0).sum())
        self.collapsed += int((notes["pair_collapsed"] & measured).sum())
        self.trainer_drops += int((notes["trainer_drops"] & measured).sum())
        self.prompt_cut += int((notes["prompt_cut"] & measured).sum())
        self.implicit_prompt += int((notes["implicit_prompt"] & measured).sum())
        kept = notes["chosen_kept"] >= 0
        cut = kept & ((notes["chosen_kept"] < values["chosen_tokens"])
                      | (notes["rejected_kept"] < values["rejected_tokens"]))
        self.completion_cut += int((cut & measured & ~notes["trainer_drops"]).sum())

    def merge(self, other: PairTally) -> PairTally:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
