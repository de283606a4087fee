"""The ``lengthscan`` command: parsing and printing only; each subcommand is a library call.

Exit codes: 0 ok, 1 a gate failed, 2 bad usage or unreadable input. Heavy imports happen inside
the subcommands, so ``lengthscan --help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from lengthscan import __version__
from lengthscan.cli.memory import EXIT_GATE, EXIT_OK, EXIT_USAGE, add_memory_parser, run_memory


def _add_field_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that measures a source."""
    p.add_argument("source", metavar="SRC",
                   help="JSONL/JSON, CSV/TSV or Parquet file or glob, a save_to_disk or data-file directory, "
                        "or a hub dataset id")
    p.add_argument("--input", metavar="COL", help="column holding the model input text")
    p.add_argument("--audio", metavar="COL",
                   help="column holding the input audio: paths (relative to the manifest), bytes, or an HF Audio column")
    p.add_argument("--target", metavar="COL", help="column holding the target text (tokenized with text_target)")
    p.add_argument("--tokenizer", metavar="DIR_OR_NAME", help="tokenizer directory or hub name (default: --model)")
    p.add_argument("--model", metavar="DIR_OR_NAME",
                   help="model directory, hub name or config.json: its limits, sampling rate and frame rule")
    p.add_argument("--sampling-rate", type=int, metavar="HZ",
                   help="the model's audio sampling rate (default: the --model feature extractor's)")
    p.add_argument("--split", help="measure only this split of a multi-split source")
    p.add_argument("--sample", metavar="N|FRACTION",
                   help="measure a uniform random sample: a row count (600) or a fraction (0.01)")
    p.add_argument("--full", action="store_true", help="measure every row")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    p.add_argument("--max-chars", type=int, default=None, metavar="N",
                   help="texts longer than N characters are recorded as too long, not tokenized (default 10,000,000)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the per-row length cache")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local (default) or ray: the same measurement on Ray Data (pip install \"lengthscan[ray]\")")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --engine ray: a cluster to join ('auto' for a running one; default: start a local Ray)")
    p.add_argument("--num-proc", type=int, default=1, metavar="N",
                   help="measure in N worker processes (default 1: one process whose tokenizer uses every core)")


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by audit (what clean would do) and clean (what it does)."""
    p.add_argument("--limit", action="append", default=[], metavar="RULE",
                   help="METRIC OP VALUE[:ACTION], e.g. 'input_tokens<=1024', 'target_tokens<=p99:truncate', "
                        "'target_tokens/input_seconds<=z4' (repeatable)")
    p.add_argument("--action", choices=("drop", "truncate"), default="drop",
                   help="what a row over an upper token limit gets (default drop)")
    p.add_argument("--keep-empty-targets", action="store_true",
                   help="keep rows whose target has no content tokens (dropped by default)")
    p.add_argument("--crop-audio", action="store_true",
                   help="crop audio over an input_seconds limit instead of dropping the row (classification)")
    p.add_argument("--fail-over", metavar="SHARE|ROWS",
                   help="exit 1 when more than this share (1%%) or number of rows would be dropped or truncated")


def _add_report_flags(p: argparse.ArgumentParser) -> None:
    """How the report is printed and what it may hold: shared by audit and clean."""
    p.add_argument("--json", action="store_true", help="print report.json to stdout and nothing else there")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("--redact", action="store_true",
                   help="keep every text of the data out of the report (row ids and lengths only)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lengthscan",
        description="Audit and fix the sequence lengths of training data before training starts.",
    )
    parser.add_argument("--version", action="version", version=f"lengthscan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("audit", help="measure input and target lengths and write a report",
                       description="Measure token lengths exactly as the model receives them; write "
                                   "lengths.parquet, report.json and report.html.")
    _add_field_flags(p)
    _add_limit_flags(p)
    p.add_argument("--out", default="lengthscan-report", metavar="DIR",
                   help="output directory (default ./lengthscan-report)")
    p.add_argument("--overwrite", action="store_true", help="replace --out even if it holds other files")
    _add_report_flags(p)

    c = sub.add_parser("clean", help="decide every row by limits; write a dataset, its rejects and a report",
                       description="Measure every row, decide keep/truncate/drop by --limit rules, and write "
                                   "dataset/ (save_to_disk), rejects/, lengths.parquet, report.json and "
                                   "report.html to --out, atomically.")
    _add_field_flags(c)
    _add_limit_flags(c)
    c.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist unless --overwrite)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    c.add_argument("--length-column", default="length", metavar="NAME",
                   help="name of the length column added for group_by_length (default length)")
    c.add_argument("--length-from", metavar="METRIC",
                   help="measurement that fills it, after truncation (default input_tokens, or input_samples "
                        "for audio; 'none' adds no column)")
    c.add_argument("--no-decide-only", action="store_true",
                   help="count every row in full even when only numeric input_tokens upper limits are given")
    c.add_argument("--tokenize", action="store_true",
                   help="also write input_ids, attention_mask and labels (the tokenizer's own call on the final texts)")
    c.add_argument("--embed-audio", action="store_true",
                   help="embed audio files' bytes in Audio columns of the output (default: keep paths)")
    c.add_argument("--format", choices=("arrow", "parquet"), default="arrow",
                   help="dataset/ and rejects/ as Arrow (save_to_disk, default) or Parquet shards")
    _add_report_flags(c)

    add_memory_parser(sub)

    d = sub.add_parser("demo", help="audit a corpus built offline from Python's own docstrings",
                       description="Build a docstring -> summary corpus from this Python's standard library, "
                                   "train a byte-level BPE tokenizer on it, and audit it.")
    d.add_argument("--out", default="lengthscan-demo", metavar="DIR", help="output directory (default ./lengthscan-demo)")
    d.add_argument("--json", action="store_true", help="print report.json to stdout and nothing else there")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    command = shlex.join(["lengthscan", *argv])
    try:
        if args.command == "audit":
            return _audit(args, command)
        if args.command == "clean":
            return _clean(args, command)
        if args.command == "memory":
            return run_memory(args, command)
        if args.command == "demo":
            return _demo(args, command)
    except KeyboardInterrupt:
        print("lengthscan: interrupted; no output was published", file=sys.stderr)
        return 130
    except Exception as exc:
        if _is_usage_error(exc):
            print(f"lengthscan: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise
    return EXIT_USAGE


def _is_usage_error(exc: Exception) -> bool:
    from lengthscan.measure.batch import ColumnError
    from lengthscan.measure.text.loading import TokenizerError
    from lengthscan.policy.model_limits import ModelError
    from lengthscan.policy.rules import RuleError
    from lengthscan.sources.sampling import SampleError
    from lengthscan.sources.source import SourceError
    from lengthscan.write.staging import OutputError

    return isinstance(exc, (ColumnError, SampleError, SourceError, TokenizerError, OutputError, ModelError,
                            RuleError))


def _audit(args, command: str) -> int:
    from lengthscan.engines.audit import audit
    from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS

    if args.engine == "ray":
        from functools import partial

        from lengthscan.engines.ray.audit import audit_ray

        audit = partial(audit_ray, ray_address=args.ray_address)

    with _progress(disabled=args.quiet) as progress:
        result = audit(
            args.source, tokenizer=args.tokenizer, model=args.model, input=args.input, target=args.target,
            audio=args.audio, sampling_rate=args.sampling_rate, limits=args.limit, action=args.action,
            keep_empty_targets=args.keep_empty_targets, crop_audio=args.crop_audio, fail_over=args.fail_over,
            redact=args.redact, num_proc=args.num_proc,
            split=args.split, sample=args.sample, full=args.full, seed=args.seed, out=args.out,
            overwrite=args.overwrite, cache=not args.no_cache,
            max_chars=args.max_chars or DEFAULT_MAX_CHARS, progress=progress, command=command,
        )
    _print_result(result, json_out=args.json, quiet=args.quiet)
    failed = (result.decisions or {}).get("gate")
    if failed:
        print(f"lengthscan: {failed}", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK


def _clean(args, command: str) -> int:
    from lengthscan.engines.clean import clean
    from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS

    if args.sample is not None or args.full:
        print("lengthscan: error: clean always decides on every row: drop --sample/--full", file=sys.stderr)
        return EXIT_USAGE
    if args.engine == "ray":
        from functools import partial

        from lengthscan.engines.ray.clean import clean_ray

        clean = partial(clean_ray, ray_address=args.ray_address)
    with _progress(disabled=args.quiet) as progress:
        result = clean(
            args.source, out=args.out, tokenizer=args.tokenizer, model=args.model, input=args.input,
            target=args.target, audio=args.audio, sampling_rate=args.sampling_rate, split=args.split,
            limits=args.limit, action=args.action, keep_empty_targets=args.keep_empty_targets,
            crop_audio=args.crop_audio, fail_over=args.fail_over, length_column=args.length_column,
            length_from=args.length_from, embed_audio=args.embed_audio, tokenize=args.tokenize,
            overwrite=args.overwrite, format=args.format,
            cache=not args.no_cache, max_chars=args.max_chars or DEFAULT_MAX_CHARS, redact=args.redact,
            num_proc=args.num_proc, decide_only=not args.no_decide_only, progress=progress, command=command,
        )
    _print_result(result, json_out=args.json, quiet=args.quiet)
    if result.gate_failed:
        print(f"lengthscan: {result.gate_failed}; nothing was published", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK


def _demo(args, command: str) -> int:
    from lengthscan.demo import run_demo

    with _progress(disabled=False) as progress:
        result = run_demo(out=args.out, progress=progress, command=command)
    _print_result(result, json_out=args.json, quiet=False)
    return EXIT_OK


def _print_result(result, *, json_out: bool, quiet: bool) -> None:
    import json

    from rich.console import Console

    from lengthscan.report.terminal import render_summary

    data = result.to_dict()
    if json_out:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    if not quiet:
        render_summary(data, Console(stderr=json_out))


class _progress:
    """A rich progress bar on stderr, fed by ``audit(progress=...)`` callbacks."""

    def __init__(self, disabled: bool):
        self.disabled = disabled
        self._bar = None
        self._tasks: dict[str, int] = {}

    def __enter__(self):
        if self.disabled:
            return None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("rows"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self._bar.start()
        return self.update

    def update(self, split: str, done: int, total: int) -> None:
        if split not in self._tasks:
            self._tasks[split] = self._bar.add_task(f"measuring {split}", total=total)
        self._bar.update(self._tasks[split], completed=done)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False


#: Subcommands that never use torch. transformers imports it whenever it is installed (1-2 s of a
#: tokenizer's loading); in the command's own process it is hidden instead.
TORCH_FREE_COMMANDS = {"audit", "clean", "demo", "memory"}


def run() -> int:
    """The ``lengthscan`` console script: :func:`main` in a process of its own, where torch is hidden
    from audit, clean, demo and memory (``LENGTHSCAN_IMPORT_TORCH=1`` keeps it visible)."""
    argv = sys.argv[1:]
    if (argv and argv[0] in TORCH_FREE_COMMANDS and "torch" not in sys.modules
            and os.environ.get("LENGTHSCAN_IMPORT_TORCH") != "1"):
        _hide_torch()
    return main(argv)


def _hide_torch() -> None:
    """Make torch look uninstalled to this process: ``importlib.util.find_spec`` (how transformers
    and datasets probe for it) answers None and ``import torch`` raises ModuleNotFoundError, which
    every optional use of it catches. ``sys.modules["torch"] = None`` is not enough: some code tests
    ``"torch" in sys.modules`` and then imports it."""
    import importlib.abc
    import importlib.util

    def hidden(name: str) -> bool:
        return name == "torch" or name.startswith("torch.")

    class HideTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if hidden(name):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by lengthscan)", name=name)
            return None

    find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: None if hidden(name) else find_spec(name, package)
    sys.meta_path.insert(0, HideTorch())
