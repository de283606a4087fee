"""The walkthrough notebook's code cells run, in order, in a fresh directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Each test runs a whole notebook (one in a real Jupyter kernel): tens of seconds.
pytestmark = pytest.mark.slow

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


def test_quickstart_executes_with_a_real_kernel(tmp_path, monkeypatch):
    """notebooks/quickstart.ipynb run by nbclient in a real Jupyter kernel, so it cannot rot."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (test extras)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (test extras)")
    path = NOTEBOOK.parent / "quickstart.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "input_tokens" in outputs and "'kept'" in outputs
    assert (tmp_path / "quickstart-clean" / "dataset").is_dir()
