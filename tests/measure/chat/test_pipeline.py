"""Rendering and tokenizing overlapped (``measure/chat/pipeline.py``): a batch rendered a chunk at a
time, each chunk tokenized in a thread while the next renders, gives every value, note, flag, error,
id and label of the same batch measured in one piece, whatever the chunk size and wherever the
rows without a rendering fall."""

from __future__ import annotations

import numpy as np
import pytest

from lengthscan.measure.chat import pipeline
from lengthscan.measure.chat.conversations import ChatFormat
from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
from lengthscan.measure.chat.metrics import chat_specs
from lengthscan.measure.text.counter import TokenCounter
from tests.support.chat import trl_template


def _rows(docs) -> list:
    rows = []
    for i, text in enumerate(docs[:150]):
        if i % 17 == 5:
            rows.append(None)  # missing: no rendering, no view
        elif i % 23 == 7:
            rows.append([{"role": "user", "content": "no reply"}])  # nothing trained
        else:
            rows.append([{"role": "user", "content": text[:300]},
                         {"role": "assistant", "content": text[300:700] or "ok"},
                         {"role": "user", "content": f"and {i}?"},
                         {"role": "assistant", "content": f"answer {i} " * (i % 7 + 1)}])
    return rows


def _measure(chat, specs, rows, with_ids=True):
    m = chat.measure({"messages": rows}, specs, with_ids=with_ids)
    return ({s.metric: v.tolist() for s, v in m.values.items()}, {k: v.tolist() for k, v in m.notes.items()},
            m.flags.tolist(), m.errors, m.ids, m.labels)


@pytest.mark.parametrize("with_ids", [True, False], ids=["ids", "engine"])  # without ids: the engine's offsets
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_a_pipelined_batch_equals_the_batch_in_one_piece(chat_tok_dir, docs, monkeypatch, chunk, with_ids):
    template = trl_template("qwen3_training")
    specs = {s.metric: s for s in chat_specs("messages")}
    rows = _rows(docs)
    whole = ChatCounter(TokenCounter(str(chat_tok_dir)), ChatOptions(ChatFormat(messages="messages"), str(template),
                                                                     "assistant"))
    expected = _measure(whole, specs, rows, with_ids)  # the run's first batch: measured in one piece
    assert whole._renderings.exact is not None  # noqa: SLF001 - later batches are pipelined
    assert whole._renderings.tiled is (None if with_ids else True)  # noqa: SLF001 - and tiled by the engine
    calls = []
    real = pipeline.plan_and_encode
    monkeypatch.setattr("lengthscan.measure.chat.counter.plan_and_encode",
                        lambda n, plan, texts, encode, _rows: calls.append(n) or real(n, plan, texts, encode, chunk))
    got = _measure(whole, specs, rows, with_ids)
    assert calls == [len(rows)]
    assert got == expected
    values, _, flags, *_ = got
    assert sum(f != 0 for f in flags) >= 8 and np.count_nonzero(np.array(values["completion_tokens"]) > 0) > 100
