"""``lengthscan demo`` takes the report flags a user tries first: ``--quiet`` prints nothing and
still writes the report, ``--json`` prints report.json."""

from __future__ import annotations

import json

import pytest

from lengthscan.cli.main import main
from tests.support.cli import in_process


@pytest.mark.slow  # trains the demo's tokenizer in a fresh cache
def test_demo_quiet_and_json(tmp_path, capsys):
    assert main(["demo", "--quiet", "--out", str(tmp_path / "q")]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    assert report["splits"][0]["fields"]["input_tokens"]["count"] > 1000
    assert main(["demo", "--json", "--out", str(tmp_path / "j")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["splits"][0]["fields"]["input_tokens"] == report["splits"][0]["fields"]["input_tokens"]


@pytest.mark.slow  # trains the demo's tokenizer in a temporary folder
def test_the_demo_builds_elsewhere_when_the_cache_cannot_be_written(tmp_path, capsys, monkeypatch):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "afile"))
    with pytest.warns(UserWarning, match="cannot be written") as warned:
        proc = in_process(capsys, "demo", "--out", tmp_path / "demo")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(str(w.message) for w in warned)
    assert said.startswith("lengthscan:") and "--out" not in said
    assert (tmp_path / "demo" / "report.html").exists()
