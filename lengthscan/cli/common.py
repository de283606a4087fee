"""What every subcommand shares: exit codes, the progress bar, printing a result, usage errors."""

from __future__ import annotations

import sys

#: Exit codes of every subcommand: success, a gate failed (CI can stop here), a usage error or
#: unreadable input, an internal error (a bug: the traceback is written to a file).
EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def print_result(result, *, json_out: bool, quiet: bool) -> None:
    """``result.to_dict()`` as JSON on stdout (``json_out``) and/or the rich summary."""
    import json

    from rich.console import Console

    from lengthscan.report.terminal import render_summary

    data = result.to_dict()
    if json_out:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    if not quiet:
        console = Console(stderr=json_out)
        render_summary(data, console)
        out_dir = getattr(result, "out_dir", None)
        if out_dir and "clean" not in data:  # a clean says what it wrote itself
            from rich.text import Text

            console.print(Text.assemble(("wrote ", "dim"), f"{out_dir}/lengths.parquet, report.json, report.html "
                                        "(open report.html in a browser)"))


def is_usage_error(exc: Exception) -> bool:
    """Errors that mean bad usage or unreadable input (exit 2, one line, no traceback)."""
    from lengthscan.engines.options import OptionError
    from lengthscan.measure.batch import ColumnError
    from lengthscan.measure.chat.template import ChatTemplateError
    from lengthscan.measure.text.loading import TokenizerError
    from lengthscan.policy.model_limits import ModelError
    from lengthscan.policy.rules import RuleError
    from lengthscan.sources.sampling import SampleError
    from lengthscan.sources.source import SourceError
    from lengthscan.write.staging import OutputError

    return isinstance(exc, (ColumnError, SampleError, SourceError, TokenizerError, OutputError, ModelError,
                            RuleError, ChatTemplateError, OptionError))


class ProgressBars:
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
