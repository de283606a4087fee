"""Conversations with ``--num-proc``: worker processes that hold no tokenizer (``engines/chat_pool.py``,
``measure/chat/apart.py``). Once the parent has proven the count-only engine's offsets on the run's
first renderings, a worker measures whole batches; before that, or where a batch holds a text the
engine leaves to the tokenizer, it renders them and the parent tokenizes. Every row as in one process."""

from __future__ import annotations

import pickle
import re
import time

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.measure.chat.apart import BatchJob, NeedsTokenizer, Rendered, TiledCounter
from lengthscan.measure.chat.conversations import ChatFormat
from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
from lengthscan.measure.chat.metrics import chat_specs
from lengthscan.measure.text.counter import TokenCounter
from tests.support.chat import conversations, trl_template, write_jsonl


@pytest.fixture(scope="module")
def rows(docs):
    return conversations(docs, 120, seed=5)


def _audit(tmp_path, name, src, tok, **extra) -> tuple[dict, dict]:
    import lengthscan

    out = tmp_path / name
    result = lengthscan.audit(str(src), tokenizer=str(tok), messages="messages", tools="tools",
                              chat_template=str(trl_template("qwen3_training")), full=True, cache=False,
                              batch_rows=8, out=str(out), **extra)
    return pq.read_table(out / "lengths.parquet").to_pydict(), result.to_dict()


def test_workers_measure_whole_batches_as_one_process_does(tmp_path, chat_tok_dir, rows, monkeypatch):
    """The first run (a fresh home: the engine proven in the prover process, the offsets checked
    on the first renderings) and a later one: every row's values, flags, reasons and side columns
    equal one process's; most batches were measured whole by the worker."""
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    for run in ("first", "later"):
        two, report = _audit(tmp_path, f"two-{run}", src, chat_tok_dir, num_proc=2)
        one, _ = _audit(tmp_path, f"one-{run}", src, chat_tok_dir)
        assert two == one, run
        shared = report["chat"]["processes"]
        assert shared["processes"] == 2
        batches = -(-len(rows) // 8)
        assert shared["measured_here"] + shared["measured_by_workers"] + shared["rendered_by_workers"] == batches
        assert shared["measured_by_workers"] >= 3, shared  # the worker tokenized by the engine, not only rendered
        assert report["chat"]["token_offsets"].startswith("count-only engine")


def test_a_batch_the_engine_leaves_to_the_tokenizer_comes_back_rendered(chat_tok_dir, rows, tmp_path, monkeypatch):
    """A worker's counter holds the engine, no tokenizer: a NUL (a text the engine leaves to the
    tokenizer) makes its batch come back rendered; the parent tokenizes it, equal to measuring it
    here. A batch without one comes back measured, equal too."""
    from lengthscan.measure.text import handle

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    specs = {s.name: s for s in chat_specs("messages")}
    chat = ChatCounter(TokenCounter(str(chat_tok_dir)), ChatOptions(ChatFormat(messages="messages"),
                                                                   trl_template("qwen3_training")))
    plain = [r["messages"] for r in rows[:40]]
    assert chat.light() is None  # nothing proven yet
    chat.measure({"messages": plain[:20]}, specs)  # the run's first batch: the engine's offsets checked
    light = chat.light()
    assert isinstance(light.counter, TiledCounter)
    path = tmp_path / "light.pickle"
    path.write_bytes(pickle.dumps(light))

    def refuse(self):
        raise AssertionError("the worker's counter loaded the tokenizer")

    with monkeypatch.context() as m:
        m.setattr(handle.TokenizerHandle, "_load", refuse)
        measured = BatchJob("chat", {"messages": plain[20:]}, specs, chat.render_spec(), str(path))()["chat"]
    want = chat.measure({"messages": plain[20:]}, specs)
    assert _values(measured) == _values(want)

    thinking = [[{"role": "user", "content": f"q {k}"},  # the template moves the reasoning: tokenized apart
                 {"role": "assistant", "content": f"<think>step {k} of the reasoning</think>answer {k}"},
                 {"role": "user", "content": "and?"}, {"role": "assistant", "content": "done"}] for k in range(6)]
    light_copy = pickle.loads(path.read_bytes())
    assert _values(light_copy.measure({"messages": thinking}, specs)) == \
        _values(chat.measure({"messages": thinking}, specs))

    nul = [[{"role": "user", "content": "a NUL \x00 here"}, {"role": "assistant", "content": "fine"}]] + plain[20:30]
    with pytest.raises(NeedsTokenizer):
        pickle.loads(path.read_bytes()).measure({"messages": nul}, specs)
    rendered = BatchJob("chat", {"messages": nul}, specs, chat.render_spec(), str(path))()["chat"]
    assert isinstance(rendered, list) and all(isinstance(r, Rendered) for r in rendered)
    assert all(w.conv is None for r in rendered for w in r.work.values())  # not sent back: the parent has them
    got = chat.measure({"messages": nul}, specs, rendered=rendered)
    assert _values(got) == _values(chat.measure({"messages": nul}, specs))
    assert got.values[specs["sequence_tokens"]][0] > 0


def _values(m) -> tuple:
    return ({s.name: v.tolist() for s, v in m.values.items()}, {k: v.tolist() for k, v in m.notes.items()},
            m.flags.tolist(), m.errors)


def test_a_template_that_loops_stops_a_run_with_workers(tmp_path, chat_tok_dir, capsys, monkeypatch):
    """Exit 2 and the one line, whichever process met the slow rows; the worker is stopped, not
    waited for."""
    from lengthscan.measure.chat import template

    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    loops = tmp_path / "loops.jinja"
    loops.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": f"hi {i}"},
                                                           {"role": "assistant", "content": "yo"}]}
                                             for i in range(1200)])
    started = time.monotonic()
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(loops), "--full", "--quiet", "--no-cache", "--num-proc", "2"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"lengthscan: error: the chat template ran past 0\.3 s on \d rows \(a template that loops\?\): "
                        r"fix the template\n", err), err
    assert time.monotonic() - started < 30


