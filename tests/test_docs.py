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
    test_cmd = re.search(r"```bash\n(pip install -e \"\.\[test[^\]]*\]\".*)\n```", README).group(1)
    assert test_cmd in ci.splitlines()
