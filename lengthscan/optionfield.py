"""An option record's field declared once: its default, its help text, and the flag that sets it.

The option records (``engines.options``, ``pack.options``) declare every field with :func:`option`;
the CLI's flags (``cli.flags``), the keyword forms of ``lengthscan.audit``/``clean`` and their
docstrings are all generated from these declarations, so a new option is one field in one record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field
from types import MappingProxyType

#: the subcommands (and keyword forms) that measure a source
COMMANDS = ("audit", "clean")


@dataclass(frozen=True)
class Flag:
    """How a field is offered: its command-line flag (None: the library's own, with ``why``), the
    commands offering it, its help text and argparse's keyword arguments for it."""

    flag: str | None
    help: str
    commands: tuple[str, ...] = COMMANDS
    invert: bool = False                       # a --no-X flag: given, the field is False
    argparse: Mapping = field(default_factory=dict)   # metavar, choices, type, action
    overrides: Mapping = field(default_factory=dict)  # command -> argparse keyword arguments for that command
    why: str = ""                              # why a library-only field has no flag

    def offered(self, command: str) -> bool:
        return command in self.commands


def option(default=MISSING, flag: str | None = None, help: str = "", *, commands: tuple[str, ...] = COMMANDS,
           invert: bool = False, overrides: Mapping | None = None, why: str = "", **argparse) -> Field:
    """A dataclass field with its :class:`Flag`: ``option(None, "--input", "column holding ...", metavar="COL")``.
    ``argparse`` holds what ``add_argument`` takes beside the flag, the help and the default (the
    field's own default, unless ``overrides`` gives a command another)."""
    if flag is None and not why:
        raise TypeError("an option without a flag says why (the library's own)")
    meta = Flag(flag, help, tuple(commands), invert, MappingProxyType(dict(argparse)),
                MappingProxyType({k: MappingProxyType(dict(v)) for k, v in (overrides or {}).items()}), why)
    return field(default=default, metadata={"flag": meta})


def flag_of(f: Field) -> Flag:
    """The :class:`Flag` declared for field ``f`` (a TypeError for a field declared without one)."""
    meta = f.metadata.get("flag")
    if meta is None:
        raise TypeError(f"option field {f.name!r} is declared without option()")
    return meta
