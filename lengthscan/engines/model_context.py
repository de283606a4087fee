"""The model's context a run measures for, shared by every kind of field: its config and
tokenizer, its limits, the token counter and the ceilings rows are counted over."""

from __future__ import annotations

from pathlib import Path

from lengthscan.measure.columns import ColumnError
from lengthscan.measure.limits import Ceiling
from lengthscan.measure.text.counter import TokenCounter


def model_context(model, tokenizer):
    if model is None:
        return None
    from lengthscan.policy.model_loading import load_model_context

    tok = tokenizer.tokenizer if isinstance(tokenizer, TokenCounter) else tokenizer
    return load_model_context(str(model), tokenizer=tok)


def model_limits_for(ctx):
    if ctx is None:
        return None
    from lengthscan.policy.model_limits import model_limits

    return model_limits(ctx)


def counting_settings(m) -> dict:
    """The token counter's settings from the run's ``MeasureOptions`` (it proves the count-only
    engine beside its counting: ``measure/text/beside.py``; a tokenizer it loads itself, which only
    the run calls, is counted on its own backend: ``fastpath.shared_backend``)."""
    return dict(max_chars=m.max_chars, count_engine=m.count_engine, verify_counts=m.verify_counts, prove_beside=True,
                share_backend=True)


def token_counter(fields, tokenizer, model, ctx, settings: dict):
    """The token counter text fields need: the given tokenizer, else the model's own."""
    if not any(f.kind.tokenized for f in fields):
        return None
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    if settings.get("prove_beside"):  # a first run begins only the engine's proof for conversations alone
        settings = {**settings, "conversations_only": all(f.kind.name == "chat" for f in fields if f.kind.tokenized)}
    if ctx is not None and ctx.tokenizer is not None:
        name = tokenizer if isinstance(tokenizer, (str, Path)) else model
        return TokenCounter(ctx.tokenizer, name=str(name), **settings)
    if tokenizer is None:
        raise ColumnError("text columns and conversations need a tokenizer: --tokenizer DIR_OR_NAME (or a --model "
                          "that has one)")
    return TokenCounter(tokenizer, **settings)


def ceilings(fields, counter, model_limits) -> list[Ceiling]:
    measured = {s.name for f in fields for s in f.specs}
    limits = []
    if model_limits is not None:
        limits += [Ceiling(m.name, m.value, m.origin) for m in model_limits.limits if m.name in measured]
        sequence = model_limits.get("sequence_tokens") if "sequence_tokens" in measured else None
        if sequence is not None:  # a decoder-only model sees the rendered conversation as its input
            limits.append(Ceiling("sequence_tokens", sequence.value, sequence.origin))
    elif counter is not None and measured & {"input_tokens", "sequence_tokens"}:
        max_len = counter.model_max_length()
        if max_len is not None:
            name = "input_tokens" if "input_tokens" in measured else "sequence_tokens"
            limits.append(Ceiling(name, max_len, "tokenizer.model_max_length"))
    return limits
