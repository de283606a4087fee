"""The public API: every exported name resolves to what it says, even after every submodule is imported
(a submodule named like a function would shadow it: ``lengthscan.audit`` must stay the function)."""

from __future__ import annotations

import importlib
import pkgutil

import lengthscan


def test_exports_are_not_shadowed_by_submodules():
    for info in pkgutil.walk_packages(lengthscan.__path__, "lengthscan."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    for name in lengthscan.__all__:
        value = getattr(lengthscan, name)
        assert not isinstance(value, type(lengthscan)), f"lengthscan.{name} is a module"
        assert callable(value) or isinstance(value, str), name


def test_ray_forms_take_exactly_the_local_forms_keywords(corpus_jsonl, bpe_dir):
    """``audit_ray``/``clean_ray`` read their keywords from ``audit``/``clean``: the same names and defaults,
    plus the cluster's; an unknown or missing keyword fails as the local call does (before any cluster starts)."""
    import inspect

    import pytest

    from lengthscan.engines.ray.api import RAY_KEYWORDS, audit_ray, clean_ray

    for local, ray in ((lengthscan.audit, audit_ray), (lengthscan.clean, clean_ray)):
        want = inspect.signature(local).parameters
        got = inspect.signature(ray).parameters
        assert list(got) == ["source", *RAY_KEYWORDS, *list(want)[1:]]
        assert all(got[name].default == want[name].default for name in want)
    for name in ("packing", "sample_unit", "config", "revision", "max_length", "shuffle_seed", "devices"):
        assert name in inspect.signature(audit_ray).parameters
    with pytest.raises(TypeError, match="audit_ray.*'bogus'"):
        audit_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", bogus=1)
    with pytest.raises(TypeError, match="clean_ray.*'out'"):
        clean_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text")


#: record fields whose flag is not ``--field-name``: the CLI's spelling of them
FIELD_FLAGS = {"cache": "--no-cache", "limits": "--limit", "id_column": "--id", "decide_only": "--no-decide-only"}
#: record fields with no flag, and why: the library's own (a callback, the command line itself, a tuning knob)
NO_FLAG = {"progress": "a callback", "command": "the CLI fills it with its own argv",
           "batch_rows": "rows per measured batch: memory tuning for the library"}


def test_every_option_field_has_one_keyword_and_one_flag():
    """The option records, the keyword forms (``audit``/``clean``) and the CLI (``audit``/``clean`` commands) name
    the same options: every record field is exactly one keyword and, but for the library's own, one flag."""
    import argparse
    import inspect
    from dataclasses import fields

    from lengthscan.cli.main import build_parser
    from lengthscan.engines.options import RECORDS
    from lengthscan.pack.options import PackingOptions

    names = [f.name for r in (*RECORDS, PackingOptions) for f in fields(r)]
    assert len(names) == len(set(names)), "a field name in two records"
    keywords = (set(inspect.signature(lengthscan.audit).parameters)
                | set(inspect.signature(lengthscan.clean).parameters)) - {"source"}
    assert keywords == set(names)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {}
    for command in ("audit", "clean"):
        for action in sub.choices[command]._actions:
            for option in action.option_strings:
                flags.setdefault(option, set()).add(action.dest)
    for name in names:
        if name in NO_FLAG:
            assert f"--{name.replace('_', '-')}" not in flags
            continue
        flag = FIELD_FLAGS.get(name, f"--{name.replace('_', '-')}")
        assert flag in flags, f"{name}: no {flag} flag"
        assert len(flags[flag]) == 1, f"{flag} means two things"
