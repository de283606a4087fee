"""``Spec``: one frozen record describing a run, and the keyword forms generated from it.

A ``Spec`` groups the option records (what to measure, which rows, the rules, the outputs, the
dataset clean writes, packing, how to run). ``lengthscan.audit(source, spec)`` and
``lengthscan.clean(source, spec)`` take it; their keyword forms (``audit(source, input="text",
...)``), their signatures and docstrings, and the CLI's flags are all generated from the records'
field declarations (``optionfield.option``), so they cannot drift.

One spec serves both commands: ``audit`` reads no ``dataset`` group, ``clean`` reads neither the
sampling fields (it decides every row) nor ``packing``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from dataclasses import Field, dataclass, fields, replace

from lengthscan.engines.options import (
    DatasetOptions,
    MeasureOptions,
    OutputOptions,
    RuleOptions,
    RunOptions,
    SampleOptions,
)
from lengthscan.optionfield import COMMANDS, Flag, flag_of
from lengthscan.pack.options import PackingOptions


@dataclass(frozen=True)
class Spec:
    """A run: what to measure, which rows, the rules and their actions, the outputs, what ``clean``
    writes, packing, and how to run (the engine among them). Build it with :meth:`of` from the flat
    keyword names (``Spec.of(tokenizer="./tok", input="text", limits=["input_tokens<=1024"])``) and
    change it with :meth:`replace`."""

    measure: MeasureOptions = MeasureOptions()
    sample: SampleOptions = SampleOptions()
    rules: RuleOptions = RuleOptions()
    output: OutputOptions = OutputOptions()
    dataset: DatasetOptions = DatasetOptions()
    packing: PackingOptions = PackingOptions()
    run: RunOptions = RunOptions()

    @classmethod
    def of(cls, **keywords) -> Spec:
        """The spec of the flat keywords (each a field of one record); an unknown one is a TypeError."""
        return cls().replace(**keywords)

    def replace(self, **keywords) -> Spec:
        """A copy with the flat keywords changed, each in the record that declares it."""
        groups = group_of()
        unknown = sorted(set(keywords) - set(groups))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        changed = {}
        for name, value in keywords.items():
            changed.setdefault(groups[name], {})[name] = value
        return replace(self, **{g: replace(getattr(self, g), **values) for g, values in changed.items()})

    def keywords(self) -> dict:
        """Every field by its flat name (the keyword form of this spec)."""
        return {f.name: getattr(getattr(self, group), f.name) for group, f in option_fields()}


def option_fields() -> Iterator[tuple[str, Field]]:
    """(group, field) for every option field of a spec, groups in declaration order."""
    defaults = Spec()
    for group in fields(Spec):
        for f in fields(getattr(defaults, group.name)):
            yield group.name, f


def group_of() -> dict[str, str]:
    """Flat field name -> the spec group holding it."""
    return {f.name: group for group, f in option_fields()}


def offered(command: str) -> list[tuple[Field, Flag]]:
    """The fields ``command`` (audit or clean) takes as keywords, in declaration order."""
    if command not in COMMANDS:
        raise ValueError(f"{command!r}: one of {', '.join(COMMANDS)}")
    return [(f, flag_of(f)) for _, f in option_fields() if flag_of(f).offered(command)]


def keyword_signature(command: str, returns) -> inspect.Signature:
    """``command``'s signature: ``source``, an optional ``spec``, then every offered field as a keyword
    with its record's default."""
    params = [inspect.Parameter("source", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("spec", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation="Spec")]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f, _ in offered(command)]
    return inspect.Signature(params, return_annotation=returns)


def keyword_docs(command: str) -> str:
    """The keyword section of ``command``'s docstring, from the fields' help texts (flags written as
    the keywords they set)."""
    names = {flag_of(f).flag: f.name for _, f in option_fields() if flag_of(f).flag}
    as_keyword = re.compile("|".join(re.escape(flag) for flag in sorted(names, key=len, reverse=True)) + r"\b")
    lines = []
    for f, flag in offered(command):
        text = as_keyword.sub(lambda m: f"``{names[m.group()]}``", flag.help.replace("%%", "%"))
        lines.append(f"    {f.name} (default {f.default!r}): {text}")
    return "\n".join(lines)


def spec_for(command: str, spec: Spec | None, keywords: dict) -> Spec:
    """The spec a call of ``command`` asks for: ``spec`` (default: every record's defaults) with
    ``keywords`` changed; a keyword ``command`` does not take is the TypeError of any Python call."""
    if spec is not None and not isinstance(spec, Spec):
        raise TypeError(f"{command}(): spec must be a lengthscan Spec, not {type(spec).__name__}")
    taken = {f.name for f, _ in offered(command)}
    stray = sorted(set(keywords) - taken)
    if stray:
        raise TypeError(f"{command}() got an unexpected keyword argument {stray[0]!r}")
    return (spec or Spec()).replace(**keywords)
