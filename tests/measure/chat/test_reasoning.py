"""--reasoning: per row, the trained reasoning tokens, the longest reasoning span and the spans the
template drops, against the rendering transformers makes (``apply_chat_template``) tokenized with
the tokenizer's own offsets: a token counts where it overlaps the reasoning text. Qwen3's template
(a copy, so that no training template is swapped in) keeps only the reasoning after the last user
turn, from ``reasoning_content`` or a ``<think>`` block of the content."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.measure.chat.reasoning import reasoning_texts
from lengthscan.report.findings import findings
from tests.support.chat import not_trls, write_jsonl


def _expected(tok, template: str, messages: list, train_on: str) -> tuple[int, int, int]:
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    trained = set(assistants[-1:] if train_on == "last" else assistants)
    total = longest = dropped = cursor = 0
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        for r in reasoning_texts(m):
            pos, needle = text.find(r, cursor), r
            if pos < 0:
                needle = r.strip()
                pos = text.find(needle, cursor)
            if pos < 0:
                dropped += 1
                continue
            start, end = pos, pos + len(needle)
            cursor = end
            tokens = sum(1 for a, b in offsets if a < end and b > start)
            longest = max(longest, tokens)
            total += tokens if k in trained else 0
    return total, longest, dropped


@pytest.mark.parametrize("train_on", ["assistant", "last"])
def test_reasoning_tokens_equal_the_renderings_offsets(tmp_path, chat_tok, chat_tok_dir, docs, train_on):
    template = not_trls("qwen3", tmp_path)
    rows = []
    for k in range(6):
        think = docs[k + 10][:300] or "Let me think."
        turns = [{"role": "user", "content": docs[k][:80] or "Question?"},
                 {"role": "assistant", "content": docs[k + 20][:60] or "Answer.", "reasoning_content": think}]
        if k % 2:  # a second turn: the first turn's reasoning is not rendered
            turns += [{"role": "user", "content": "And then?"},
                      {"role": "assistant", "content": f"<think>\n{docs[k + 30][:200] or 'Hmm.'}\n</think>\n\nDone."}]
        rows.append({"messages": turns})
    rows.append({"messages": [{"role": "user", "content": "No reasoning"}, {"role": "assistant", "content": "Fine."}]})
    src = write_jsonl(tmp_path / "reasoning.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(template), "--messages",
                 "messages", "--reasoning", "--train-on", train_on, "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows):
        assert table["chat_error"][i] is None, table["chat_error"][i]
        got = (table["reasoning_tokens"][i], table["max_reasoning_tokens"][i], table["reasoning_dropped"][i])
        assert got == _expected(chat_tok, template.read_text(), row["messages"], train_on), i
    assert table["reasoning_dropped"][1] == 1 and table["reasoning_tokens"][-1] == 0
    report = json.loads((out / "report.json").read_text())
    assert report["splits"][0]["chat"]["reasoning"]["spans_dropped"] == 3
    assert any("drops 3 reasoning spans" in f for f in findings(report))
    assert "drops 3 reasoning spans" in (out / "report.html").read_text()
