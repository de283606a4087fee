"""mkdocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the site, written at build time so that
nothing generated is committed, and so nothing generated can go stale.

A page holds a marker line where its generated part goes:

* ``<!-- generated: cli-reference -->``: the command-line reference, ``lengthscan.cli.reference.cli_reference()``
  (from the argument parser, whose flags the option records declare);
* ``<!-- generated: benchmarks -->``: every ``bench/results*.md``, as :func:`benchmarks_markdown` joins them;
* ``<!-- generated: api -->``: one mkdocstrings block per name of ``lengthscan.__all__``, from the package's
  own table of exports, so the API reference lists exactly the public names.

The notebooks (``notebooks/*.ipynb``) are added to the site as files, so the notebooks page links them.

``tests/test_docs.py`` imports this file to check the generated text.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)

#: the benchmark result files, in the page's order (any other ``bench/results*.md`` follows, by name)
BENCH_ORDER = ("results.md", "results-quick.md", "results-count.md", "results-images.md", "results-remote.md")


def benchmarks_markdown(bench: Path = ROOT / "bench") -> str:
    """Every ``bench/results*.md`` as one section each: its headings moved two levels down (under the
    page's own), its links to repository files turned into plain code (they are not site pages)."""
    files = sorted(bench.glob("results*.md"), key=lambda p: (p.name not in BENCH_ORDER,
                                                             BENCH_ORDER.index(p.name) if p.name in BENCH_ORDER
                                                             else 0, p.name))
    parts = []
    for path in files:
        text = path.read_text(encoding="utf-8").strip()
        lines, title = [], None
        for line in text.splitlines():
            heading = re.match(r"^(#{1,4}) (.*)$", line)
            if heading and title is None:
                title = heading.group(2)
                continue
            if heading:
                line = f"{'#' * min(len(heading.group(1)) + 2, 6)} {heading.group(2)}"
            lines.append(line)
        body = re.sub(r"\[([^\]]+)\]\((?!https?://)[^)]+\)", r"\1", "\n".join(lines).strip())
        parts.append(f"### {title or path.stem}\n\n*From `bench/{path.name}`.*\n\n{body}\n")
    return "\n".join(parts)


def api_markdown() -> str:
    """A mkdocstrings block for every public name of ``lengthscan`` (its lazy export table), under a heading of
    the name users write (``lengthscan.audit``), documented where it is defined."""
    import lengthscan

    blocks = []
    for name in lengthscan.__all__:
        if name.startswith("__"):
            continue
        module, attr = lengthscan._EXPORTS[name]
        # the public calls are inspected (imported), not only read: their signatures and docstrings are generated
        # at import from the option records
        inspect = "      force_inspection: true\n" if module == "lengthscan.engines.api" else ""
        blocks.append(f"## `lengthscan.{name}`\n\n::: {module}.{attr}\n    options:\n      show_root_heading: false\n"
                      f"{inspect}")
    return "\n".join(blocks)


def generated(name: str) -> str:
    if name == "cli-reference":
        from lengthscan.cli.reference import cli_reference

        # the page has its own title; the generated part starts below it
        return cli_reference().split("\n", 1)[1]
    if name == "benchmarks":
        return benchmarks_markdown()
    if name == "api":
        return api_markdown()
    raise ValueError(f"no generated part named {name!r}")


def on_files(files, config):
    """The notebooks (``notebooks/*.ipynb``) served as downloads beside the pages that link them."""
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File.generated(config, f"notebooks/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: generated(m.group(1)), markdown)


#: Sphinx roles in the docstrings (``:class:`Spec```), which mkdocstrings leaves as written before the code
_ROLES = re.compile(r":(?:class|meth|func|attr|mod|data|obj):(?=<code)")


def on_page_content(html: str, page, config, files) -> str:
    return _ROLES.sub("", html)

