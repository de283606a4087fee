"""The walkthrough notebook's code cells run, in order, in a fresh directory."""

from __future__ import annotations

import json
from pathlib import Path

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "walkthrough.ipynb"


def test_walkthrough_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}", "exec"), namespace)
    assert (tmp_path / "walkthrough-report" / "report.html").exists()
    assert namespace["result"].split("train").sample.full
    assert list(namespace["with_lengths"].column_names)[-2:] == ["input_tokens", "target_tokens"]
