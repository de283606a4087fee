"""What the CLI tests check of every refusal (one line on stderr, no traceback, the words that matter), and how
they run the CLI."""

from __future__ import annotations

import os


def one_line(capsys, *words) -> str:
    """The captured stderr, asserted to be one line without a traceback and to hold ``words``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def one_line_text(err: str) -> None:
    """``err`` (a stderr) asserted to be one line without a traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err


def run_cli(*args, timeout: float = 300, **kwargs):
    """``python -m lengthscan ARGS`` in a subprocess, its output captured as text: for the checks that are
    about the process (exit status on a signal, a closed stream, a hang guarded by a timeout)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def audit(src, tokenizer, out, *extra, column: str = "text") -> int:
    """``lengthscan audit SRC --tokenizer T --input COLUMN --out OUT --quiet EXTRA`` in process; the exit status."""
    from lengthscan.cli.main import main

    return main(["audit", str(src), "--tokenizer", str(tokenizer), "--input", column, "--out", str(out), "--quiet",
                 *extra])


#: whether this process may mount file systems (the full and read-only disk cases)
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def in_process(capsys, *args, warnings_on_stderr: bool = False):
    """``lengthscan ARGS`` run in this process (``lengthscan.cli.main.main``), its streams captured by
    ``capsys`` (or ``capfd``): a ``CompletedProcess`` as ``run_cli`` gives, without a Python start-up. A
    ``SystemExit`` (argparse's usage errors) is the status the process would exit with.

    ``warnings_on_stderr``: the warnings the run gives are recorded here (not by pytest) and added to
    ``stderr`` as the process would print them (``warnings.formatwarning``, which the CLI sets to print
    lengthscan's own as one line)."""
    import subprocess
    import warnings

    from lengthscan.cli.main import main

    capsys.readouterr()
    argv = [str(a) for a in args]
    with warnings.catch_warnings(record=warnings_on_stderr) as caught:
        if warnings_on_stderr:
            warnings.simplefilter("default")
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors: the process would exit with this status
            code = exc.code
    captured = capsys.readouterr()
    err = captured.err + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                                 for w in caught or ())
    return subprocess.CompletedProcess(["lengthscan", *argv], code, captured.out, err)