def test_many_conversations_use_the_cores_by_default(tmp_path, chat_tok_dir, monkeypatch):
    """Without ``num_proc``: 2,000 conversations or more are shared with worker processes (one per
    core, at most 4; the same rows as ``num_proc=1``); fewer stay in one process."""
    import os

    import lengthscan
    from lengthscan.engines.loop import AUTO_PROCESSES, AUTO_ROWS

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    rows = [{"messages": [{"role": "user", "content": f"question {i} " * (i % 9 + 1)},
                          {"role": "assistant", "content": f"answer {i} " * (i % 13 + 1)}]} for i in range(AUTO_ROWS)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    kw = dict(tokenizer=str(chat_tok_dir), messages="messages", chat_template=str(trl_template("qwen3_training")),
              full=True, cache=False)
    auto = lengthscan.audit(str(src), out=str(tmp_path / "auto"), **kw)
    one = lengthscan.audit(str(src), out=str(tmp_path / "one"), num_proc=1, **kw)
    cores = min(AUTO_PROCESSES, len(os.sched_getaffinity(0)))
    assert auto.to_dict()["chat"].get("processes", {}).get("processes", 1) == cores
    assert "processes" not in one.to_dict()["chat"]
    lengths = [pq.read_table(tmp_path / name / "lengths.parquet") for name in ("auto", "one")]
    assert lengths[0].equals(lengths[1])
    small = write_jsonl(tmp_path / "small.jsonl", rows[:AUTO_ROWS - 1])
    assert "processes" not in lengthscan.audit(str(small), **kw).to_dict()["chat"]


def test_workers_that_cannot_start_leave_the_run_to_this_process(tmp_path, chat_tok_dir, rows, monkeypatch):
    """No Python to start (a process limit, no memory: an OSError): one warning, the rows measured
    here, as in one process."""
    import sys

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    one, _ = _audit(tmp_path, "one", src, chat_tok_dir, num_proc=1)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.warns(RuntimeWarning, match="worker processes stopped .*no-such-python"):
        two, report = _audit(tmp_path, "two", src, chat_tok_dir, num_proc=2)
    assert two == one
    assert report["chat"]["processes"]["measured_here"] == -(-len(rows) // 8)


def test_a_worker_that_dies_leaves_its_batches_to_this_process(tmp_path, chat_tok_dir, rows, monkeypatch):
    """A worker ended by the kernel (here: ``os._exit`` in its renderer, on one row): one warning,
    its batch and the rest measured here, every row as in one process."""
    from tests.support.workers import DyingRenderer

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    die = {"messages": [{"role": "user", "content": "die"}, {"role": "assistant", "content": "ok"}]}
    dying = [r for k, row in enumerate(rows[:80]) for r in ([die, row] if k % 8 == 7 else [row])]  # in every batch
    src = write_jsonl(tmp_path / "chat.jsonl", dying)
    one, _ = _audit(tmp_path, "one", src, chat_tok_dir, num_proc=1)
    real = ChatCounter.render_spec

    def spec_that_dies(self):  # the workers render only, with a renderer that ends them on "die"
        spec = real(self)
        renderer = DyingRenderer(spec.renderer.template, spec.renderer.special_tokens,
                                 seconds=spec.renderer.seconds, max_chars=spec.renderer.max_chars)
        return type(spec)(spec.fmt, renderer, spec.train_on, spec.max_chars, spec.eos, spec.max_timeouts)

    monkeypatch.setattr(ChatCounter, "render_spec", spec_that_dies)
    monkeypatch.setattr(ChatCounter, "light", lambda self: None)
    with pytest.warns(RuntimeWarning, match="worker processes stopped .*exit status 9"):
        two, report = _audit(tmp_path, "two", src, chat_tok_dir, num_proc=2)
    assert two == one
    assert report["chat"]["processes"]["measured_here"] > 1


def test_rows_out_of_time_in_workers_count_with_this_processs(tmp_path, chat_tok_dir, monkeypatch):
    """Three rows whose rendering runs out of time stop the run (exit 2), however they fall among
    the processes: a worker's count is added to this process's."""
    from lengthscan.measure.chat import template

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    slow = tmp_path / "slow.jinja"
    slow.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if messages[0].content == 'slow' %}{% for i in range(100000) %}{% for j in range(100000) %}"
                    "{% endfor %}{% endfor %}{% endif %}")
    rows = [{"messages": [{"role": "user", "content": "slow" if i in (50, 350, 550) else f"hi {i}"},
                          {"role": "assistant", "content": "yo"}]} for i in range(600)]
    src = write_jsonl(tmp_path / "c.jsonl", rows)  # one slow row in the first batch (measured here), two after
    import lengthscan
    from lengthscan.measure.chat.template import ChatTemplateError

    with pytest.raises(ChatTemplateError, match=r"ran past 0\.3 s on 3 rows"):
        lengthscan.audit(str(src), tokenizer=str(chat_tok_dir), messages="messages", chat_template=str(slow),
                         full=True, cache=False, batch_rows=100, num_proc=2)


