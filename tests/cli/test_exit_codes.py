"""Exit statuses that are about the process, so run as subprocesses: an internal error exits 3 with its
traceback in a file (never 1, the gate's); a closed pipe on stdout exits quietly; a full stdout says
the outputs are written; a usage error exits 2 even when stderr cannot be written; SIGTERM is handled
as Ctrl-C (exit 143, nothing published)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.factories import numbered_jsonl


def test_an_internal_error_exits_3_with_its_traceback_in_a_file(capsys):
    from lengthscan.cli.main import _internal_error

    try:
        raise RuntimeError("something broke\nsecond line")
    except RuntimeError as exc:
        code = _internal_error(exc)
    err = capsys.readouterr().err
    assert code == 3 and "internal error: RuntimeError: something broke" in err and "second line" not in err
    path = err.split("the traceback is in ")[1].split(";")[0]
    with open(path, encoding="utf-8") as fh:
        assert "Traceback" in fh.read()


@pytest.mark.slow
def test_a_closed_pipe_exits_quietly(tmp_path, bpe_dir, corpus_jsonl):
    cmd = (f"{sys.executable} -m lengthscan audit {corpus_jsonl} --tokenizer {bpe_dir} --input text --json "
           f"--out {tmp_path / 'o'} | head -c 10")
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True)
    assert proc.stdout == '{\n  "schema'[:10]
    assert proc.returncode == 0 and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # a process writing into a closed pipe, for each command
@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_closed_pipe_on_the_summary_exits_0(tmp_path, bpe_dir, corpus_jsonl, command):
    limit = "--limit 'input_tokens<=64'" if command == "clean" else ""
    cmd = (f"{sys.executable} -m lengthscan {command} {corpus_jsonl} --tokenizer {bpe_dir} --input text {limit} "
           f"--out {tmp_path / 'o'} | head -c 1")
    for _ in range(3):  # rich used to exit 1 here, now and then
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; rm -rf {tmp_path / 'o'}; {cmd}"], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


@pytest.mark.slow
def test_a_full_stdout_says_the_outputs_are_written(tmp_path, bpe_dir, corpus_jsonl):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    proc = subprocess.run(f"{sys.executable} -m lengthscan audit {corpus_jsonl} --tokenizer {bpe_dir} --input text "
                          f"--out {tmp_path / 'o'} > /dev/full", shell=True, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "cannot print the summary" in proc.stderr and "are written" in proc.stderr
    assert (tmp_path / "o" / "report.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_usage_error_exits_2_when_stderr_cannot_be_written(tmp_path, bpe_dir, stderr):
    src = numbered_jsonl(tmp_path / "s.jsonl", 2)
    redirect = "2>&-" if stderr == "closed" else "2>/dev/full"
    for args in ([str(src), "--bogus"], [str(src), "--tokenizer", str(bpe_dir), "--input", "nope"]):
        command = " ".join([sys.executable, "-m", "lengthscan", "audit", *args, "--out", str(tmp_path / "o")])
        proc = subprocess.run(f"{command} {redirect}", shell=True, capture_output=False, stdout=subprocess.PIPE,
                              timeout=120)
        assert proc.returncode == 2 and proc.stdout == b""


@pytest.mark.slow
def test_sigterm_is_handled_as_ctrl_c(tmp_path, bpe_dir):
    src = numbered_jsonl(tmp_path / "big.jsonl", 200_000, "word {i} " * 3)
    proc = subprocess.Popen([sys.executable, "-m", "lengthscan", "clean", str(src), "--tokenizer", str(bpe_dir),
                             "--input", "text", "--no-cache", "--out", str(tmp_path / "o")],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob(".o.tmp-*")):
        time.sleep(0.05)  # measuring has started once the staging folder exists
    assert list(tmp_path.glob(".o.tmp-*")), "the clean never started writing"
    proc.send_signal(signal.SIGTERM)
    code, err = proc.wait(timeout=60), proc.stderr.read()
    assert code == 143 and "terminated; no output was published" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]  # no staging, no lock, no output
