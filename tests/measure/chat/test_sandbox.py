"""A chat template that asks for an enormous value (one expression, a filter's width, a format, a
doubling loop, endless output) stops as the value passes the cap, before the memory is taken: the
row is ``too_long`` with its reason, in a fraction of a second. Real templates render exactly as
transformers renders them, generation spans included."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.measure.chat.sandbox import RenderTooLong
from lengthscan.measure.chat.template import ChatTemplate, Renderer
from tests.factories import write_jsonl
from tests.support.chat import trl_template
from tests.support.cli import one_line

CAP = 100_000
HELLO = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
#: each asks for far more than the cap (1e12 characters where that is one allocation: without the
#: cap it fails as MemoryError, not as RenderTooLong; a doubling loop stops near 2^27 characters)
HOSTILE = {
    "repeat": "{{ 'x' * 1000000000000 }}",
    "repeat_list": "{{ (messages * 1000000000000)|length }}",
    "center": "{{ 'x'|center(1000000000000) }}",
    "method": "{{ 'x'.ljust(1000000000000) }}",
    "percent": "{{ '%1000000000000d' % 1 }}",
    "format": "{{ '{:>1000000000000}'.format(1) }}",
    "format_filter": "{{ '%1000000000000s'|format('x') }}",
    "indent": "{{ ('a\\n' * 1000)|indent(1000000000) }}",
    "double_tilde": "{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "double_plus": "{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "replace": "{% set ns = namespace(s='xx') %}{% for i in range(27) %}{% set ns.s = ns.s|replace('x', 'xx') %}"
               "{% endfor %}",
    "join": "{{ (['x' * 90000] * 100000)|join }}",
    "nested_repr": "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
                   "{{ ns.x }}",
    "tojson": "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
              "{{ ns.x|tojson }}",
    "power": "{{ 7 ** 100000000 }}",
    "lipsum": "{{ lipsum(100000000) }}",
    "output": "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("spans", [False, True], ids=["render", "generate"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_enormous_value_stops_at_the_cap(name, spans):
    text = "{% for m in messages %}{{ m.content }}{% endfor %}" + HOSTILE[name]
    if spans:  # the spans' rendering streams the output through Template.generate
        text = "{% generation %}" + text + "{% endgeneration %}"
    renderer = Renderer(ChatTemplate(text, "test"), {}, max_chars=CAP)
    started = time.monotonic()
    with pytest.raises(RenderTooLong, match=f"longer than --max-chars {CAP:,} characters"):
        renderer.render(HELLO, spans=spans)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("name", ["qwen3_training", "qwen2_5", "llama3_training", "gemma3_training", "gptoss_training",
                                  "deepseekv3_training", "phi3_5_training"])
def test_real_templates_render_as_transformers_renders_them(name, chat_tok):
    """The capped overlay changes nothing of a real rendering: the text and the generation spans
    equal transformers' own ``apply_chat_template``."""
    template = trl_template(name)
    text = template.read_text()
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]
    messages = [{"role": "system", "content": "be brief"}, *HELLO, {"role": "user", "content": "and {{ this }}?"},
                {"role": "assistant", "content": "x " * 5000}]
    bos = {"bos_token": "<|begin_of_text|>"}  # the templates that write one read it
    renderer = Renderer(ChatTemplate(text, str(template)), {**chat_tok.special_tokens_map, **bos}, max_chars=CAP)
    for kw in ({}, {"add_generation_prompt": True}):
        ours, spans = renderer.render(messages, tools, spans=renderer.has_generation(tools), **kw)
        theirs = chat_tok.apply_chat_template(messages, tools=tools, chat_template=text, tokenize=False, **bos, **kw)
        assert ours == theirs
        if renderer.has_generation(tools):
            from transformers.utils.chat_template_utils import render_jinja_template

            texts, indices = render_jinja_template(conversations=[messages], tools=tools, chat_template=text,
                                                   return_assistant_tokens_mask=True,
                                                   **{**chat_tok.special_tokens_map, **bos}, **kw)
            assert (ours, spans) == (texts[0], indices[0]) and spans


