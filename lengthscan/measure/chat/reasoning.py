"""Reasoning in conversations (``--reasoning``): how many trained tokens are an assistant turn's
thinking, and which turns' thinking the template drops.

An assistant message's reasoning is its ``reasoning_content`` (DeepSeek-R1, Qwen3), ``thinking``
(gpt-oss) or ``reasoning`` field, and the text of each ``<think>...</think>`` block of its content.
Each is looked for, stripped (then as written), in its own turn of the rendering: after the
content of the user, system or tool message before it and before that of the one after it (an
answer's own text, often short, is found anywhere and bounds nothing). Found, its tokens are the rendering's tokens
overlapping it (the tokenizer's offsets; a tokenizer without them tokenizes it alone); not found,
the template did not render it (Qwen3 keeps only the reasoning after the last user turn) and it
counts in ``reasoning_dropped``. Per row:

* ``reasoning_tokens``: the tokens of the rendered reasoning of trained messages (``--train-on``);
* ``max_reasoning_tokens``: the longest rendered reasoning span's tokens, trained or not;
* ``reasoning_dropped``: reasoning spans the rendering does not hold.

String prompt-completion rows have no messages: 0.
"""

from __future__ import annotations

import re

from lengthscan.measure.chat.encoding import rendered_ids
from lengthscan.measure.chat.media import trained_messages
from lengthscan.measure.chat.ranges import content_spans

#: message fields that hold an assistant turn's reasoning, in the order they are read (the first present)
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
THINK = re.compile(r"<think>(.*?)</think>", re.S)


def reasoning_texts(message: dict) -> list[str]:
    """The reasoning texts of one assistant message (its field, then its content's think blocks)."""
    out = []
    field = next((message[k] for k in REASONING_KEYS if isinstance(message.get(k), str)), None)
    if field and field.strip():
        out.append(field)
    content = message.get("content")
    if isinstance(content, (list, tuple)):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if isinstance(content, str) and "<think>" in content:
        out += [m.group(1) for m in THINK.finditer(content) if m.group(1).strip()]
    return out


def add_reasoning(counter, work: dict, encoded: list, values: dict, notes: dict, train_on: str) -> None:
    """Fill ``reasoning_tokens``, ``max_reasoning_tokens`` and ``reasoning_dropped`` of the measured
    rows of ``work`` (row -> RowPlan; their renderings' views in ``encoded``)."""
    apart, owners = [], []  # spans counted apart (a view without offsets): (row, trained?)
    for i, w in work.items():
        if values["sequence_tokens"][i] < 0:
            continue
        values["reasoning_tokens"][i] = notes["max_reasoning_tokens"][i] = notes["reasoning_dropped"][i] = 0
        if w.conv.text is not None:
            continue
        view = encoded[w.full]
        trained = trained_messages(w.conv, train_on)
        messages = w.conv.messages or []
        # the turn of an assistant message lies between the other roles' contents around it (an
        # answer's own text may be short enough to be found anywhere: it bounds nothing)
        others = [m if m.get("role") != "assistant" else {"role": "assistant"} for m in messages]
        spans = {k: found for k, (_, found) in content_spans(view.text, others).items() if found is not None}
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            cursor = max((spans[j][1] for j in spans if j < k), default=0)
            limit = next((spans[j][0] for j in sorted(spans) if j > k), len(view.text))
            for text in reasoning_texts(message):
                found = _find(view.text, text, cursor, limit)
                if found is None:
                    notes["reasoning_dropped"][i] += 1
                    continue
                start, end = found
                cursor = end
                if view.has_offsets:
                    _add(i, view.overlap(start, end), k in trained, values, notes)
                else:
                    apart.append(view.text[start:end])
                    owners.append((i, k in trained))
    for (i, is_trained), (ids, _) in zip(owners, rendered_ids(counter, apart) if apart else ()):
        _add(i, len(ids), is_trained, values, notes)


def _find(text: str, needle: str, cursor: int, limit: int):
    """The first place of ``needle`` stripped (templates strip the newlines around reasoning; else
    as written) wholly within ``text[cursor:limit]``."""
    for candidate in (needle.strip(), needle):
        if candidate:
            pos = text.find(candidate, cursor, limit)
            if pos >= 0:
                return pos, pos + len(candidate)
    return None


def _add(i: int, tokens: int, trained: bool, values: dict, notes: dict) -> None:
    notes["max_reasoning_tokens"][i] = max(notes["max_reasoning_tokens"][i], tokens)
    if trained:
        values["reasoning_tokens"][i] += tokens
