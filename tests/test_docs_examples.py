"""The examples of the README and of the site's pages run, so they cannot drift from the code; those that cannot run
here (hub models, clusters, buckets) parse with the CLI's parser, and the Python ones compile and name real API.

A code block runs when the line before it is ``<!-- run -->`` (or ``<!-- run: exit N -->`` for a command that
must exit N, a gate that fails). Bash blocks are ``lengthscan`` commands, run in this process by the CLI's
``main``; Python blocks are executed. Each runs in a fresh folder holding what the examples name:
``train.jsonl`` (``document``, ``summary``), ``chats.jsonl`` (``messages``), ``manifest.csv`` (``path``,
``transcript``: WAV files), ``./tok`` (a byte-level BPE with a chat template), and ``./bart-base`` and
``./bart-config`` (a BART config, no weights).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests import factories

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = re.compile(r"^<!-- run(?:: exit (\d+))? -->\n```(bash|python)\n(.*?)\n```", re.M | re.S)


def _examples() -> list:
    found = []
    for page in PAGES:
        for i, m in enumerate(RUN.finditer(page.read_text(encoding="utf-8"))):
            name = f"{page.relative_to(ROOT)}#{i}"
            found.append(pytest.param(m.group(2), m.group(3), int(m.group(1) or 0), id=name))
    return found


EXAMPLES = _examples()


def test_the_pages_have_examples_that_run():
    """The README's four uses and a first audit in the guides are among the examples run."""
    ids = [p.id for p in EXAMPLES]
    assert sum(i.startswith("README.md") for i in ids) == 4
    for page in ("getting-started", "guides/text", "guides/chat", "guides/library", "guides/ci", "guides/memory",
                 "guides/packing", "guides/audio"):
        assert any(i.startswith(f"docs/{page}.md") for i in ids), page


def _every_command() -> list:
    """Every ``lengthscan`` command line of every bash block of the README and the pages, run or not."""
    found = []
    for page in PAGES:
        blocks = re.findall(r"^```bash\n(.*?)\n```", page.read_text(encoding="utf-8"), re.M | re.S)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = re.split(r" #| \| | > | && ", line)[0].strip()
                optional = re.findall(r"--[a-z][a-z0-9-]*", " ".join(re.findall(r"\[--[^\]]*\]", line)))
                line = re.sub(r"\[--[^\]]*\]", "", line)  # a synopsis' optional flags ([--json]): checked by name
                if line.startswith("lengthscan "):
                    found.append(pytest.param(shlex.split(line)[1:], optional,
                                              id=f"{page.relative_to(ROOT)}: {line[:60]}"))
    return found


@pytest.mark.parametrize("argv, optional", _every_command())
def test_every_documented_command_parses(argv, optional):
    """The examples that cannot run here (hub models, clusters, buckets) still name real flags and choices."""
    from lengthscan.cli.main import build_parser
    from lengthscan.cli.reference import flags_of

    assert set(optional) <= set(flags_of()[argv[0]]), set(optional) - set(flags_of()[argv[0]])
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"lengthscan {shlex.join(argv)}: exit {exc.code}")


def _python_blocks() -> list:
    return [pytest.param(block, id=f"{page.relative_to(ROOT)}#{i}") for page in PAGES
            for i, block in enumerate(re.findall(r"^```python\n(.*?)\n```", page.read_text(encoding="utf-8"),
                                                 re.M | re.S))]


@pytest.mark.parametrize("block", _python_blocks())
def test_every_python_example_compiles(block):
    """The Python examples that do not run here are Python all the same, and the names they take from lengthscan
    exist: ``lengthscan.NAME`` is a public name, ``from lengthscan.X import Y`` imports."""
    import ast
    import importlib

    import lengthscan

    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "lengthscan":
            assert node.attr in lengthscan.__all__, f"lengthscan.{node.attr}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lengthscan":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"from {node.module} import {alias.name}"


def _commands(block: str) -> list[list[str]]:
    """The ``lengthscan`` commands of a bash block: continuations joined, comments and blank lines left out."""
    text = block.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line)
        assert argv[0] == "lengthscan", f"a run example is a lengthscan command: {line}"
        assert not {"|", ">", "&&", ";"} & set(argv), f"a run example is one command, no shell: {line}"
        commands.append(argv[1:])
    return commands


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, corpus_rows, chat_tok_dir, bart_dir) -> Path:
    """The files the examples name (a template folder, copied for each example)."""
    import soundfile

    from tests.support.chat import trl_template

    root = tmp_path_factory.mktemp("docs-examples")
    rows = [r for r in corpus_rows if r["text"] and r["summary"]][:400]
    factories.write_jsonl(root / "train.jsonl", [{"document": r["text"], "summary": r["summary"]} for r in rows],
                          ensure_ascii=False)
    chats = []
    for i, r in enumerate(rows):
        messages = [{"role": "user", "content": r["summary"]}, {"role": "assistant", "content": r["text"]}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Answer with the docstring."})
        chats.append({"messages": messages})
    factories.write_jsonl(root / "chats.jsonl", chats, ensure_ascii=False)
    tok = root / "tok"
    shutil.copytree(chat_tok_dir, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["chat_template"] = trl_template("qwen3").read_text()
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("bart-base", "bart-config"):
        shutil.copytree(bart_dir, root / name)
    import numpy as np

    lines = ["path,transcript"]
    for i, seconds in enumerate((0.5, 1.25, 2.0, 3.5)):
        t = np.arange(int(16000 * seconds)) / 16000
        soundfile.write(root / f"clip{i}.wav", 0.1 * np.sin(2 * np.pi * 440 * t), 16000)
        lines.append(f"clip{i}.wav,clip number {i}")
    (root / "manifest.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("language, block, exit_code", EXAMPLES)
def test_example_runs(language, block, exit_code, workspace, tmp_path, monkeypatch):
    from lengthscan.cli.main import main

    here = tmp_path / "work"
    shutil.copytree(workspace, here)
    monkeypatch.chdir(here)
    if language == "python":
        exec(compile(block, "<example>", "exec"), {"__name__": "__example__"})
        return
    codes = [main([*argv, *([] if argv[0] == "memory" or "--quiet" in argv else ["--quiet"])])
             for argv in _commands(block)]
    assert codes[:-1] == [0] * (len(codes) - 1) and codes[-1] == exit_code, codes
