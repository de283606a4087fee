"""Every flag shared by two subcommands, declared once, and the option records built from them."""

from __future__ import annotations

import argparse


def named(value: str) -> str:
    """An argparse type: a column, path or hub name that is not empty (``--tokenizer ""`` would read
    as no tokenizer at all, ``--out ""`` as the working directory)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty name")
    return value


#: name -> (flag, argparse keyword arguments); ``help`` may be prefixed per subcommand ("data mode: ").
FLAGS: dict[str, tuple[str, dict]] = {
    "input": ("--input", dict(metavar="COL", help="column holding the model input text")),
    "audio": ("--audio", dict(metavar="COL", help="column holding the input audio: paths (relative to the "
                                                   "manifest), bytes, or an HF Audio column")),
    "target": ("--target", dict(metavar="COL", help="column holding the target text (tokenized with text_target)")),
    "messages": ("--messages", dict(metavar="COL", help="column holding conversations: lists of messages "
                                                        "{role, content} (ShareGPT {from, value} is converted)")),
    "prompt": ("--prompt", dict(metavar="COL", help="TRL's prompt-completion form: the prompt column (messages or "
                                                    "text), with --completion")),
    "completion": ("--completion", dict(metavar="COL", help="the completion column, with --prompt")),
    "tools": ("--tools", dict(metavar="COL", help="column of per-row tool definitions (a list or a JSON string)")),
    "chat_template": ("--chat-template", dict(metavar="FILE|NAME", help="a Jinja chat template to render "
                                              "conversations with, or the NAME of one TRL ships (qwen3, llama3, "
                                              "qwen3_training, ...; default: the tokenizer's)")),
    "images": ("--images", dict(metavar="COL", help="column of per-row image lists (paths relative to the data "
                                                   "file, bytes, or an Image() column), one per image part "
                                                   "{\"type\": \"image\"} in order, as TRL lays them out")),
    "processor": ("--processor", dict(metavar="DIR_OR_NAME", help="the model's processor (its "
                                                                  "preprocessor_config.json): image tokens as it "
                                                                  "expands them (default: --model)")),
    "max_pixels": ("--max-pixels", dict(type=int, metavar="N", help="count images as if the image processor's "
                                                                    "max_pixels were N (try a cap before setting it)")),
    "train_on": ("--train-on", dict(choices=("assistant", "last", "all"), default="assistant",
                                    help="which tokens of a conversation are trained: every assistant message "
                                         "(default), the last one, or all tokens")),
    "tokenizer": ("--tokenizer", dict(metavar="DIR_OR_NAME", help="tokenizer directory, hub name or tokenizer.json "
                                                                   "file (default: --model)")),
    "model": ("--model", dict(metavar="DIR_OR_NAME", help="model directory, hub name or config.json: its limits, "
                                                          "sampling rate and frame rule")),
    "sampling_rate": ("--sampling-rate", dict(
        type=int, metavar="HZ", help="the model's audio sampling rate (default: the --model feature extractor's)")),
    "split": ("--split", dict(help="measure only this split of a multi-split source")),
    "sample": ("--sample", dict(metavar="N|FRACTION", help="measure a uniform random sample: a row count (600), "
                                                           "a fraction (0.01) or a percentage (1%%); default: every "
                                                           "row up to 200,000 rows, a 100,000-row sample above")),
    "full": ("--full", dict(action="store_true", help="measure every row")),
    "sample_unit": ("--sample-unit", dict(choices=("row", "block"), help="what --sample draws: rows, or whole "
                                          "Parquet row groups (blocks: a small share of the bytes; intervals from a "
                                          "cluster bootstrap). Default: block for remote Parquet and local Parquet "
                                          "over 2 GiB, row elsewhere")),
    "config": ("--config", dict(metavar="NAME", help="a hub dataset's configuration (subset)")),
    "revision": ("--revision", dict(metavar="REV", help="a hub dataset's branch, tag or commit (default main), "
                                                         "pinned to its commit for the whole run")),
    "seed": ("--seed", dict(type=int, default=0, help="sample seed (default 0)")),
    "max_chars": ("--max-chars", dict(type=int, default=None, metavar="N",
                                      help="texts longer than N characters are recorded as too long, not tokenized "
                                           "(default 10,000,000)")),
    "count_engine": ("--count-engine", dict(choices=("auto", "tokenizers"), default="auto",
                                            help="auto (default): byte-level BPE texts counted by a count-only "
                                                 "engine (tiktoken) where it is proven exact for the tokenizer, "
                                                 "else by the tokenizer; tokenizers: always the tokenizer")),
    "verify_counts": ("--verify-counts", dict(type=int, default=0, metavar="N",
                                              help="recount N random rows that the count-only engine counted with "
                                                   "the tokenizer itself; any difference stops the run (exit 3)")),
    "no_cache": ("--no-cache", dict(action="store_true", help="neither read nor write the per-row length cache")),
    "engine": ("--engine", dict(choices=("local", "ray"), default="local",
                                help="local (default) or ray: the same measurement on Ray Data "
                                     "(pip install \"lengthscan[ray]\")")),
    "ray_address": ("--ray-address", dict(metavar="ADDR", help="with --engine ray: a cluster to join ('auto' for a "
                                                               "running one; default: start a local Ray)")),
    "num_proc": ("--num-proc", dict(type=int, default=1, metavar="N",
                                    help="measure in N worker processes (default 1: one process whose tokenizer "
                                         "uses every core)")),
    "limit": ("--limit", dict(action="append", default=[], metavar="RULE",
                              help="METRIC OP VALUE[:ACTION], e.g. 'input_tokens<=1024', "
                                   "'target_tokens<=p99:truncate', 'target_tokens/input_seconds<=z4' (repeatable)")),
    "action": ("--action", dict(choices=("drop", "truncate", "drop-turns"), default="drop",
                                help="what a row over an upper token limit gets (default drop); drop-turns: a "
                                     "conversation keeps its longest prefix ending with an assistant message "
                                     "that fits")),
    "keep_empty_targets": ("--keep-empty-targets", dict(
        action="store_true", help="keep rows whose target has no content tokens (dropped by default)")),
    "crop_audio": ("--crop-audio", dict(action="store_true", help="crop audio over an input_seconds limit instead "
                                                                  "of dropping the row (classification)")),
    "target_is_label": ("--target-is-label", dict(action="store_true", help="with --crop-audio: the --target column "
                                                  "is a label (a class, a speaker), not a transcript of the clip, so a "
                                                  "cropped clip keeps it")),
    "fail_over": ("--fail-over", dict(metavar="SHARE|ROWS", help="exit 1 when more than this share (1%%) or number "
                                                                 "of rows would be dropped or truncated")),
    "json": ("--json", dict(action="store_true", help="print report.json to stdout and nothing else there")),
    "quiet": ("--quiet", dict(action="store_true", help="no progress bar and no summary")),
    "redact": ("--redact", dict(action="store_true", help="keep every text of the data out of the report "
                                                          "(row ids and lengths only)")),
    "id": ("--id", dict(metavar="COL", help="a column that identifies rows (an id, a URL ...): carried into "
                                            "lengths.parquet beside row (rejects/ keeps every column)")),
    "packing": ("--packing", dict(choices=("bfd", "bfd_split", "wrapped", "multipack", "knapsack"),
                                  help="simulate the packing of every row: TRL's bfd, bfd_split or wrapped, axolotl's "
                                       "multipack, LLaMA-Factory's knapsack: packs.parquet, efficiency, tokens lost, "
                                       "steps")),
    "max_length": ("--max-length", dict(type=int, metavar="L", help="with --packing: the packed row's tokens "
                                                                    "(SFTConfig.max_length)")),
    "packing_num_proc": ("--packing-num-proc", dict(type=int, metavar="N", help="with --packing: TRL's "
                                                    "dataset_num_proc (it changes the packs; default none)")),
    "shuffle_seed": ("--shuffle-seed", dict(type=int, metavar="SEED", help="with --packing: TRL's "
                                            "shuffle_dataset with args.seed SEED (default: not shuffled)")),
    "batch_size": ("--batch-size", dict(type=int, metavar="B", help="with --packing: per-device "
                                        "batch size, for steps per epoch (default 8)")),
    "grad_accum": ("--grad-accum", dict(type=int, metavar="K", help="with --packing: gradient "
                                                                               "accumulation steps (default 1)")),
    "devices": ("--devices", dict(type=int, metavar="N", help="with --packing: data-parallel devices "
                                                                         "(default 1)")),
    "overwrite": ("--overwrite", dict(action="store_true", help="replace --out even if it holds other files")),
}

#: The flags of every command that measures a source (``model`` apart: memory requires it).
SOURCE_FLAGS = ("input", "audio", "target", "messages", "prompt", "completion", "tools", "chat_template",
                "images", "processor", "max_pixels", "train_on", "tokenizer", "model", "sampling_rate", "split",
                "config", "revision", "sample",
                "sample_unit", "full", "seed", "max_chars", "count_engine", "verify_counts", "no_cache", "engine",
                "ray_address", "num_proc")
#: audit (what clean would do) and clean (what it does).
RULE_FLAGS = ("limit", "action", "keep_empty_targets", "crop_audio", "target_is_label", "fail_over")
#: ``audit --packing``: TRL's packing simulated, and the steps it makes.
PACKING_FLAGS = ("packing", "max_length", "packing_num_proc", "shuffle_seed", "batch_size", "grad_accum", "devices")
#: How the report is printed and what it may hold.
REPORT_FLAGS = ("json", "quiet", "redact", "id")


def add_flags(parser: argparse.ArgumentParser, *names: str, prefix: str = "", **overrides) -> None:
    """Add the shared flags ``names`` to ``parser``; ``prefix`` starts each help text, and
    ``overrides`` (name -> keyword arguments) change one flag for this parser."""
    for name in names:
        flag, kwargs = FLAGS[name]
        kwargs = {**kwargs, **overrides.get(name, {})}
        if kwargs.get("metavar") in ("COL", "FILE", "DIR_OR_NAME", "NAME", "REV") or name == "split":
            kwargs["type"] = named
        if prefix and "help" in kwargs:
            kwargs["help"] = prefix + kwargs["help"]
        parser.add_argument(flag, **kwargs)


def add_source_argument(parser: argparse.ArgumentParser, **kwargs) -> None:
    """The positional ``SRC``."""
    parser.add_argument("source", metavar="SRC", type=named, **{
        "help": "JSONL/JSON, CSV/TSV or Parquet file or glob (optionally compressed), a save_to_disk or "
                "data-file directory, an audio folder, a hub dataset id, or remote files (s3://, gs://, "
                "https://, hf://datasets/...)", **kwargs})


def measure_options(args):
    """``MeasureOptions`` from the parsed flags."""
    from lengthscan.engines.options import MeasureOptions
    from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS

    return MeasureOptions(input=args.input, target=args.target, audio=args.audio, tokenizer=args.tokenizer,
                          model=args.model, sampling_rate=args.sampling_rate,
                          max_chars=args.max_chars if args.max_chars is not None else DEFAULT_MAX_CHARS,
                          messages=args.messages, prompt=args.prompt, completion=args.completion, tools=args.tools,
                          chat_template=args.chat_template, train_on=args.train_on,
                          count_engine=args.count_engine, verify_counts=args.verify_counts,
                          images=args.images, processor=args.processor, max_pixels=args.max_pixels)


def rule_options(args):
    """``RuleOptions`` from the parsed flags."""
    from lengthscan.engines.options import RuleOptions

    return RuleOptions(limits=tuple(args.limit), action=args.action, keep_empty_targets=args.keep_empty_targets,
                       crop_audio=args.crop_audio, target_is_label=args.target_is_label, fail_over=args.fail_over)


def run_options(args, *, progress, command: str):
    """``RunOptions`` from the parsed flags."""
    from lengthscan.engines.options import RunOptions

    return RunOptions(cache=not args.no_cache, num_proc=args.num_proc, progress=progress, command=command)


def engine_for(args):
    """The measuring loop's engine the flags ask for."""
    if getattr(args, "engine", "local") == "ray":
        from lengthscan.engines.ray.engine import RayEngine

        return RayEngine(args.ray_address)
    from lengthscan.engines.loop import LocalEngine

    return LocalEngine(args.num_proc)


def packing_options(args):
    """``PackingOptions`` from the parsed flags."""
    from lengthscan.pack.options import PackingError, PackingOptions

    given = {"--packing-num-proc": args.packing_num_proc, "--shuffle-seed": args.shuffle_seed,
             "--batch-size": args.batch_size, "--grad-accum": args.grad_accum, "--devices": args.devices}
    stray = [flag for flag, value in given.items() if value is not None]
    if args.packing is None and stray:
        raise PackingError(f"{', '.join(stray)}: packing's options; add --packing STRATEGY --max-length L")
    return PackingOptions(packing=args.packing, max_length=args.max_length, packing_num_proc=args.packing_num_proc,
                          shuffle_seed=args.shuffle_seed, batch_size=8 if args.batch_size is None else args.batch_size,
                          grad_accum=1 if args.grad_accum is None else args.grad_accum,
                          devices=1 if args.devices is None else args.devices)
