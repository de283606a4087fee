"""Every CLI option is documented in the README (as sqlite-utils checks its own)."""

from __future__ import annotations

import re
from pathlib import Path

from lengthscan.cli.main import build_parser

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_option_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = []
    for name, p in sub.choices.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help" and f"`{opt}" not in README:
                    missing.append(f"{name} {opt}")
    assert not missing, missing


def test_readme_commands_match_ci():
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    test_cmd = re.search(r"```bash\n(pip install -c tests/constraints.txt -e \"\.\[test[^\]]*\]\".*)\n```",
                         README).group(1)
    assert test_cmd in ci.splitlines()


def test_the_constraints_pin_what_the_test_extras_pull():
    """Every package of the test install is pinned (``==``), torch to its CPU build's version, and every
    dependency of the project and its test and ray extras appears there."""
    import tomllib

    root = Path(__file__).parent.parent
    pins = {}
    for line in (root / "tests" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, line
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"] + \
        project["optional-dependencies"]["ray"]
    for req in wanted:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower())
        assert name in pins, req
    assert pins["torch"] == "2.13.0"
