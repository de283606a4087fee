"""Count the checks in tests/ statically, so a reorganisation of the suite can show that nothing was weakened.

Counted (AST, no test is run):

- ``assert`` statements;
- ``pytest.raises`` / ``pytest.warns`` / ``pytest.deprecated_call`` uses (as ``with`` blocks or calls);
- calls of functions whose name starts with ``assert`` (``np.testing.assert_array_equal``,
  ``pa.Table.equals`` is not one, ``self.assertEqual``, the suite's own ``assert_*`` helpers) and of
  ``pytest.fail``;
- helper functions in ``tests/`` that hold asserts are counted once where they are defined (not per call).

Also printed: the number of test functions (``def test_*``) and of files, so moves can be checked.

    python bench/count_assertions.py [tests] [--per-file]
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

RAISES = {"raises", "warns", "deprecated_call", "fail"}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_pytest(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "pytest"


def count_file(path: Path) -> Counter:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found["assert"] += 1
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            if _is_pytest(node.func) and name in RAISES:
                found[f"pytest.{name}"] += 1
            elif name.startswith("assert"):
                found["assert_call"] += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found["test_functions"] += 1
    return found


def main(argv: list[str]) -> int:
    per_file = "--per-file" in argv
    roots = [Path(a) for a in argv if not a.startswith("--")] or [Path(__file__).resolve().parents[1] / "tests"]
    total: Counter = Counter()
    files = 0
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            found = count_file(path)
            files += 1
            total += found
            if per_file:
                checks = sum(v for k, v in found.items() if k != "test_functions")
                print(f"{checks:5d} checks {found['test_functions']:4d} tests  {path}")
    checks = sum(v for k, v in total.items() if k != "test_functions")
    detail = ", ".join(f"{k} {v}" for k, v in sorted(total.items()) if k != "test_functions")
    print(f"files {files}; test functions {total['test_functions']}; checks {checks} ({detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
