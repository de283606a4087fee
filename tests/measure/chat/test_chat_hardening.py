"""Conversations an adversary would write: a chat template that is not a file one can read
(a FIFO, a device, a huge or non-UTF-8 file) is one line and exit 2, never a hang; a conversation of
thousands of turns is measured in near-linear time with the same counts as a direct
``apply_chat_template`` call; ``drop-turns`` never keeps a prefix with no trained token."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.chat import not_trls, trl_template, write_jsonl
from tests.support.cli import in_process

pytestmark = pytest.mark.slow  # subprocesses and conversations of thousands of turns


def _cli(*args, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=os.getcwd())


@pytest.mark.parametrize("case", ["fifo", "dev_zero", "folder", "huge", "latin1"])
def test_template_that_is_not_a_readable_file_exits_2_at_once(tmp_path, chat_tok_dir, case, capsys):
    """A FIFO or /dev/zero would block or never end a read: those run in a child process under a timeout (a
    regression fails, it does not hang the suite); the others run in this process."""
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "hello"}]}])
    path = {"dev_zero": "/dev/zero", "folder": tmp_path}.get(case, tmp_path / "t.jinja")
    if case == "fifo":
        os.mkfifo(path)  # nobody writes to it: opening it for reading would block for ever
    elif case == "huge":
        path.write_text("{# #}" + " " * (2 << 20))
    elif case == "latin1":
        path.write_bytes("{% for m in messages %}{{ m.content }}\u00e9{% endfor %}".encode("latin-1"))
    if case == "dev_zero" and not os.path.exists(path):
        pytest.skip("no /dev/zero")
    started = time.monotonic()
    args = ("audit", src, "--tokenizer", chat_tok_dir, "--messages", "messages", "--chat-template", path,
            "--out", tmp_path / "out", "--quiet", "--no-cache")
    done = _cli(*args, timeout=60) if case in ("fifo", "dev_zero") else in_process(capsys, *args)
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert "Traceback" not in err and err.startswith("lengthscan: error:") and len(err.splitlines()) == 1, err
    assert str(path) in err
    assert {"fifo": "FIFO", "dev_zero": "a device", "folder": "a folder", "latin1": "not UTF-8",
            "huge": "not a chat template: 2,097,157 bytes"}[case] in err
    assert not (tmp_path / "out" / "lengths.parquet").exists()


def _long_conversation(n: int) -> list[dict]:
    msgs = []
    for k in range(n // 2):
        msgs.append({"role": "user", "content": f"question number {k}: what is {k} plus {k}?"})
        msgs.append({"role": "assistant", "content": f"The answer is {2 * k}."})
    return msgs


def _chat_counter(tok_dir, template, train_on: str = "assistant"):
    from lengthscan.measure.chat.conversations import ChatFormat
    from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
    from lengthscan.measure.chat.metrics import chat_specs
    from lengthscan.measure.text.counter import TokenCounter

    chat = ChatCounter(TokenCounter(str(tok_dir)), ChatOptions(ChatFormat(messages="messages"), str(template),
                                                                train_on))
    return chat, {s.metric: s for s in chat_specs("messages")}


def _row(chat, specs, messages) -> tuple[dict, dict, str | None]:
    m = chat.measure({"messages": [messages]}, specs)
    return ({s.metric: int(v[0]) for s, v in m.values.items()}, {k: v[0] for k, v in m.notes.items()},
            m.errors[0] if m.errors else None)


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("name", ["qwen3_training", "llama3_training"])
def test_thousands_of_turns_are_measured_in_linear_time_exactly(chat_tok_dir, chat_tok, name, warm):
    """4,000 messages with a {% generation %} template: one rendering, token ranges read off the
    offsets once (not per message), the counts of apply_chat_template's own assistant mask."""
    from tests.support.chat import reference

    template = trl_template(name)
    chat, specs = _chat_counter(chat_tok_dir, template)
    if warm:  # past the first rows the ranges come from char_to_token, which scans: switched to offsets
        chat.measure({"messages": [_long_conversation(6)] * 3}, specs)
    messages = _long_conversation(4000)
    started = time.monotonic()
    values, _, error = _row(chat, specs, messages)
    took = time.monotonic() - started
    assert error is None
    assert (values["sequence_tokens"], values["completion_tokens"]) == reference(chat_tok, template, messages)
    assert values["turns"] == 4000 and values["assistant_turns"] == 2000
    assert took < 30, took  # was minutes: a conversion of the offsets per message


