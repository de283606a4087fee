"""A preference pair: prompt, chosen and rejected as TRL's DPOTrainer tokenizes them; an RL
prompt as GRPOTrainer tokenizes it (``measure.preference``)."""

from __future__ import annotations

from lengthscan.measure.kinds.base import Kind, MeasureContext, raw_columns_of
from lengthscan.measure.records import Measured


class PreferenceKind(Kind):
    name = "preference"
    tokenized = True
    errors_in_reasons = True
    python_bound = True

    def pair(self, f):
        return self._spec(f, "chosen_tokens"), self._spec(f, "rejected_tokens")

    @staticmethod
    def _spec(f, name: str):
        return next(s for s in f.specs if s.name == name)

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        columns = raw_columns_of(batch, f)
        return ctx.pairs.measure(columns, {s.name: s for s in f.specs}, with_ids=ctx.with_ids)

    def notes(self, f) -> dict[str, str]:
        from lengthscan.measure.preference import PAIR_NOTES

        return dict(PAIR_NOTES)

    def raw_columns(self, f) -> tuple[str, ...]:
        return f.columns  # conversations as the file has them

    def named_by(self, f) -> str:
        return "--chosen"


class RLPromptKind(Kind):
    name = "rl_prompt"
    tokenized = True
    errors_in_reasons = True
    python_bound = True

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        columns = raw_columns_of(batch, f)
        return ctx.pairs.measure(columns, {s.name: s for s in f.specs})

    def raw_columns(self, f) -> tuple[str, ...]:
        return f.columns  # conversations as the file has them

    def named_by(self, f) -> str:
        return "--prompt"
