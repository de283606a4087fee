"""What every subcommand shares: exit codes, the progress bar, printing a result, usage errors."""

from __future__ import annotations

import re
import sys

#: Exit codes of every subcommand: success, a gate failed (CI can stop here), a usage error or
#: unreadable input, an internal error (a bug: the traceback is written to a file).
EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


#: Characters never written raw into a message: C0/C1 controls (ESC starts terminal sequences, a
#: newline would forge a second line) and the bidirectional overrides that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control and bidi characters written as escapes (``\\x1b``, ``\\u202e``): a file or
    column name cannot colour, move or rewrite the terminal, nor add a line to a one-line message."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def say(message: str) -> None:
    """One message line on stderr, made :func:`printable`, any URL in it without credentials or query
    string (``sources.urls.redact_urls``); a closed or full stderr is ignored (the exit code still tells)."""
    from lengthscan.sources.urls import redact_urls

    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(printable(redact_urls(message)) + "\n")
        stream.flush()
    except (OSError, ValueError):
        silence_stderr()


def silence_stderr() -> None:
    """Point stderr at /dev/null: a closed or full stderr must not turn the exit code into 1 (an
    exception while reporting) or 120 (the interpreter's failed final flush)."""
    import os

    to_devnull(2)
    sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's stderr until exit


def to_devnull(fd: int) -> None:
    """Point file descriptor ``fd`` at /dev/null (a stream nobody reads any more stays silent)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _pipe_console(*, stderr: bool):
    """rich's console, except that a closed stdout is a BrokenPipeError for ``main`` to end
    quietly with exit 0 (rich itself exits 1, the code of a failed gate). Built on first use:
    rich is imported lazily."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole(stderr=stderr)


def print_result(result, *, json_out: bool, quiet: bool) -> None:
    """``result.to_dict()`` as JSON on stdout (``json_out``) and/or the rich summary. A stream that
    cannot be written (stdout on a full disk) is an ``OutputError`` saying the outputs are written."""
    import json

    from lengthscan.write.staging import OutputError

    data = result.to_dict()
    try:
        if json_out:
            sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        if not quiet:
            _print_summary(result, data, json_out)
    except BrokenPipeError:
        raise
    except OSError as exc:
        written = f"; the outputs in {result.out_dir} are written" if getattr(result, "out_dir", None) else ""
        raise OutputError(f"cannot print the summary: {exc.strerror or exc}{written}") from None


def _print_summary(result, data: dict, json_out: bool) -> None:
    """The rich summary (on stderr when stdout holds the JSON), and where the outputs are."""
    from lengthscan.report.terminal import render_summary

    console = _pipe_console(stderr=json_out)
    render_summary(data, console)
    out_dir = getattr(result, "out_dir", None)
    if out_dir and "clean" not in data:  # a clean says what it wrote itself
        from rich.text import Text

        packs = " packs.parquet," if "packing" in data else ""
        console.print(Text.assemble(("wrote ", "dim"), f"{out_dir}/lengths.parquet,{packs} report.json, report.html "
                                    "(open report.html in a browser)"))


def usage_error(exc: Exception) -> BaseException | None:
    """The error that means bad usage or unreadable input (exit 2, one line, no traceback): ``exc``
    itself, or the one it holds (the original inside a Ray task's error); None otherwise."""
    from lengthscan.engines.errors import user_error_in

    return user_error_in(exc)


def is_usage_error(exc: Exception) -> bool:
    """Errors that mean bad usage or unreadable input (exit 2, one line, no traceback)."""
    return usage_error(exc) is not None


def disk_error(exc: BaseException) -> str | None:
    """A one-line message for a full, over-quota or read-only disk met while writing (anywhere in
    ``exc``'s chain), else None: the run's staging folder is already removed, nothing published."""
    import errno

    codes = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
             errno.EFBIG: "a file grew past the file system's limit", errno.EROFS: "the file system is read-only"}
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in codes:
            where = f" ({exc.filename})" if exc.filename else ""
            return (f"{codes[exc.errno]} while writing{where}; nothing was published and --out is as it was: free "
                    "space or choose another --out")
        exc = exc.__cause__ if exc.__cause__ is not None else None if exc.__suppress_context__ else exc.__context__
    return None


class ProgressBars:
    """A rich progress bar on stderr, fed by ``audit(progress=...)`` callbacks."""

    def __init__(self, disabled: bool):
        # not on a terminal (a log file, CI): a bar cannot redraw there, it would only leave a blank line
        self.disabled = disabled or not sys.stderr.isatty()
        self._bar = None
        self._tasks: dict[str, int] = {}

    def __enter__(self):
        return None if self.disabled else self.update

    def update(self, split: str, done: int, total: int) -> None:
        if self._bar is None:  # started by the first row measured: an early error prints no blank line
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("rows"), TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=True)
            self._bar.start()
        if split not in self._tasks:
            self._tasks[split] = self._bar.add_task(f"measuring {split}", total=total)
        self._bar.update(self._tasks[split], completed=done)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False
