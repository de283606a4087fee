"""A preference pair: prompt, chosen and rejected as TRL's DPOTrainer tokenizes them; an RL
prompt as GRPOTrainer tokenizes it (``measure.preference``). Both render in worker processes
(``job``) where there are some, this process tokenizing what they rendered."""

from __future__ import annotations

from lengthscan.measure.kinds.base import Kind, MeasureContext, raw_columns_of
from lengthscan.measure.records import Measured


class _RenderedApart(Kind):
    """A field whose rows a worker process renders (``TextsJob``), this process tokenizing them."""

    tokenized = True
    errors_in_reasons = True
    python_bound = True
    renders_apart = True

    def job(self, batch, f, split_src, ctx: MeasureContext, light: str | None):
        """The batch for a worker process: its rows rendered there (``TemplateRows.rendered``)."""
        from lengthscan.measure.preference.render import TextsJob

        return TextsJob(f.role, raw_columns_of(batch, f), ctx.pairs.apart())

    def raw_columns(self, f) -> tuple[str, ...]:
        return f.columns  # conversations as the file has them


class PreferenceKind(_RenderedApart):
    name = "preference"

    def pair(self, f):
        return self._spec(f, "chosen_tokens"), self._spec(f, "rejected_tokens")

    @staticmethod
    def _spec(f, name: str):
        return next(s for s in f.specs if s.name == name)

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        columns = raw_columns_of(batch, f)
        return ctx.pairs.measure(columns, {s.name: s for s in f.specs}, with_ids=ctx.with_ids,
                                 rendered=ctx.rendered.get(f.role))

    def notes(self, f) -> dict[str, str]:
        from lengthscan.measure.preference import PAIR_NOTES

        return dict(PAIR_NOTES)

    def named_by(self, f) -> str:
        return "--chosen"


class RLPromptKind(_RenderedApart):
    name = "rl_prompt"

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        columns = raw_columns_of(batch, f)
        return ctx.pairs.measure(columns, {s.name: s for s in f.specs}, rendered=ctx.rendered.get(f.role))

    def named_by(self, f) -> str:
        return "--prompt"
