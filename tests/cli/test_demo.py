"""``lengthscan demo`` takes the report flags a user tries first: ``--quiet`` prints nothing and
still writes the report, ``--json`` prints report.json."""

from __future__ import annotations

import json
import os

import pytest

from lengthscan.cli.main import main
from tests.support.cli import run_cli


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


@pytest.mark.slow
def test_the_demo_builds_elsewhere_when_the_cache_cannot_be_written(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = run_cli("demo", "--out", tmp_path / "demo", env={**os.environ, "LENGTHSCAN_CACHE": str(tmp_path / "afile")})
    assert proc.returncode == 0, proc.stderr
    assert "cannot be written" in proc.stderr and "--out" not in proc.stderr
    assert (tmp_path / "demo" / "report.html").exists()
