"""The flags of the option records' fields, generated from their declarations (``optionfield.option``),
and the run's ``Spec`` built back from the parsed flags."""

from __future__ import annotations

import argparse
from dataclasses import Field

from lengthscan.optionfield import flag_of


def named(value: str) -> str:
    """An argparse type: a column, path or hub name that is not empty (``--tokenizer ""`` would read
    as no tokenizer at all, ``--out ""`` as the working directory)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty name")
    return value


#: The CLI's own flags: how the result is printed (every other flag is an option record's field).
CLI_FLAGS: dict[str, tuple[str, dict]] = {
    "json": ("--json", dict(action="store_true", help="print report.json to stdout and nothing else there")),
    "quiet": ("--quiet", dict(action="store_true", help="no progress bar and no summary")),
}
#: metavars of names (columns, paths, hub names): an empty one is refused by ``named``
_NAMES = ("COL", "FILE", "DIR", "DIR_OR_NAME", "NAME", "REV")
#: the help's section for each group of the spec
GROUP_TITLES = {"measure": "what to measure", "sample": "which rows", "rules": "rules and gate",
                "output": "outputs", "dataset": "the cleaned dataset", "packing": "packing", "run": "how to run"}


def argument(f: Field, command: str, *, prefix: str = "", **override) -> tuple[str, dict]:
    """The flag of option field ``f`` and ``add_argument``'s keyword arguments for it in ``command``:
    its declared help and argparse arguments, the field's default (an inverted ``--no-X`` stores
    False), the command's declared overrides, then ``override``."""
    flag = flag_of(f)
    kwargs = {**flag.argparse, "dest": f.name, "help": flag.help}
    if flag.invert:
        kwargs.update(action="store_false", default=f.default)
    else:
        kwargs["default"] = [] if kwargs.get("action") == "append" else f.default
    kwargs.update(flag.overrides.get(command, {}))
    kwargs.update(override)
    if "type" not in kwargs and (kwargs.get("metavar") in _NAMES or f.name == "split"):
        kwargs["type"] = named
    if prefix and kwargs.get("help") not in (None, argparse.SUPPRESS):
        kwargs["help"] = prefix + kwargs["help"]
    return flag.flag, kwargs


def add_spec_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Every flag ``command`` (audit or clean) offers, one help section per group of the spec."""
    from lengthscan.engines.spec import offered, option_fields

    taken = {f.name for f, _ in offered(command)}
    sections = {}
    for group, f in option_fields():
        if f.name in taken and flag_of(f).flag is not None:
            section = sections.get(group) or sections.setdefault(group, parser.add_argument_group(GROUP_TITLES[group]))
            flag, kwargs = argument(f, command)
            section.add_argument(flag, **kwargs)


def add_flags(parser: argparse.ArgumentParser, *names: str, command: str = "", prefix: str = "",
              **overrides) -> None:
    """Add the flags of the option fields (or the CLI's own flags) ``names`` to ``parser``, as
    ``command`` has them; ``prefix`` starts each help text, and ``overrides`` (name -> keyword
    arguments) change one flag for this parser."""
    from lengthscan.engines.spec import option_fields

    declared = {f.name: f for _, f in option_fields()}
    for name in names:
        if name in CLI_FLAGS:
            flag, kwargs = CLI_FLAGS[name][0], {**CLI_FLAGS[name][1], **overrides.get(name, {})}
            if prefix:
                kwargs["help"] = prefix + kwargs["help"]
        else:
            flag, kwargs = argument(declared[name], command, prefix=prefix, **overrides.get(name, {}))
        parser.add_argument(flag, **kwargs)


def add_source_argument(parser: argparse.ArgumentParser, **kwargs) -> None:
    """The positional ``SRC``."""
    parser.add_argument("source", metavar="SRC", type=named, **{
        "help": "JSONL/JSON, CSV/TSV or Parquet file or glob (optionally compressed), a save_to_disk or "
                "data-file directory, an audio folder, a hub dataset id, or remote files (s3://, gs://, "
                "https://, hf://datasets/...)", **kwargs})


def spec_of(args, subcommand: str, **library):
    """The run's ``Spec`` from the parsed flags of ``subcommand``, with the library's own fields
    (``progress``, ``command``) given; a flag left at None keeps its field's default."""
    from lengthscan.engines.spec import Spec, offered
    from lengthscan.pack.options import PackingError

    values = {}
    for f, flag in offered(subcommand):
        if flag.flag is not None:
            value = getattr(args, f.name)
            if value is not None or f.default is None:
                values[f.name] = value
    if subcommand == "audit" and args.packing is None:
        stray = [flag.flag for f, flag in offered(subcommand)
                 if f.name in ("batch_size", "grad_accum", "devices") and getattr(args, f.name) is not None]
        if stray:
            raise PackingError(f"{', '.join(stray)}: packing's options; add --packing STRATEGY --max-length L")
    return Spec.of(**values, **library)
