"""Every engine and every sink implements its interface (``engines.protocols``): the methods the
measuring loop calls, with the parameters it passes."""

from __future__ import annotations

import inspect

import pytest

from lengthscan.engines.protocols import Engine, Sink


def _engines():
    from lengthscan.engines.loop import LocalEngine
    from lengthscan.engines.ray.engine import RayEngine

    return [LocalEngine, RayEngine]


def _sinks():
    from lengthscan.engines.clean import CleanSink
    from lengthscan.pack.run import PackSink
    from lengthscan.write.lengths import LengthsSink
    from lengthscan.write.longest import LongestSink

    return [LengthsSink, LongestSink, PackSink, CleanSink]


def _same_parameters(impl, protocol, method: str) -> None:
    want = [(p.name, p.kind) for p in inspect.signature(getattr(protocol, method)).parameters.values()]
    got = [(p.name, p.kind) for p in inspect.signature(getattr(impl, method)).parameters.values()]
    assert got == want, f"{impl.__name__}.{method}: {got} != {want}"


@pytest.mark.parametrize("index", range(2))
def test_each_engine_is_an_engine(index):
    engine = _engines()[index]
    for attribute in ("name", "uses_cache", "single_pass"):
        assert isinstance(getattr(engine, attribute), str if attribute == "name" else bool), attribute
    for method in ("check", "early", "session", "open", "measure", "write_pass", "tokenizer_info", "proofs"):
        _same_parameters(engine, Engine, method)


@pytest.mark.parametrize("index", range(4))
def test_each_sink_is_a_sink(index):
    sink = _sinks()[index]
    for method in ("open_split", "write", "close_split"):
        _same_parameters(sink, Sink, method)
