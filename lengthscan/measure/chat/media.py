"""What images and videos in a conversation share: the tokens an expansion adds where its
message is (the trained side or the prompt side), the renderings with the placeholders replaced
one at a time (an expansion may merge with the text around it), which message each placeholder
belongs to, and refusing a row."""

from __future__ import annotations

from lengthscan.measure.records import FLAG_CODES


def apply_added(i: int, conv, delta: int, added: list, where: list, values: dict, notes: dict, train_on: str) -> None:
    """Row ``i`` (its conversation ``conv``) gains ``delta`` tokens in all, ``added[k]`` of them where
    its k-th placeholder's message ``where[k]`` is: the trained and prompt tokens, where training
    starts and where the last trained token's end-of-turn is move with them."""
    values["sequence_tokens"][i] += delta
    trained = trained_messages(conv, train_on)
    if values["completion_tokens"][i] >= 0:
        in_trained = sum(a for a, m in zip(added, where) if m in trained)
        values["completion_tokens"][i] += in_trained
        values["prompt_tokens"][i] = values["sequence_tokens"][i] - values["completion_tokens"][i]
    if notes["trained_from"][i] >= 0 and trained:
        first = min(trained)
        notes["trained_from"][i] += sum(a for a, m in zip(added, where) if 0 <= m < first)
    if notes["final_eot_at"][i] >= 0 and trained:
        last = max(trained)
        notes["final_eot_at"][i] += sum(a for a, m in zip(added, where) if 0 <= m <= last)


def stepped(text: str, placeholder: str, written: list[str]) -> list[str]:
    """``text`` with none, the first, the first two, ... of its placeholders replaced by
    ``written`` (the processor replaces the i-th placeholder by the i-th expansion)."""
    pieces = text.split(placeholder)
    out = []
    for k in range(len(written) + 1):
        parts = [pieces[0]]
        for j, piece in enumerate(pieces[1:]):
            parts.append(written[j] if j < k else placeholder)
            parts.append(piece)
        out.append("".join(parts))
    return out


def stepped_added(counter, steps: dict, rows: list) -> list[tuple[int, list]]:
    """Tokenize ``steps`` (plain row? -> the stepped renderings of ``rows``' items, in order) and
    give per row (its whole delta, each item's tokens added in context): ``rows`` is a list of
    (plain row?, the number of its items)."""
    from lengthscan.measure.chat.encoding import rendered_ids

    lengths = {False: iter([len(ids) for ids, _ in rendered_ids(counter, steps[False])]) if steps[False] else None,
               True: iter([len(ids) for ids in counter.ids(steps[True], "input")]) if steps[True] else None}
    out = []
    for is_plain, n in rows:
        counts = [next(lengths[is_plain]) for _ in range(n + 1)]
        out.append((counts[-1] - counts[0], [b - a for a, b in zip(counts, counts[1:])]))  # an expansion may merge
    return out


def placed_messages(conv, n: int, placeholder: str, parts_at: list | None) -> list[int]:
    """Per media item, the index of its message: its part's (``parts_at``), or the message whose
    text writes its placeholder (-1: not known)."""
    if parts_at is not None:
        return list(parts_at)
    if conv.text is not None:  # string prompt-completion: the prompt is 0, the completion 1
        before = conv.text[0].count(placeholder)
        return [0] * before + [1] * (n - before)
    where = []
    for k, m in enumerate(conv.messages or []):
        content = m.get("content")
        texts = [content] if isinstance(content, str) else [p.get("text") for p in content or ()
                                                             if isinstance(p, dict) and isinstance(p.get("text"), str)]
        where += [k] * sum(t.count(placeholder) for t in texts)
    return where if len(where) == n else [-1] * n


def trained_messages(conv, train_on: str) -> set[int]:
    """The indices of the messages whose tokens are trained."""
    msgs = conv.messages or []
    if conv.text is not None:
        return {0, 1} if train_on == "all" else {1}
    if train_on == "all":
        return set(range(len(msgs)))
    if conv.split_at is not None:
        return set(range(conv.split_at, len(msgs)))
    assistant = [k for k, m in enumerate(msgs) if m.get("role") == "assistant"]
    if train_on == "last":
        return set(assistant[-1:])
    return set(assistant)


def refuse_unread(i: int, found: list, problem_type, noun: str, values: dict, flags, errors: list) -> bool:
    """Refuse row ``i`` where one of its media items ``found`` (headers read, or a ``problem_type``
    saying why not) is a problem, naming the first; whether it was refused."""
    bad = next((k for k, item in enumerate(found) if isinstance(item, problem_type)), None)
    if bad is None:
        return False
    problem = found[bad]
    refuse(i, values, FLAG_CODES[problem.flag], f"{noun} {bad + 1} of {len(found)}: {problem.reason}", flags, errors)
    return True


def refuse(i: int, values: dict, code: int, reason: str, flags, errors: list) -> None:
    """Row ``i`` gets no measurements, and ``reason``."""
    for v in values.values():
        v[i] = -1
    flags[i], errors[i] = code, reason
