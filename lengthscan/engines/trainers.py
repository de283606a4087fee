"""Set-up of the trainer-shaped fields: preference pairs as TRL's DPOTrainer prepares them and RL
prompts as its GRPOTrainer tokenizes them, each measured alone."""

from __future__ import annotations

from lengthscan.engines.model_context import (
    ceilings,
    counting_settings,
    model_context,
    model_limits_for,
    token_counter,
)
from lengthscan.engines.options import MeasureOptions
from lengthscan.measure.batch import AudioSettings, role_fields
from lengthscan.measure.columns import ColumnError
from lengthscan.measure.setup import Setup


def prepare_pairs(m: MeasureOptions) -> Setup:
    """Preference pairs: one field measured as TRL's DPOTrainer prepares it."""
    from lengthscan.measure.preference.counter import PairCounter
    from lengthscan.measure.preference.pairs import PairFormat

    if not (m.chosen and m.rejected):
        raise ColumnError("preference pairs need both --chosen COL and --rejected COL")
    _alone(m, "preference pairs (--chosen, --rejected, --prompt)", rl=True)
    if m.pair_max_length is not None and m.pair_max_length < 1:
        raise ColumnError(f"--pair-max-length {m.pair_max_length}: give a positive number of tokens")
    fmt = PairFormat(m.chosen, m.rejected, m.prompt, m.tools, m.pair_max_length, m.truncation_mode, m.pair_trainer)
    return _setup(m, role_fields(pairs=fmt), lambda counter, template: PairCounter(counter, fmt, template))


def prepare_prompts(m: MeasureOptions) -> Setup:
    """RL prompts: one field measured as TRL's GRPOTrainer tokenizes it, with the completion budget."""
    from lengthscan.measure.preference.prompts import PromptCounter, PromptFormat

    if not m.prompt:
        raise ColumnError(f"--rl {m.rl} measures prompts: give --prompt COL")
    _alone(m, "RL prompts (--rl, --prompt)")
    if m.max_completion_length < 1 or m.num_generations < 1 or (m.max_prompt_length is not None
                                                                and m.max_prompt_length < 1):
        raise ColumnError("--max-completion-length, --num-generations and --max-prompt-length: give positive numbers")
    fmt = PromptFormat(m.prompt, m.rl, m.tools, m.max_completion_length, m.num_generations, m.max_prompt_length)
    return _setup(m, role_fields(prompts=fmt), lambda counter, template: PromptCounter(counter, fmt, template))


def _alone(m: MeasureOptions, what: str, *, rl: bool = False) -> None:
    others = [name for name, value in (("--messages", m.messages), ("--completion", m.completion),
                                       ("--input", m.input), ("--target", m.target), ("--audio", m.audio),
                                       ("--images", m.images), ("--videos", m.videos), ("--audios", m.audios),
                                       ("--rl", m.rl if rl else None), ("--reasoning", m.reasoning)) if value]
    if others:
        raise ColumnError(f"{what} are measured alone: leave out {', '.join(others)}")


def _setup(m: MeasureOptions, fields, make) -> Setup:
    """The field's set-up: the model's context, the token counter, the field's counter (``make``:
    (token counter, template) -> it), its template checked now, and the model's limits, a sequence
    being one decoder input as a conversation is."""
    ctx = model_context(m.model, m.tokenizer)
    counter = token_counter(fields, m.tokenizer, m.model, ctx, counting_settings(m))
    measurer = make(counter, str(m.chat_template) if m.chat_template else None)
    measurer.check()
    limits = model_limits_for(ctx)
    if limits is not None:
        limits = limits.for_conversations()
    return Setup(fields, counter, AudioSettings(), limits, ceilings(fields, counter, limits), pairs=measurer)