def test_attribute_lookups_answer_as_the_sandbox_does(chat_tok):
    """The overlay's quick ``obj.attr`` (a dict's keys, a string's methods, a loop's and a namespace's
    values) gives what jinja's sandbox gives: a key named like a dict method is still the method, a
    missing key is undefined, ``format`` keeps the sandboxed formatter, a loop's methods still work,
    a private name stays refused."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    text = ("{{ m.role }}|{{ m.items()|list|length }}|{{ m.keys is defined }}|{{ m.missing is defined }}|"
            "{{ m.content.startswith('he') }}|{{ m.content.upper() }}|{{ '{}-{}'.format(m.role, 1) }}|"
            "{{ m.content.split('l')|join('.') }}|{{ m.get('role') }}|{{ (m.content.__class__ is defined) }}|"
            "{% set ns = namespace(a=1, f='<{}>'.format, l=[2]) %}{% set ns.b = ns.a + 1 %}"
            "{{ ns.a }}{{ ns.b }}{{ ns.f(ns.l) }}{{ ns.l.append is defined }}{{ ns.gone is defined }}"
            "{{ ns.__class__ is defined }}|{% for x in 'ab' %}{{ loop.index0 }}{{ loop.first }}{{ loop.length }}"
            "{{ loop.cycle('p', 'q') }}{{ loop.previtem is defined }}{{ loop.gone is defined }}{% endfor %}")
    m = {"role": "user", "content": "hello", "items": "shadowed", "get": 1}
    ours = Renderer(ChatTemplate(text.replace("m.", "messages[0]."), "inline"), chat_tok.special_tokens_map,
                    max_chars=CAP).render([m])[0]
    theirs = ImmutableSandboxedEnvironment().from_string(text.replace("m.", "messages[0].")).render(messages=[m])
    assert ours == theirs == ("user|4|True|False|True|HELLO|user-1|he..o|user|False|12<[2]>FalseFalseFalse|"
                              "0True2pFalseFalse1False2qTrueFalse")
    with pytest.raises(SecurityError, match="'__class__' of 'str' object is unsafe"):
        Renderer(ChatTemplate("{{ messages[0].content.__class__.__mro__ }}", "inline"), {}, max_chars=CAP).render([m])


def test_a_hostile_template_marks_rows_too_long_through_the_cli(tmp_path, chat_tok_dir, capsys):
    """Only the rows that set the template off are too_long (with the reason); the others are
    measured; the run neither stops nor takes the memory it asked for."""

    from lengthscan.cli.main import main

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                        "{% if 'boom' in m.content %}{{ m.content * 1000000000000 }}{% endif %}{% endfor %}")
    rows = [{"messages": [{"role": "user", "content": c}, {"role": "assistant", "content": "ok"}]}
            for c in ("hello", "boom", "fine", "boom boom")]
    src = tmp_path / "c.jsonl"
    write_jsonl(src, rows)
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(template), "--full", "--no-cache", "--quiet", "--out", str(tmp_path / "o")]) == 0
    table = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pydict()
    assert table["chat_flag"] == [None, "too_long", None, "too_long"]
    assert all("the rendering is longer than --max-chars 10,000,000 characters" in table["chat_error"][i]
               for i in (1, 3))
    assert table["sequence_tokens"][0] > 0 and table["sequence_tokens"][2] > 0


def test_other_callers_of_transformers_are_not_capped(chat_tok):
    """The cap holds while lengthscan renders, in its thread: transformers' own callers in the same
    process render as before."""
    text = "{{ 'x' * 200000 }}"
    with pytest.raises(RenderTooLong):
        Renderer(ChatTemplate(text, "test"), {}, max_chars=CAP).render(HELLO)
    assert chat_tok.apply_chat_template(HELLO, chat_template=text, tokenize=False) == "x" * 200000


def test_a_template_that_loops_is_a_rows_error_then_stops_the_run(tmp_path, chat_tok_dir, capsys, monkeypatch):
    from lengthscan.measure.chat import template

    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    slow = tmp_path / "slow.jinja"
    slow.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{% if messages|length > 1 %}"
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}")
    rows = [{"messages": [{"role": "user", "content": "hi"}]}] * 3 + \
           [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    args = ["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
            str(slow), "--full", "--quiet", "--no-cache"]
    started = time.monotonic()
    assert main([*args, "--json", "--out", str(tmp_path / "o1")]) == 0  # one slow row: its own reason
    chat = json.loads(capsys.readouterr().out)["splits"][0]["roles"]
    assert "template_error" in json.dumps(chat)
    src = write_jsonl(tmp_path / "c.jsonl", rows[-1:] * 4)
    assert main([*args, "--out", str(tmp_path / "o2")]) == 2  # slow on row after row: the run stops
    one_line(capsys, "the chat template ran past 0.3 s on 3 rows")
    assert time.monotonic() - started < 20
