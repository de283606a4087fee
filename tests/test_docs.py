"""The documentation: every CLI flag in the generated command-line reference (as sqlite-utils checks its own),
the generated benchmarks and API pages complete, the README short and self-contained, its test command
``.ci/run``'s, and the pins of the test and docs installs. The examples of the README and the site's pages
are run by ``tests/test_docs_examples.py``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from lengthscan.cli.reference import cli_reference, flags_of

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _hooks():
    """``docs/hooks.py``, the site's generators (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("lengthscan_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_flag_is_in_the_generated_cli_reference():
    """Each subcommand's section of the reference names each of its flags, with the help text ``--help`` shows."""
    from lengthscan.cli.main import build_parser

    reference = cli_reference()
    sections = dict(re.findall(r"^## `lengthscan (\w+)`.*?\n(.*?)(?=^## |\Z)", reference, re.M | re.S))
    flags = flags_of()
    assert set(sections) == set(flags) == {"audit", "clean", "memory", "demo"}
    missing = [f"{name} {flag}" for name, options in flags.items() for flag in options
               if not re.search(rf"^\| `{re.escape(flag)}[ `,]", sections[name], re.M)]
    assert not missing, missing
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    images = next(a for a in sub.choices["audit"]._actions if "--max-pixels" in a.option_strings)
    assert " ".join(images.help.split()) in sections["audit"]
    # clean's sampling flags are refused with a reason and not offered: not documented as clean's
    assert "`--sample " not in sections["clean"] and "`--sample " in sections["audit"]


def test_the_cli_reference_gives_choices_and_defaults():
    reference = cli_reference()
    packing = next(line for line in reference.splitlines() if line.startswith("| `--packing "))
    for strategy in ("bfd", "bfd_split", "wrapped", "multipack", "knapsack"):
        assert f"`{strategy}`" in packing
    out = next(line for line in reference.splitlines() if line.startswith("| `--out DIR`"))
    assert "./lengthscan-report" in out
    seed = [line for line in reference.splitlines() if line.startswith("| `--seed SEED`")]
    assert any(line.endswith("| `0` |") for line in seed) and any(line.endswith("| `42` |") for line in seed)
    assert "| `--out DIR` (required) |" in reference  # clean's


def test_the_site_pages_are_in_the_nav_and_the_generated_parts_have_markers():
    config = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    in_nav = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", config, re.M))
    assert pages == in_nav, (pages - in_nav, in_nav - pages)
    hooks = _hooks()
    for page, name in (("reference/cli.md", "cli-reference"), ("benchmarks.md", "benchmarks"),
                       ("reference/api.md", "api")):
        assert f"<!-- generated: {name} -->" in (ROOT / "docs" / page).read_text()
        assert hooks.generated(name).strip()


def test_the_benchmarks_page_holds_every_result_file():
    text = _hooks().benchmarks_markdown()
    files = sorted((ROOT / "bench").glob("results*.md"))
    assert files
    for path in files:
        assert f"`bench/{path.name}`" in text
        for line in path.read_text().splitlines():
            if line.startswith("| ") and "](" not in line:
                assert line in text, (path.name, line)


def test_the_api_page_documents_every_export():
    import lengthscan

    text = _hooks().api_markdown()
    for name in lengthscan.__all__:
        if not name.startswith("__"):
            module, attr = lengthscan._EXPORTS[name]
            assert f"## `lengthscan.{name}`\n\n::: {module}.{attr}\n" in text


def test_the_readme_is_short_and_self_contained():
    lines = README.splitlines()
    assert len(lines) < 200, len(lines)
    assert "../" not in README  # no path outside the repository
    assert "docs/assets/demo-audit.svg" in README and (ROOT / "docs" / "assets" / "demo-audit.svg").exists()
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
    assert "pip install -e . && lengthscan demo" in README
    assert re.search(r"apt-get install -y espeak-ng mpg123 chromium", README)


def test_readme_commands_match_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = re.search(r"```bash\n(pip install -c tests/constraints.txt -e \"\.\[test[^\]]*\]\".*)\n```",
                         README).group(1)
    assert test_cmd in ci.splitlines()
    assert re.search(r"^(NO_MKDOCS_2_WARNING=1 )?mkdocs build --strict .*-d ", ci, re.M)  # into a temporary folder


def test_the_constraints_pin_what_the_test_extras_pull():
    """Every package of the test install is pinned (``==``), torch to its CPU build's version, and every
    dependency of the project and its test, ray and docs extras appears there."""
    import tomllib

    pins = {}
    for line in (ROOT / "tests" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, line
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["test"] + extras["ray"] + extras["docs"]
    for req in wanted:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower())
        assert name in pins, req
    assert pins["torch"] == "2.13.0"
    assert {"notebook", "matplotlib", "ipykernel"} <= {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
                                                       for r in extras["notebooks"]}


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    """``mkdocs build --strict``, as ``.ci/run`` runs it: a broken link or a page missing fails."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    import os
    import subprocess
    import sys

    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--max-pixels" in page and "--packing" in page
