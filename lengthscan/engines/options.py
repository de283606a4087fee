"""Option records: what to measure, how to sample, the rules, the outputs, the run.

Built once at the edge (the CLI, or the keyword arguments of ``lengthscan.audit``/``clean``/
``audit_ray``/``clean_ray``) and passed down whole, so that no layer re-passes 30 keyword
arguments. Every record is frozen; ``replace`` makes a changed copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.sampling import DEFAULT_SEED
from lengthscan.sources.scan import BATCH_ROWS


class OptionError(ValueError):
    """An option value out of its range (exit code 2)."""


def _at_least(name: str, value, low: int, high: int | None = None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low
                              or (high is not None and value > high)):
        between = f"between {low} and {high:,}" if high is not None else f"of at least {low}"
        raise OptionError(f"{name} {value!r}: give a whole number {between}")


#: the largest seed numpy's generators take; worker processes past this many are a typo, not a plan
MAX_SEED, MAX_NUM_PROC = 2**32 - 1, 512


Progress = Callable[[str, int, int], None]
"""Called as ``progress(split, rows_done, rows_total)`` while measuring or writing."""


@dataclass(frozen=True)
class MeasureOptions:
    """What to measure: the columns by role, the tokenizer and model they are counted for."""

    input: str | None = None
    target: str | None = None
    audio: str | None = None
    tokenizer: object = None          # a directory, a hub name, a loaded tokenizer or a TokenCounter
    model: str | None = None
    sampling_rate: int | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    messages: str | None = None       # a column of conversations (lists of messages)
    prompt: str | None = None         # TRL's prompt-completion form: the prompt column ...
    completion: str | None = None     # ... and the completion column
    tools: str | None = None          # per-row tool definitions (a list or a JSON string)
    chat_template: str | None = None  # a Jinja file (default: the tokenizer's chat template)
    train_on: str = "assistant"       # which tokens are trained: assistant, last or all
    count_engine: str = "auto"        # auto: the count-only BPE engine where proven exact; tokenizers: never
    verify_counts: int = 0            # rows the engine counted that are recounted by the tokenizer itself
    images: str | None = None         # a column of per-row images (paths, bytes, an Image() feature)
    processor: str | None = None      # the model's processor (directory or hub name): image tokens
    max_pixels: int | None = None     # the image processor's max_pixels, for a run that tries a cap

    def __post_init__(self):
        from lengthscan.measure.audio.durations import MAX_AUDIO_RATE
        from lengthscan.measure.text.counter import COUNT_ENGINES

        _at_least("--max-chars", self.max_chars, 1)
        _at_least("--verify-counts", self.verify_counts, 0)
        _at_least("--max-pixels", self.max_pixels, 1)
        if self.count_engine not in COUNT_ENGINES:
            raise OptionError(f"--count-engine {self.count_engine!r}: one of {', '.join(COUNT_ENGINES)}")
        _at_least("--sampling-rate", self.sampling_rate, 1, MAX_AUDIO_RATE)


@dataclass(frozen=True)
class SampleOptions:
    """Which rows: the split (a hub dataset's config and revision), and a seeded sample of rows or
    of blocks (Parquet row groups), or every row."""

    split: str | None = None
    sample: object = None             # a row count, a fraction or a percentage text
    full: bool = False
    seed: int = DEFAULT_SEED
    sample_unit: str | None = None    # "row", "block"; None: block for remote and large Parquet, else row
    config: str | None = None
    revision: str | None = None

    def __post_init__(self):
        _at_least("--seed", self.seed, 0, MAX_SEED)
        if self.sample_unit not in (None, "row", "block"):
            raise OptionError(f"--sample-unit {self.sample_unit!r}: row or block")


@dataclass(frozen=True)
class RuleOptions:
    """The ``--limit`` rules and what rows failing them get."""

    limits: tuple = ()
    action: str = "drop"
    keep_empty_targets: bool = False
    crop_audio: bool = False
    target_is_label: bool = False     # --crop-audio with a --target: the target is a label, not a transcript
    fail_over: object = None          # '1%' or a row count: the gate

    def __post_init__(self):
        object.__setattr__(self, "limits", tuple(self.limits or ()))


@dataclass(frozen=True)
class OutputOptions:
    """Where the outputs go and what the report may hold."""

    out: str | Path | None = None
    overwrite: bool = False
    redact: bool = False
    id_column: str | None = None      # --id COL: carried into lengths.parquet (rejects hold every column)


@dataclass(frozen=True)
class DatasetOptions:
    """What ``clean`` writes into ``dataset/`` beside the source's columns, and how."""

    length_column: str | None = "length"
    length_from: str | None = None
    embed_audio: bool = False
    tokenize: bool = False
    format: str = "arrow"
    decide_only: bool = True

    def __post_init__(self):
        if self.length_column is not None and not str(self.length_column).strip():
            raise OptionError("--length-column '': give a column name, or --length-from none to add no length column")


@dataclass(frozen=True)
class RunOptions:
    """How to run: the length cache, batch size, worker processes, progress and the command line."""

    cache: bool = True
    batch_rows: int = BATCH_ROWS
    num_proc: int = 1
    progress: Progress | None = None
    command: str | None = None

    def __post_init__(self):
        _at_least("--num-proc", self.num_proc, 1, MAX_NUM_PROC)
        _at_least("batch_rows", self.batch_rows, 1)


RECORDS = (MeasureOptions, SampleOptions, RuleOptions, OutputOptions, DatasetOptions, RunOptions)


def split_options(kwargs: dict, *records) -> tuple:
    """The records ``records`` built from one flat dict of keyword arguments (the public functions'
    signatures); a keyword that none of them has is a TypeError, as in any Python call."""
    known = {f.name: r for r in records for f in fields(r)}
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    return tuple(r(**{k: v for k, v in kwargs.items() if known[k] is r}) for r in records)
