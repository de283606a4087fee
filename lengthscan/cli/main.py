"""The ``lengthscan`` command: parsing and printing only; each subcommand is a library call.

Exit codes: 0 ok, 1 a gate failed, 2 bad usage or unreadable input. Heavy imports happen inside
the subcommands, so ``lengthscan --help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

from lengthscan import __version__
from lengthscan.cli.common import (
    EXIT_GATE,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    ProgressBars,
    disk_error,
    print_result,
    printable,
    say,
    silence_stderr,
    to_devnull,
    usage_error,
)
from lengthscan.cli.flags import add_flags, add_source_argument, add_spec_flags, named
from lengthscan.cli.memory import add_memory_parser, run_memory
from lengthscan.sources.urls import redact_urls


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (and exit 2), as every other error: the usage block is one
    ``--help`` away."""

    def error(self, message: str):
        say(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lengthscan",
        description="Audit and fix the sequence lengths of training data before training starts.",
    )
    parser.add_argument("--version", action="version", version=f"lengthscan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("audit", help="measure input and target lengths and write a report",
                       description="Measure token lengths exactly as the model receives them; write "
                                   "lengths.parquet, report.json and report.html. Rows measured by default: every "
                                   "row up to 200,000 rows, a seeded 100,000-row sample above (--full or --sample "
                                   "to choose).", epilog=_epilog("audit"), formatter_class=_Help)
    add_source_argument(p)
    add_spec_flags(p, "audit")
    add_flags(p, "json", "quiet")

    c = sub.add_parser("clean", help="decide every row by limits; write a dataset, its rejects and a report",
                       description="Measure every row, decide keep/truncate/drop by --limit rules, and write "
                                   "dataset/ (save_to_disk), rejects/, lengths.parquet, report.json and "
                                   "report.html to --out, atomically.", epilog=_epilog("clean"), formatter_class=_Help)
    add_source_argument(c)
    add_spec_flags(c, "clean")
    # clean decides on every row: the sampling flags are refused with a reason, and not offered in --help
    hidden = {"help": argparse.SUPPRESS, "default": None}
    add_flags(c, "sample", "sample_unit", "full", "seed", command="clean", sample=hidden, sample_unit=hidden,
              full=hidden, seed=hidden)
    add_flags(c, "json", "quiet")

    add_memory_parser(sub)

    d = sub.add_parser("demo", help="audit a corpus built offline from Python's own docstrings",
                       description="Build a docstring -> summary corpus from this Python's standard library, "
                                   "train a byte-level BPE tokenizer on it, and audit it.")
    d.add_argument("--out", type=named, default="lengthscan-demo", metavar="DIR",
                   help="output directory (default ./lengthscan-demo)")
    add_flags(d, "json", "quiet")
    return parser


class _Help(argparse.RawDescriptionHelpFormatter):
    """Options wrapped as usual; the epilog's examples and rule forms kept as written."""


_EXAMPLES = {
    "audit": """examples:
  lengthscan audit train.jsonl --tokenizer ./tok --input document --target summary --full
  lengthscan audit 'data/shard-*.parquet' --model facebook/bart-large --input text --sample 1%
  lengthscan audit manifest.csv --audio path --target transcript --model openai/whisper-small
  lengthscan audit chats.jsonl --tokenizer ./tok --messages messages --limit 'sequence_tokens<=4096'
  lengthscan audit train.jsonl --tokenizer ./tok --input text --id doc_id --json | jq .splits""",
    "clean": """examples:
  lengthscan clean train.jsonl --tokenizer ./tok --input document --target summary \\
      --limit 'input_tokens<=1024:truncate' --limit 'target_tokens<=p99' --out cleaned
  lengthscan clean manifest.csv --audio path --model ./wav2vec2 --limit 'input_seconds<=20' --out cleaned
  lengthscan clean chats.jsonl --tokenizer ./tok --messages messages \\
      --limit 'sequence_tokens<=4096:drop-turns' --out cleaned --fail-over 1%""",
}