def test_per_turn_rule_past_its_budget_keeps_the_length_without_a_count(chat_tok_dir, chat_tok, tmp_path):
    """Without generation blocks TRL's rule renders two prefixes per assistant message (quadratic):
    past PREFIX_CHARS the row keeps its exact length and says why it has no completion count."""
    template = not_trls("qwen2_5", tmp_path)  # TRL's own is swapped for qwen2_5_training (generation blocks)
    chat, specs = _chat_counter(chat_tok_dir, template)
    messages = _long_conversation(4000)
    started = time.monotonic()
    values, notes, error = _row(chat, specs, messages)
    assert time.monotonic() - started < 30
    ids = chat_tok.apply_chat_template(messages, chat_template=template.read_text(), tokenize=True,
                                       return_dict=True)["input_ids"]
    assert values["sequence_tokens"] == len(ids)
    assert values["completion_tokens"] == -1 and values["prompt_tokens"] == -1
    assert error.startswith("no completion count: 2,000 assistant messages") and "{% generation %}" in error
    assert not notes["rewrites_history"]


@pytest.mark.parametrize("name", ["qwen3_training", "qwen2_5", "qwen3"])
def test_sequence_lengths_equal_measure(chat_tok_dir, docs, name):
    from tests.support.chat import conversations

    rows = conversations(docs, 60, seed=8)
    chat, specs = _chat_counter(chat_tok_dir, trl_template(name))
    columns = {"messages": [r["messages"] for r in rows]}
    measured = chat.measure(columns, specs).values[specs["sequence_tokens"]]
    assert chat.sequence_lengths(columns).tolist() == measured.tolist()


@pytest.mark.parametrize("tok", ["chat_tok_dir", "wordpiece_dir"])
def test_many_ranges_and_long_gaps_equal_offsets(request, tok, docs):
    """A view asked for more ranges than FAST_QUERIES reads the offsets (binary searches), and a
    range in a long run of characters no token holds (WordPiece drops whitespace) stops stepping
    char_to_token: both give the offsets' own counts."""
    import random

    import numpy as np
    from transformers import AutoTokenizer

    from lengthscan.measure.chat.ranges import FAST_QUERIES, offsets_count
    from lengthscan.measure.chat.views import EncodingView

    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(tok))
    rng = random.Random(4)
    text = (" " * 300).join(docs[:40]) + "\n" * 200 + docs[41]
    enc = tokenizer(text, add_special_tokens=False).encodings[0]
    off = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
    fast, exact = EncodingView(enc, text, exact=False), EncodingView(enc, text, exact=True)
    for _ in range(4 * FAST_QUERIES):
        a = rng.randrange(len(text) + 1)
        b = min(len(text), a + rng.randrange(0, 400))
        expected = int(((off[:, 1] > a) & (off[:, 0] < b)).sum())
        assert fast.overlap(a, b) == exact.overlap(a, b) == expected, (a, b)
    cuts = sorted(rng.sample(range(len(text) + 1), 2 * (FAST_QUERIES + 10)))
    spans = list(zip(cuts[::2], cuts[1::2]))
    for view in (EncodingView(enc, text, exact=False), exact):
        assert view.count(spans) == offsets_count(enc.offsets, spans)
        assert view.count(spans[:3]) == offsets_count(enc.offsets, spans[:3])


