"""A user error raised in a Ray task or actor reaches the user as its own one line (exit 2), and an
internal one as the original's type and message (exit 3): never Ray's wrapper, whose text is the
remote traceback in terminal colours. Ray's own exception classes, built here (no cluster)."""

from __future__ import annotations

import pytest

from lengthscan.cli.main import main
from lengthscan.engines.errors import remote_cause, user_error_in
from lengthscan.measure.chat.template import ChatTemplateError
from lengthscan.sources.source import SourceError

pytestmark = pytest.mark.ray
exceptions = pytest.importorskip("ray.exceptions", reason='needs Ray: pip install "lengthscan[ray]"')

TRACE = "Traceback (most recent call last):\n  \x1b[36mFile \"engine.py\"\x1b[39m, line 9\n"


def _remote(cause: Exception):
    """What ``ray.get`` raises for an actor call that raised ``cause``."""
    return exceptions.RayTaskError("Measurer.measure", TRACE + repr(cause), cause).as_instanceof_cause()


def test_the_original_is_found_inside_rays_errors():
    cause = ChatTemplateError("the chat template ran past 10 s on 3 rows (a template that loops?): fix the template")
    wrapped = _remote(cause)
    assert isinstance(wrapped, ChatTemplateError) and "\x1b[36m" in str(wrapped)  # what reached the user before
    assert user_error_in(wrapped) is cause and remote_cause(wrapped) is cause
    try:  # Ray Data raises its own error from the task's
        raise RuntimeError("a read task failed") from _remote(SourceError("rows.jsonl: row 7 is not JSON"))
    except RuntimeError as exc:
        assert str(user_error_in(exc)) == "rows.jsonl: row 7 is not JSON"
    assert user_error_in(_remote(RuntimeError("a bug"))) is None
    assert user_error_in(ChatTemplateError("local")) is not None


@pytest.mark.parametrize("cause,code,line", [
    (ChatTemplateError("the chat template ran past 10 s on 3 rows (a template that loops?): fix the template"), 2,
     "lengthscan: error: the chat template ran past 10 s on 3 rows (a template that loops?): fix the template\n"),
    (KeyError("lost"), 3, "lengthscan: internal error: KeyError: 'lost' (the traceback is in "),
])
def test_the_cli_prints_the_original_in_one_line(tmp_path, capsys, monkeypatch, cause, code, line):
    """The CLI's own handler, given what ``ray.get`` raises (the audit raises it as the Ray engine's
    pool of actors would)."""
    import lengthscan.cli.main as cli

    def audit(args, command):
        raise _remote(cause)

    monkeypatch.setattr(cli, "_audit", audit)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # where the traceback file goes
    assert main(["audit", "x.jsonl", "--input", "text"]) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "\x1b" not in err and "\\x1b" not in err, err
    if code == 3:  # the file keeps the remote traceback, without its colour codes
        (report,) = tmp_path.glob("lengthscan-error-*.txt")
        text = report.read_text()
        assert 'File "engine.py"' in text and "\x1b" not in text