def _epilog(command: str) -> str:
    from lengthscan.policy.rules import RULE_FORMS

    tail = ("exit codes: 0 ok, 1 a gate failed (--fail-over), 2 bad usage or input (one line on stderr),\n"
            "  3 an internal error (its traceback written to a file)")
    return f"{_EXAMPLES[command]}\n\n{RULE_FORMS}\n\n{tail}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.stderr is None:  # started with stderr closed (2>&-)
        silence_stderr()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _plain_warnings()
    _terminate_as_interrupt()
    command = redact_urls(shlex.join(["lengthscan", *argv]))  # written in the report: no secret of a URL
    try:
        if args.command == "audit":
            return _audit(args, command)
        if args.command == "clean":
            return _clean(args, command)
        if args.command == "memory":
            return run_memory(args, command)
        if args.command == "demo":
            return _demo(args, command)
    except KeyboardInterrupt as exc:
        from lengthscan.write.staging import PUBLISHED

        how, code = ("terminated", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        done = f"{', '.join(map(str, PUBLISHED))} was published whole" if PUBLISHED else "no output was published"
        say(f"lengthscan: {how}; {done}")
        return code
    except BrokenPipeError:  # the reader of stdout went away (`... | head`): nothing more to say
        _quiet_stdout()
        return EXIT_OK
    except Exception as exc:
        if (usage := usage_error(exc)) is not None:  # a Ray task's: the original, not its remote traceback
            say(f"lengthscan: error: {usage}")
            return EXIT_USAGE
        if (disk := disk_error(exc)) is not None:
            say(f"lengthscan: error: {disk}")
            return EXIT_USAGE
        return _internal_error(exc)
    return EXIT_USAGE


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a CI timeout), handled as Ctrl-C is: staging removed, the lock released."""


def _terminate_as_interrupt() -> None:
    import signal
    import threading

    def terminate(signum, frame):
        raise Terminated()

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminate)


def _plain_warnings() -> None:
    """lengthscan's own warnings (``lengthscan: ...``) as one line on stderr, without a code location."""
    import warnings

    default = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        if str(message).startswith("lengthscan:"):
            return f"{printable(redact_urls(str(message)))}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of a closed pipe stays silent."""
    try:
        to_devnull(sys.stdout.fileno())
    except (OSError, ValueError):
        pass


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _internal_error(exc: Exception) -> int:
    """An unexpected error: one line, the full traceback in a file, exit code 3 (never 1, the gate's)."""
    import tempfile
    import traceback

    from lengthscan.engines.errors import remote_cause

    # a Ray task's traceback is in colours; URLs without their credentials and query strings
    text = redact_urls(_ANSI.sub("", "".join(traceback.format_exception(exc))))
    exc = remote_cause(exc)  # the one line: the original error, not Ray's wrapper
    try:
        fd, path = tempfile.mkstemp(prefix="lengthscan-error-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        where = f"the traceback is in {path}"
    except OSError:
        where = "the traceback follows"
        sys.stderr.write(text)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    say(f"lengthscan: internal error: {type(exc).__name__}: {first[:300]} ({where}; please report it)")
    return EXIT_INTERNAL


def _audit(args, command: str) -> int:
    from lengthscan.cli.flags import spec_of
    from lengthscan.engines.api import audit

    with ProgressBars(disabled=args.quiet) as progress:
        result = audit(args.source, spec_of(args, "audit", progress=progress, command=command))
    print_result(result, json_out=args.json, quiet=args.quiet)
    failed = result.decisions.gate if result.decisions is not None else None
    if failed:
        say(f"lengthscan: {failed}")
        return EXIT_GATE
    return EXIT_OK


def _clean(args, command: str) -> int:
    from lengthscan.cli.flags import spec_of
    from lengthscan.engines.api import clean

    if args.sample is not None or args.full or args.sample_unit is not None or args.seed is not None:
        say("lengthscan: error: clean always decides on every row: drop --sample/--sample-unit/--full/--seed")
        return EXIT_USAGE
    with ProgressBars(disabled=args.quiet) as progress:
        result = clean(args.source, spec_of(args, "clean", progress=progress, command=command))
    print_result(result, json_out=args.json, quiet=args.quiet)
    if result.gate_failed:
        say(f"lengthscan: {result.gate_failed}; nothing was published")
        return EXIT_GATE
    return EXIT_OK


def _demo(args, command: str) -> int:
    from lengthscan.demo import run_demo

    with ProgressBars(disabled=args.quiet) as progress:
        result = run_demo(out=args.out, progress=progress, command=command)
    print_result(result, json_out=args.json, quiet=args.quiet)
    return EXIT_OK


#: Subcommands that never use torch. transformers imports it whenever it is installed (1-2 s of a
#: tokenizer's loading); in the command's own process it is hidden instead.
TORCH_FREE_COMMANDS = {"audit", "clean", "demo", "memory"}


def run() -> int:
    """The ``lengthscan`` console script: :func:`main` in a process of its own, where torch is hidden
    from audit, clean, demo and memory (``LENGTHSCAN_IMPORT_TORCH=1`` keeps it visible)."""
    argv = sys.argv[1:]
    if (argv and argv[0] in TORCH_FREE_COMMANDS and "torch" not in sys.modules
            and os.environ.get("LENGTHSCAN_IMPORT_TORCH") != "1"):
        from lengthscan.torchless import hide_torch

        hide_torch()  # the worker processes of --num-proc hide it as well
    from lengthscan.measure.text.early import prove_apart

    prove_apart()  # a command's process: a first run may prove its tokenizer in a process of its own
    return main(argv)