#: A template whose generation blocks hold the content alone (the end-of-turn token is not
#: trained), so an empty reply has no trained token.
CONTENT_ONLY = ("{%- for message in messages %}<|im_start|>{{ message.role }}\n{% if message.role == 'assistant' %}"
                "{% generation %}{{ message.content }}{% endgeneration %}{% else %}{{ message.content }}{% endif %}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _clean(*args) -> int:
    from lengthscan.cli.main import main

    return main(["clean", *map(str, args), "--quiet", "--no-cache"])


@pytest.mark.parametrize("train_on", ["last", "assistant"])
def test_drop_turns_never_keeps_a_prefix_without_trained_tokens(tmp_path, chat_tok_dir, chat_tok, docs, train_on):
    import pyarrow.parquet as pq
    from datasets import load_from_disk

    template = tmp_path / "content_only.jinja"
    template.write_text(CONTENT_ONLY)
    long = " ".join(docs[:30])
    rows = [
        # the longest fitting prefix ends with an empty reply: with --train-on last it trains nothing,
        # the shorter one ending with "four" is kept; with assistant the longest one trains "four"
        {"id": 0, "messages": [{"role": "user", "content": "two plus two?"}, {"role": "assistant", "content": "four"},
                               {"role": "user", "content": "and?"}, {"role": "assistant", "content": ""},
                               {"role": "user", "content": "explain"}, {"role": "assistant", "content": long}]},
        # the only fitting prefix trains nothing: dropped, with the reason
        {"id": 1, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                               {"role": "user", "content": "explain"}, {"role": "assistant", "content": long}]},
    ]
    text = template.read_text()

    def length(messages):
        return len(chat_tok.apply_chat_template(messages, chat_template=text, tokenize=True,
                                                return_dict=True)["input_ids"])

    limit = length(rows[0]["messages"][:4])
    assert length(rows[1]["messages"][:2]) <= limit < length(rows[1]["messages"][:4])
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out"
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--train-on", train_on, "--limit", f"sequence_tokens<={limit}", "--action", "drop-turns",
                  "--out", out) == 0
    kept, rejects = load_from_disk(out / "dataset"), load_from_disk(out / "rejects")
    assert kept["id"] == [0] and rejects["id"] == [1]
    assert len(kept[0]["messages"]) == (2 if train_on == "last" else 4)
    reason = f"no_trained_tokens (after dropping turns to fit {limit:,} tokens)"
    assert rejects[0]["reason"] == reason
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    assert lengths["completion_tokens_after"][0] > 0
    assert lengths["reason"][1] == reason and any("no trained token" in r for r in lengths["reasons"][1])


def test_drop_turns_on_thousands_of_turns(tmp_path, chat_tok_dir, chat_tok):
    """A conversation of 300 messages is searched exactly (every longer prefix measured: none fits);
    one of 4,000 far over the limit is finished by bisection (noted), in seconds, not minutes."""
    import pyarrow.parquet as pq
    from datasets import load_from_disk

    from lengthscan.measure.chat.prefixes import BISECTED

    template = trl_template("qwen3_training")
    text = template.read_text()

    def length(messages):
        return len(chat_tok.apply_chat_template(messages, chat_template=text, tokenize=True,
                                                return_dict=True)["input_ids"])

    short, huge = _long_conversation(300), _long_conversation(4000)
    limit = length(short[:250])
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": 0, "messages": short}, {"id": 1, "messages": huge}])
    out = tmp_path / "out"
    started = time.monotonic()
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--limit", f"sequence_tokens<={limit}", "--action", "drop-turns", "--out", out) == 0
    assert time.monotonic() - started < 120
    kept = {r["id"]: r["messages"] for r in load_from_disk(out / "dataset")}
    assert sorted(kept) == [0, 1]
    assert len(kept[0]) == 250 and all(length(short[:end]) > limit for end in range(252, 300, 2))
    assert len(kept[1]) == 250 and length(huge[:len(kept[1])]) <= limit  # its prefixes grow: the longest
    reasons = pq.read_table(out / "lengths.parquet").to_pydict()["reasons"]
    assert not any(BISECTED in r for r in reasons[0]) and any(BISECTED in r for r in reasons[1])


def test_tokenize_drops_a_conversation_whose_labels_cannot_be_made(tmp_path, chat_tok_dir, capsys):
    """qwen3's own template drops the reasoning of earlier turns: the trained tokens of a row with
    two assistant turns cannot be counted, so --tokenize cannot write its labels: a reject with its
    reason, never a crash (it was exit 3). (A copy: TRL's own file is swapped for qwen3_training.)"""
    from datasets import load_from_disk

    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nhello"}]
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": turn + turn}, {"messages": turn}])
    done = in_process(capsys, "clean", src, "--tokenizer", chat_tok_dir, "--messages", "messages", "--chat-template",
                      not_trls("qwen3", tmp_path), "--tokenize", "--out", tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    kept = load_from_disk(str(tmp_path / "out" / "dataset"))
    rejects = load_from_disk(str(tmp_path / "out" / "rejects"))
    assert len(kept) == 1 and all(len(r["input_ids"]) == len(r["labels"]) for r in kept)
    assert [(r["row"], r["reason"]) for r in rejects] == [(0, "no_labels")]
