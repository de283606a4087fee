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
    """``audit_ray``/``clean_ray`` are ``audit``/``clean`` with ``engine="ray"``: the same keywords and defaults but
    that one; an unknown or missing keyword fails as the local call does (before any cluster starts)."""
    import inspect

    import pytest

    from lengthscan.engines.api import audit_ray, clean_ray

    for local, ray in ((lengthscan.audit, audit_ray), (lengthscan.clean, clean_ray)):
        want = inspect.signature(local).parameters
        got = inspect.signature(ray).parameters
        assert list(got) == list(want)
        assert {name for name in want if got[name].default != want[name].default} == {"engine"}
        assert got["engine"].default == "ray" and want["engine"].default == "local"
    for name in ("packing", "sample_unit", "config", "revision", "max_length", "shuffle_seed", "devices",
                 "ray_address", "num_blocks"):
        assert name in inspect.signature(audit_ray).parameters
    with pytest.raises(TypeError, match="audit.*'bogus'"):
        audit_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", bogus=1)
    with pytest.raises(TypeError, match="clean.*'out'"):
        clean_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text")
    with pytest.raises(TypeError, match="clean.*'sample'"):
        lengthscan.clean(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", out="x", sample=10)
    with pytest.raises(TypeError, match="audit.*'tokenize'"):
        lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", tokenize=True)


def test_every_option_field_has_one_keyword_and_one_flag():
    """The spec's records, the keyword forms (``audit``/``clean``) and the CLI (``audit``/``clean`` commands) name
    the same options: every field is exactly one keyword of the commands that take it and, but for the library's
    own (each saying why), exactly one flag there, which means that field and nothing else."""
    import argparse
    import inspect

    from lengthscan.cli.main import build_parser
    from lengthscan.engines.spec import option_fields
    from lengthscan.optionfield import flag_of

    declared = [(group, f, flag_of(f)) for group, f in option_fields()]
    names = [f.name for _, f, _ in declared]
    assert len(names) == len(set(names)), "a field name in two records"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("audit", "clean"):
        keywords = set(inspect.signature(getattr(lengthscan, command)).parameters) - {"source", "spec"}
        assert keywords == {f.name for _, f, flag in declared if flag.offered(command)}, command
        by_flag = {}
        for action in sub.choices[command]._actions:
            for option in action.option_strings:
                by_flag.setdefault(option, set()).add(action.dest)
        for group, f, flag in declared:
            if flag.flag is None:
                assert flag.why and f.name in keywords, f.name
                assert f"--{f.name.replace('_', '-')}" not in by_flag, f.name
            elif flag.offered(command):
                assert by_flag.get(flag.flag) == {f.name}, f"{command} {flag.flag}: {by_flag.get(flag.flag)}"
                assert flag.help, f.name
        assert set(by_flag) - {"-h", "--help", "--json", "--quiet"} <= {flag.flag for _, _, flag in declared}


def test_a_spec_runs_as_its_keywords_do(corpus_jsonl, bpe_dir, tmp_path):
    """``audit(source, spec)`` and ``audit(source, **keywords)`` are one run: the same lengths; keywords change a
    spec's fields, the spec is not changed, and one spec serves audit and clean."""
    from lengthscan import Spec

    spec = Spec.of(tokenizer=str(bpe_dir), input="text", sample=50, limits=["input_tokens<=40"])
    by_spec = lengthscan.audit(str(corpus_jsonl), spec)
    by_keywords = lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", sample=50,
                                   limits=["input_tokens<=40"])
    assert by_spec.to_dict()["splits"] == by_keywords.to_dict()["splits"]
    assert spec.rules.limits == ("input_tokens<=40",) and spec.output.out is None
    full = lengthscan.audit(str(corpus_jsonl), spec, sample=None, full=True)
    assert full.to_dict()["splits"] != by_spec.to_dict()["splits"] and spec.sample.sample == 50
    cleaned = lengthscan.clean(str(corpus_jsonl), spec, out=str(tmp_path / "cleaned"))
    (split,) = cleaned.to_dict()["decisions"]["splits"]
    rows = full.to_dict()["splits"][0]["sample"]["rows_total"]
    assert split["rows"] == rows == split["kept"] + split["dropped"] + split["truncated"] and split["dropped"] > 0
    assert cleaned.to_dict()["splits"][0]["sample"]["mode"] == "full"  # the spec's sample is the audit's
    assert spec.keywords()["input"] == "text" and Spec.of(**spec.keywords()) == spec