def test_workers_started_as_the_run_begins_are_taken_or_stopped(tmp_path, chat_tok_dir, monkeypatch):
    """A large enough local file of conversations: the workers start before the tokenizer loads
    and measure the split (the same rows as one process); where the run fails first (a column that
    is not there: exit 2), they are stopped, none left behind."""
    from lengthscan.engines import chat_pool

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    rows = [{"messages": [{"role": "user", "content": f"question {i} " * 60},
                          {"role": "assistant", "content": f"answer {i} " * 80}]} for i in range(600)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    assert src.stat().st_size >= chat_pool.EARLY_BYTES
    started, taken = [], []
    early, take = chat_pool.Early.__init__, chat_pool.Early.take

    def spy_init(self, processes):
        early(self, processes)
        started.append((self, [w.proc for w in self.pool._workers]))  # noqa: SLF001 - the processes themselves

    def spy_take(self, processes):
        taken.append(take(self, processes))
        return taken[-1]

    monkeypatch.setattr(chat_pool.Early, "__init__", spy_init)
    monkeypatch.setattr(chat_pool.Early, "take", spy_take)
    template = str(trl_template("qwen3_training"))
    args = ["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", template, "--full", "--quiet",
            "--no-cache"]
    assert main([*args, "--messages", "messages", "--num-proc", "2", "--out", str(tmp_path / "two")]) == 0
    assert len(started) == 1 and started[0][0].processes == 1 and taken[0] is not None
    assert main([*args, "--messages", "messages", "--num-proc", "1", "--out", str(tmp_path / "one")]) == 0
    assert len(started) == 1  # one process: none started
    two, one = (pq.read_table(tmp_path / name / "lengths.parquet") for name in ("two", "one"))
    assert two.equals(one)
    assert main([*args, "--messages", "no_such_column", "--num-proc", "2", "--out", str(tmp_path / "bad")]) == 2
    assert len(started) == 2 and len(taken) == 1  # the failed run's never taken, then stopped
    assert started[1][1] and all(p.poll() is not None for p in started[1][1])
