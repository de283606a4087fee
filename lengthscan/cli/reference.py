"""The command-line reference as Markdown, generated from the argument parser (``build_parser``).

Every flag is declared once (the option records' fields, ``optionfield.option``, and the few flags
``cli/main.py`` and ``cli/memory.py`` add themselves); the documentation site's CLI page is this
function's output, written at build time (``docs/hooks.py``), so it can never disagree with ``--help``.
"""

from __future__ import annotations

import argparse


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown for every subcommand of ``parser`` (default: ``lengthscan``'s): its description, usage,
    each ``--help`` group as a table (flag, what it does, choices, default) and its epilog."""
    if parser is None:
        from lengthscan.cli.main import build_parser

        parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}
    lines = ["# Command-line reference", "",
             "Generated from the argument parser at build time: every flag of every subcommand, with its",
             "help text, choices and default, grouped as `lengthscan COMMAND --help` groups them.", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`lengthscan {name}`](#lengthscan-{name}) | {_cell(summaries.get(name) or '')} |"
              for name in sub.choices]
    lines += ["", "`lengthscan --version` prints the version. Exit codes: see "
              "[the nothing-lost contract](../concepts/contract.md#exit-codes).", ""]
    for name, p in sub.choices.items():
        lines += _command(name, p)
    return "\n".join(lines) + "\n"


def flags_of(parser: argparse.ArgumentParser | None = None) -> dict[str, list[str]]:
    """Each subcommand's long flags as ``--help`` offers them (hidden ones left out)."""
    if parser is None:
        from lengthscan.cli.main import build_parser

        parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [opt for a in p._actions if a.help != argparse.SUPPRESS for opt in a.option_strings
                   if opt.startswith("--") and opt != "--help"] for name, p in sub.choices.items()}


def _command(name: str, p: argparse.ArgumentParser) -> list[str]:
    formatter = p._get_formatter()
    wrap = p.formatter_class(prog=p.prog, width=100)  # a fixed width, whatever the terminal building the site
    wrap.add_usage(p.usage, p._actions, p._mutually_exclusive_groups, prefix="")
    usage = wrap.format_help().strip()
    lines = [f"## `lengthscan {name}` {{#lengthscan-{name}}}", "", _text(p.description or ""), "",
             "```text", usage, "```", ""]
    for group in p._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = {"options": "general options", "positional arguments": "positional arguments"}.get(
            group.title, group.title)
        lines += [f"### {title[:1].upper()}{title[1:]}", "", "| flag | what it does | choices | default |",
                  "|---|---|---|---|"]
        for action in actions:
            lines.append(f"| {_invocation(action)} | {_cell(formatter._expand_help(action) if action.help else '')} "
                         f"| {_choices(action)} | {_default(action)} |")
        lines.append("")
    if p.epilog:
        lines += ["### Examples, rule forms and exit codes", "", "```text", p.epilog.strip(), "```", ""]
    return lines


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    flag = ", ".join(action.option_strings)
    if action.nargs == 0:
        shown = flag
    else:
        metavar = action.metavar or (action.dest.upper() if not action.choices else None)
        shown = f"{flag} {metavar}" if metavar else f"{flag} {{{','.join(map(str, action.choices))}}}"
    required = " (required)" if action.required else ""
    repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
    return f"`{shown}`{required}{repeat}"


def _choices(action: argparse.Action) -> str:
    if not action.choices:
        return ""
    return ", ".join(f"`{c}`" for c in action.choices)


def _default(action: argparse.Action) -> str:
    default = action.default
    if isinstance(action, argparse._StoreFalseAction):
        return ""
    if default is None or default is False or default is argparse.SUPPRESS or default == []:
        return ""  # not given: the help says what then
    return f"`{default}`"


def _cell(text: str) -> str:
    """One table cell: one line, with what Markdown would read as a column, a tag or emphasis escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _text(text: str) -> str:
    return " ".join(text.split())
