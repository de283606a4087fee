"""--reasoning: per row, the trained reasoning tokens, the longest reasoning span and the spans the
template drops. The oracle is the template's own rule: Qwen3's (TRL's qwen3.jinja, a copy so that no
training template is swapped in) renders an assistant turn's reasoning, from ``reasoning_content``
or a ``<think>`` block of its content, as ``<think>\\n`` + the reasoning + ``\\n</think>`` only after
the last user turn; the expected tokens are those of transformers' rendering whose offsets overlap
the reasoning inside that block. Two turns with the same reasoning, and a dropped reasoning that a
later answer's text holds, must not be taken for one another."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.report.findings import findings
from tests.support.chat import not_trls, write_jsonl


def _qwen3_reasoning(message: dict) -> str:
    """The reasoning Qwen3's template writes for an assistant message ('' if none)."""
    if isinstance(message.get("reasoning_content"), str):
        return message["reasoning_content"].strip("\n")
    content = message.get("content") or ""
    if "</think>" in content:
        return content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return ""


def _expected(tok, template: str, messages: list, train_on: str) -> tuple[int, int, int]:
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    last_user = max(k for k, m in enumerate(messages) if m["role"] == "user")
    assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    trained = set(assistants[-1:] if train_on == "last" else assistants)
    total = longest = dropped = 0
    blocks = iter(i for i in range(len(text)) if text.startswith("<think>\n", i))
    for k in assistants:
        reasoning = _qwen3_reasoning(messages[k])
        if k < last_user:
            dropped += bool(reasoning.strip())
        if k < last_user or not reasoning.strip():
            continue
        start = next(blocks) + len("<think>\n")
        assert text[start:start + len(reasoning)] == reasoning
        tokens = sum(1 for a, b in offsets if a < start + len(reasoning) and b > start)
        longest = max(longest, tokens)
        total += tokens if k in trained else 0
    return total, longest, dropped


def _rows(docs: list[str]) -> list[dict]:
    rows = []
    for k in range(6):
        think = (docs[k + 10][:300] or "Let me think.").strip()
        turns = [{"role": "user", "content": docs[k][:80] or "Question?"},
                 {"role": "assistant", "content": docs[k + 20][:60].strip() or "Answer.", "reasoning_content": think}]
        if k % 2:  # a second turn: the first turn's reasoning is not rendered
            later = (docs[k + 30][:200] or "Hmm.").strip()
            turns += [{"role": "user", "content": "And then?"},
                      {"role": "assistant", "content": f"<think>\n{later}\n</think>\n\nDone."}]
        rows.append({"messages": turns})
    same = "I reason the same way both times."  # the first (dropped) must not match the second (kept)
    rows.append({"messages": [{"role": "user", "content": "A?"}, {"role": "assistant", "content": "a",
                                                                 "reasoning_content": same},
                              {"role": "user", "content": "B?"}, {"role": "assistant", "content": "b",
                                                                 "reasoning_content": same}]})
    rows.append({"messages": [{"role": "user", "content": "C?"}, {"role": "assistant", "content": "c",
                                                                 "reasoning_content": "Okay"},
                              {"role": "user", "content": "D?"}, {"role": "assistant", "content": "Okay, fine."}]})
    rows.append({"messages": [{"role": "user", "content": "No reasoning"}, {"role": "assistant", "content": "Fine."}]})
    return rows


@pytest.mark.parametrize("train_on", ["assistant", "last"])
def test_reasoning_tokens_equal_the_templates_blocks(tmp_path, chat_tok, chat_tok_dir, docs, train_on):
    template = not_trls("qwen3", tmp_path)
    rows = _rows(docs)
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
    assert table["reasoning_dropped"][6] == 1 and table["reasoning_tokens"][6] > 0
    assert table["reasoning_dropped"][7] == 1 and table["reasoning_tokens"][-1] == 0
    report = json.loads((out / "report.json").read_text())
    assert report["splits"][0]["chat"]["reasoning"]["spans_dropped"] == 5
    assert any("drops 5 reasoning spans" in f for f in findings(report))
    assert "drops 5 reasoning spans" in (out / "report.html").read_text()
