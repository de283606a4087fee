"""Option records: what to measure, how to sample, the rules, the outputs, the dataset, the run.

Every field is declared once with ``optionfield.option``: its default, its help text and its
flag. The CLI's flags (``cli.flags``) and the keyword forms of ``lengthscan.audit``/``clean`` (and
their docstrings) are generated from these declarations (``engines.spec``), so an option is one
field here and nothing passes it on by hand. Every record is frozen; ``replace`` makes a changed copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.optionfield import option
from lengthscan.sources.sampling import DEFAULT_SEED
from lengthscan.sources.scan import BATCH_ROWS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from lengthscan.measure.text.counter import TokenCounter


class OptionError(ValueError):
    """An option value out of its range (exit code 2)."""


def _at_least(name: str, value, low: int, high: int | None = None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low
                              or (high is not None and value > high)):
        between = f"between {low} and {high:,}" if high is not None else f"of at least {low}"
        raise OptionError(f"{name} {value!r}: give a whole number {between}")


def _one_of(name: str, value, choices) -> None:
    if value not in choices:
        raise OptionError(f"{name} {value!r}: one of {', '.join(str(c) for c in choices)}")


#: the largest seed numpy's generators take; worker processes past this many are a typo, not a plan
MAX_SEED, MAX_NUM_PROC = 2**32 - 1, 512
#: what measures the rows: this process (and its workers), or a Ray cluster
ENGINES = ("local", "ray")
TRAIN_ON = ("assistant", "last", "all")
ACTIONS = ("drop", "truncate", "drop-turns")
DATASET_FORMATS = ("arrow", "parquet")


Progress = Callable[[str, int, int], None]
"""Called as ``progress(split, rows_done, rows_total)`` while measuring or writing."""

AUDIT, CLEAN = ("audit",), ("clean",)


@dataclass(frozen=True)
class MeasureOptions:
    """What to measure: the columns by role, the tokenizer and model they are counted for."""

    input: str | None = option(None, "--input", "column holding the model input text", metavar="COL")
    target: str | None = option(None, "--target", "column holding the target text (tokenized with text_target)",
                                metavar="COL")
    audio: str | None = option(None, "--audio", "column holding the input audio: paths (relative to the manifest), "
                               "bytes, or an HF Audio column", metavar="COL")
    messages: str | None = option(None, "--messages", "column holding conversations: lists of messages "
                                  "{role, content} (ShareGPT {from, value} is converted)", metavar="COL")
    prompt: str | None = option(None, "--prompt", "TRL's prompt-completion form: the prompt column (messages or "
                                "text), with --completion", metavar="COL")
    completion: str | None = option(None, "--completion", "the completion column, with --prompt", metavar="COL")
    chosen: str | None = option(None, "--chosen", "preference pairs (DPO): the chosen answers' column (strings or "
                                "message lists), with --rejected and optionally --prompt (else implicit, as TRL "
                                "extracts it)", metavar="COL")
    rejected: str | None = option(None, "--rejected", "preference pairs: the rejected answers' column, with --chosen",
                                  metavar="COL")
    pair_max_length: int | None = option(None, "--pair-max-length", "preference pairs: DPOConfig.max_length, each "
                                         "sequence cut to N tokens by the collator (the pairs it collapses are "
                                         "flagged)", type=int, metavar="N")
    pair_trainer: str = option("dpo", "--pair-trainer", "preference pairs: measured as TRL's DPOTrainer prepares them "
                               "(dpo, default) or its RewardTrainer (reward: each side whole, rows over "
                               "--pair-max-length dropped)", choices=("dpo", "reward"))
    truncation_mode: str = option("keep_start", "--truncation-mode", "preference pairs: DPOConfig.truncation_mode, "
                                  "which end of a sequence --pair-max-length keeps", choices=("keep_start", "keep_end"))
    rl: str | None = option(None, "--rl", "RL prompts: --prompt COL measured as TRL's GRPOTrainer tokenizes them, "
                            "with the completion budget", choices=("grpo",))
    max_completion_length: int = option(512, "--max-completion-length", "with --rl: GRPOConfig.max_completion_length "
                                        "(default 512)", type=int, metavar="N")
    max_prompt_length: int | None = option(None, "--max-prompt-length", "with --rl: a max_prompt_length as earlier TRL "
                                           "releases cut prompts (from the left; the installed GRPOTrainer has "
                                           "none)", type=int, metavar="N")
    num_generations: int = option(8, "--num-generations", "with --rl: GRPOConfig.num_generations, completions per "
                                  "prompt (default 8)", type=int, metavar="G")
    tools: str | None = option(None, "--tools", "column of per-row tool definitions (a list or a JSON string)",
                               metavar="COL")
    chat_template: str | None = option(None, "--chat-template", "a Jinja chat template to render conversations "
                                       "with, or the NAME of one TRL ships (qwen3, llama3, qwen3_training, ...; "
                                       "default: the tokenizer's)", metavar="FILE|NAME")
    images: str | None = option(None, "--images", "column of per-row image lists (paths relative to the data file, "
                                "bytes, or an Image() column), one per image part {\"type\": \"image\"} in order, "
                                "as TRL lays them out", metavar="COL")
    processor: str | None = option(None, "--processor", "the model's processor (its preprocessor_config.json): "
                                   "image tokens as it expands them (default: --model)", metavar="DIR_OR_NAME")
    max_pixels: int | None = option(None, "--max-pixels", "count images as if the image processor's max_pixels "
                                    "were N (try a cap before setting it)", type=int, metavar="N")
    pan_and_scan: bool = option(False, "--pan-and-scan", "count Gemma 3's images as the processor called with "
                                "do_pan_and_scan=True crops them (its default: no crops)", action="store_true")
    videos: str | None = option(None, "--videos", "column of per-row video lists (paths relative to the data file, "
                                "bytes, or lists of frame images), one per video part {\"type\": \"video\"} in "
                                "order", metavar="COL")
    audios: str | None = option(None, "--audios", "column of per-row audio lists (paths relative to the data file, "
                                "bytes, or an Audio(decode=False) column), one per audio part {\"type\": \"audio\"} "
                                "in order", metavar="COL")
    fps: float | None = option(None, "--fps", "count videos as if the processor sampled F frames a second "
                               "(apply_chat_template's fps)", type=float, metavar="F")
    num_frames: int | None = option(None, "--num-frames", "count videos as if the processor sampled N frames of "
                                    "each (apply_chat_template's num_frames)", type=int, metavar="N")
    max_frames: int | None = option(None, "--max-frames", "count videos as if the video processor's max_frames "
                                    "were N", type=int, metavar="N")
    reasoning: bool = option(False, "--reasoning", "count the reasoning of assistant turns (reasoning_content, "
                             "thinking, <think> blocks): reasoning_tokens trained, and the spans the template drops",
                             action="store_true")
    train_on: str = option("assistant", "--train-on", "which tokens of a conversation are trained: every assistant "
                           "message (default), the last one, or all tokens", choices=TRAIN_ON)
    tokenizer: str | Path | PreTrainedTokenizerBase | TokenCounter | None = option(
        None, "--tokenizer", "tokenizer directory, hub name or tokenizer.json file (default: "
                               "--model); in Python also a loaded tokenizer or a TokenCounter", metavar="DIR_OR_NAME")
    model: str | None = option(None, "--model", "model directory, hub name or config.json: its limits, sampling "
                               "rate and frame rule", metavar="DIR_OR_NAME")
    sampling_rate: int | None = option(None, "--sampling-rate", "the model's audio sampling rate (default: the "
                                       "--model feature extractor's)", type=int, metavar="HZ")
    max_chars: int = option(DEFAULT_MAX_CHARS, "--max-chars", "texts longer than N characters are recorded as too "
                            "long, not tokenized (default 10,000,000)", type=int, metavar="N")
    count_engine: str = option("auto", "--count-engine", "auto (default): byte-level BPE texts counted by a "
                               "count-only engine (tiktoken) where it is proven exact for the tokenizer, else by the "
                               "tokenizer; tokenizers: always the tokenizer", choices=("auto", "tokenizers"))
    verify_counts: int = option(0, "--verify-counts", "recount N random rows that the count-only engine counted "
                                "with the tokenizer itself; any difference stops the run (exit 3)", type=int,
                                metavar="N")

    def __post_init__(self):
        from lengthscan.measure.audio.durations import MAX_AUDIO_RATE
        from lengthscan.measure.text.counter import COUNT_ENGINES

        _at_least("--max-chars", self.max_chars, 1)
        _at_least("--verify-counts", self.verify_counts, 0)
        _at_least("--max-pixels", self.max_pixels, 1)
        _at_least("--num-frames", self.num_frames, 1)
        _at_least("--max-frames", self.max_frames, 1)
        if self.fps is not None and not self.fps > 0:
            raise OptionError(f"--fps {self.fps!r}: give a number of frames a second above 0")
        _one_of("--count-engine", self.count_engine, COUNT_ENGINES)
        _at_least("--sampling-rate", self.sampling_rate, 1, MAX_AUDIO_RATE)


@dataclass(frozen=True)
class SampleOptions:
    """Which rows: the split (a hub dataset's config and revision), and a seeded sample of rows or
    of blocks (Parquet row groups), or every row. ``clean`` decides every row: it reads only the split."""

    split: str | None = option(None, "--split", "measure only this split of a multi-split source")
    config: str | None = option(None, "--config", "a hub dataset's configuration (subset)", metavar="NAME")
    revision: str | None = option(None, "--revision", "a hub dataset's branch, tag or commit (default main), pinned "
                                  "to its commit for the whole run", metavar="REV")
    sample: int | float | str | None = option(None, "--sample", "measure a uniform random sample: a row count (600), "
                                              "a fraction "
                            "(0.01) or a percentage (1%%); default: every row up to 200,000 rows, a 100,000-row "
                            "sample above", commands=AUDIT, metavar="N|FRACTION")
    sample_unit: str | None = option(None, "--sample-unit", "what --sample draws: rows, or whole Parquet row groups "
                                     "(blocks: a small share of the bytes; intervals from a cluster bootstrap). "
                                     "Default: block for remote Parquet and local Parquet over 2 GiB, row elsewhere",
                                     commands=AUDIT, choices=("row", "block"))
    full: bool = option(False, "--full", "measure every row", commands=AUDIT, action="store_true")
    seed: int = option(DEFAULT_SEED, "--seed", "sample seed (default 0)", commands=AUDIT, type=int)

    def __post_init__(self):
        _at_least("--seed", self.seed, 0, MAX_SEED)
        if self.sample_unit not in (None, "row", "block"):
            raise OptionError(f"--sample-unit {self.sample_unit!r}: row or block")


@dataclass(frozen=True)
class RuleOptions:
    """The ``--limit`` rules and what rows failing them get."""

    limits: tuple = option((), "--limit", "METRIC OP VALUE[:ACTION], e.g. 'input_tokens<=1024', "
                           "'target_tokens<=p99:truncate', 'target_tokens/input_seconds<=z4' (repeatable)",
                           action="append", metavar="RULE")
    action: str = option("drop", "--action", "what a row over an upper token limit gets (default drop); drop-turns: "
                         "a conversation keeps its longest prefix ending with an assistant message that fits",
                         choices=ACTIONS)
    keep_empty_targets: bool = option(False, "--keep-empty-targets", "keep rows whose target has no content tokens, "
                                      "conversations without a trained token and collapsed preference pairs "
                                      "(dropped by default)", action="store_true")
    crop_audio: bool = option(False, "--crop-audio", "crop audio over an input_seconds limit instead of dropping "
                              "the row (classification)", action="store_true")
    target_is_label: bool = option(False, "--target-is-label", "with --crop-audio: the --target column is a label "
                                   "(a class, a speaker), not a transcript of the clip, so a cropped clip keeps it",
                                   action="store_true")
    fail_over: str | int | float | None = option(None, "--fail-over", "exit 1 when more than this share (1%%) or "
                                                 "number of rows "
                               "would be dropped or truncated", metavar="SHARE|ROWS")

    def __post_init__(self):
        object.__setattr__(self, "limits", tuple(self.limits or ()))


@dataclass(frozen=True)
class OutputOptions:
    """Where the outputs go and what the report may hold."""

    out: str | Path | None = option(None, "--out", "output directory", metavar="DIR", overrides={
        "audit": {"default": "lengthscan-report", "help": "output directory (default ./lengthscan-report)"},
        "clean": {"required": True, "help": "output directory (must not exist unless --overwrite)"}})
    overwrite: bool = option(False, "--overwrite", "replace --out even if it holds other files", action="store_true",
                             overrides={"clean": {"help": "replace an existing --out"}})
    redact: bool = option(False, "--redact", "keep every text of the data out of the report (row ids and lengths "
                          "only)", action="store_true")
    id_column: str | None = option(None, "--id", "a column that identifies rows (an id, a URL ...): carried into "
                                   "lengths.parquet beside row (rejects/ keeps every column)", metavar="COL")


@dataclass(frozen=True)
class DatasetOptions:
    """What ``clean`` writes into ``dataset/`` beside the source's columns, and how."""

    length_column: str | None = option("length", "--length-column", "name of the length column added for "
                                       "group_by_length (default length)", commands=CLEAN, metavar="NAME",
                                       type=str)  # '' is refused by the record, with what to give instead
    length_from: str | None = option(None, "--length-from", "measurement that fills it, after truncation (default "
                                     "input_tokens; sequence_tokens for conversations, input_samples for audio; "
                                     "'none' adds no column)", commands=CLEAN, metavar="METRIC")
    embed_audio: bool = option(False, "--embed-audio", "embed audio files' bytes in Audio columns of the output "
                               "(default: keep paths)", commands=CLEAN, action="store_true")
    tokenize: bool = option(False, "--tokenize", "also write input_ids, attention_mask and labels (the tokenizer's "
                            "own call on the final texts)", commands=CLEAN, action="store_true")
    format: str = option("arrow", "--format", "dataset/ and rejects/ as Arrow (save_to_disk, default) or Parquet "
                         "shards", commands=CLEAN, choices=DATASET_FORMATS)
    decide_only: bool = option(True, "--no-decide-only", "count every row in full even when only numeric "
                               "input_tokens upper limits are given", commands=CLEAN, invert=True)

    def __post_init__(self):
        if self.length_column is not None and not str(self.length_column).strip():
            raise OptionError("--length-column '': give a column name, or --length-from none to add no length column")


@dataclass(frozen=True)
class RunOptions:
    """How to run: the engine, the length cache, worker processes, batch size, progress and the command line."""

    engine: str = option("local", "--engine", "local (default) or ray: the same measurement on Ray (pip "
                         "install \"lengthscan[ray]\")", choices=ENGINES)
    ray_address: str | None = option(None, "--ray-address", "with --engine ray: a cluster to join ('auto' for a "
                                     "running one; default: start a local Ray)", metavar="ADDR")
    num_blocks: int | None = option(None, help="with engine 'ray': the number of read tasks per split (default: about "
                                    "eight per actor)",
                                    why="a tuning knob of the Ray engine for the library")
    cache: bool = option(True, "--no-cache", "neither read nor write the per-row length cache", invert=True)
    num_proc: int | None = option(None, "--num-proc", "measure in N processes (default: one, whose tokenizer uses "
                                  "every core; conversations of 2,000 rows or more: one per core, at most 4); "
                                  "conversations, preference pairs and RL prompts render in workers that hold no "
                                  "tokenizer",
                                  type=int, metavar="N")
    batch_rows: int = option(BATCH_ROWS, help="rows per measured batch", why="memory tuning for the library")
    progress: Progress | None = option(None, help="called as progress(split, rows_done, rows_total)",
                                       why="a callback")
    command: str | None = option(None, help="the command line recorded in report.json",
                                 why="the CLI fills it with its own argv")

    def __post_init__(self):
        _one_of("--engine", self.engine, ENGINES)
        _at_least("--num-proc", self.num_proc, 1, MAX_NUM_PROC)
        _at_least("batch_rows", self.batch_rows, 1)
        _at_least("num_blocks", self.num_blocks, 1)


RECORDS = (MeasureOptions, SampleOptions, RuleOptions, OutputOptions, DatasetOptions, RunOptions)
