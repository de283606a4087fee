"""``lengthscan demo`` takes the report flags a user tries first: ``--quiet`` prints nothing and
still writes the report, ``--json`` prints report.json."""

from __future__ import annotations

import json

import pytest

from lengthscan.cli.main import main


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
