"""The notebooks run, write only into their own temporary folder, use only the public API, and are
saved with their outputs."""

from __future__ import annotations

import ast
import json
import tempfile
from pathlib import Path

import pytest

# Each test runs a whole notebook (one in a real Jupyter kernel): tens of seconds.
pytestmark = pytest.mark.slow

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
NOTEBOOK = NOTEBOOKS / "walkthrough.ipynb"


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _check_saved(path: Path) -> None:
    """Public API only (``lengthscan`` and ``lengthscan.demo``), and an output under every code cell."""
    for cell in _code_cells(path):
        source = "".join(cell["source"])
        for node in ast.walk(ast.parse(source)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            private = [n for n in names if n.startswith("lengthscan.") and n != "lengthscan.demo"]
            assert not private, f"{path.name} imports {private}: use the public API"
        assert cell["outputs"], f"{path.name} is saved without the outputs of:\n{source}"


def test_walkthrough_runs(tmp_path, monkeypatch):
    _check_saved(NOTEBOOK)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    namespace: dict = {}
    for cell in _code_cells(NOTEBOOK):
        exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}", "exec"), namespace)
    namespace["plt"].close("all")
    work = namespace["work"]
    assert work.parent == tmp and (work / "walkthrough-report" / "report.html").exists()
    assert list(cwd.iterdir()) == []
    assert namespace["result"].split("train").sample.full
    assert not namespace["sampled"].split("train").sample.full
    assert list(namespace["with_lengths"].column_names)[-2:] == ["input_tokens", "target_tokens"]


def test_quickstart_executes_with_a_real_kernel(tmp_path, monkeypatch):
    """notebooks/quickstart.ipynb run by nbclient in a real Jupyter kernel, so it cannot rot."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (test extras)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (test extras)")
    pytest.importorskip("matplotlib", reason="matplotlib not installed (test extras)")
    path = NOTEBOOKS / "quickstart.ipynb"
    _check_saved(path)
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the kernel inherits it: tempfile.mkdtemp makes `work` under tmp
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("print(work)"))  # the notebook's own `work`, from its namespace
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "input_tokens" in text and "'kept'" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the histograms were not drawn"
    work = Path(nb.cells[-1].outputs[0]["text"].strip())
    assert work.parent == tmp and (work / "quickstart-clean" / "dataset").is_dir()
    assert list(cwd.iterdir()) == []
