"""clean's conversation rows: what ``truncate`` and ``drop-turns`` do to them, and their token columns.

* ``truncate`` (as TRL's SFTTrainer slices ``input_ids[:max_length]``): the conversation stays
  whole in ``dataset/`` (the trainer cuts it; a conversation cannot be cut at a token and stay a
  conversation); its lengths after cleaning are those of the first L tokens (the trained tokens
  among them counted exactly), and ``--tokenize`` writes the first L ids and labels. A row whose
  trained tokens all lie past L was already dropped by the decision table (``no_trained_tokens``).
* ``drop-turns``: the longest prefix of the conversation that ends with an assistant message and
  whose rendering, rendered again (templates such as Qwen3's render the last turn differently), is
  within L tokens. Every shorter prefix ending with an assistant message is measured with the same
  template and tools; the system message and tools stay; the ``messages`` column keeps its form
  with the later turns gone. A conversation whose first exchange does not fit is dropped.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from lengthscan.policy.rules import DROP, TRUNCATE, Decisions

#: ``lengths.parquet`` columns of a cleaned conversation (besides ``sequence_tokens_after``).
AFTER = ("completion_tokens", "turns", "final_eot_at")
#: The reason of a conversation whose first exchange alone is over the drop-turns limit.
FIRST_EXCHANGE = "drop-turns: the first exchange does not fit"


def clean_chat(chat, field, table: pa.Table, d: Decisions, final: dict, given: dict | None, *,
               tokenize: bool, raw: dict | None = None) -> tuple[pa.Table, Decisions, dict | None]:
    """Apply ``d``'s truncations and turn drops to one batch of conversation rows.

    Returns the table (conversations cut by turns), the decisions (rows whose first exchange does
    not fit become drops) and, with ``tokenize``, the ids and labels per row (None where dropped).
    ``final`` (measurement -> values) gets the lengths after cleaning. ``raw`` (column -> values:
    a JSON Lines file's conversations as the file holds them) is what is measured; the table's own
    typed column is what is written.
    """
    caps = d.truncate_to.get("chat")
    n = table.num_rows
    cut = np.zeros(n, bool) if d.drop_turns is None else d.drop_turns.copy()
    sliced = (d.decision == TRUNCATE) & ~cut & (caps >= 0) if caps is not None else np.zeros(n, bool)
    ids = list(given["chat"]) if given and given.get("chat") is not None else None
    labels = list(given["chat_labels"]) if given and given.get("chat_labels") is not None else None
    if not (cut.any() or sliced.any() or (tokenize and ids is None)):
        return table, d, ({"ids": ids, "labels": labels} if tokenize else None)
    values = _field_values(field, table, raw)
    if tokenize and ids is None:  # lengths came from a first pass: measure the kept rows with ids now
        keep = np.flatnonzero(d.decision != DROP)
        again = _measure(chat, field, values, keep, with_ids=True)
        ids, labels = [None] * n, [None] * n
        for k, i in enumerate(keep):
            ids[i], labels[i] = again.ids[k], again.labels[k]
    elif sliced.any() and labels is None:  # the trained tokens left after the cut are counted from labels
        rows = np.flatnonzero(sliced)
        again = _measure(chat, field, values, rows, with_ids=True)
        labels = [None] * n
        for k, i in enumerate(rows):
            labels[i] = again.labels[k]
    for i in np.flatnonzero(sliced):
        cap = int(caps[i])
        final["sequence_tokens"][i] = min(cap, final["sequence_tokens"][i])
        if labels is not None and labels[i] is not None:
            trained = int(np.count_nonzero(np.asarray(labels[i][:cap]) != -100))
            final["completion_tokens"][i] = trained
            final["prompt_tokens"][i] = final["sequence_tokens"][i] - trained
        if ids is not None and ids[i] is not None:
            ids[i], labels[i] = ids[i][:cap], labels[i][:cap]
        if final["final_eot_at"][i] >= cap:  # the cut removes the end-of-turn token that closed the last turn
            final["final_eot_at"][i], final["ends_with_eot"][i] = -1, 0
    if cut.any():
        table, d = _drop_turns(chat, field, table, values, d, cut, caps, final, ids, labels)
    return table, d, ({"ids": ids, "labels": labels} if tokenize else None)


def _drop_turns(chat, field, table, values, d, cut, caps, final, ids, labels):
    """Cut the ``cut`` rows to their longest fitting prefix ending with an assistant message."""
    from lengthscan.measure.batch import column_values
    from lengthscan.measure.chat.conversations import Conversation, RowProblem, messages_of

    column = field.column
    source, typed = values[column], column_values(_as_batch(table), column)
    owners, prefixes = [], []
    for i in np.flatnonzero(cut):
        try:  # roles of the normalized messages (ShareGPT's "from" mapped): the cut points
            roles = [m.get("role") for m in messages_of(source[i], Conversation())]
        except RowProblem:
            continue
        ends = [k + 1 for k, role in enumerate(roles) if role == "assistant" and k + 1 < len(roles)]
        for end in ends:
            owners.append((int(i), end))
            prefixes.append(source[i][:end])
    measured = None
    if prefixes:
        columns = {column: prefixes}
        for extra in field.extra:  # the tools of each prefix's row
            columns[extra] = [values[extra][i] for i, _ in owners]
        measured = chat.measure(columns, {s.name: s for s in field.specs}, with_ids=ids is not None)
    best: dict = {}
    shortest: dict = {}
    seq = measured.values[field.primary] if measured is not None else np.zeros(0)
    for k, (i, end) in enumerate(owners):
        length = int(seq[k])
        if length < 0:
            continue
        shortest[i] = min(shortest.get(i, length), length)
        if length <= caps[i] and end > best.get(i, (0, -1))[0]:
            best[i] = (end, k)
    decision, reason, reasons = d.decision.copy(), list(d.reason), [list(r) for r in d.reasons]
    new_values = list(typed)
    for i in np.flatnonzero(cut):
        if i not in best:
            first = shortest.get(i, final["sequence_tokens"][i])
            decision[i], reason[i] = DROP, FIRST_EXCHANGE
            reasons[i].append(f"{FIRST_EXCHANGE}: the first prefix ending with an assistant message is "
                              f"{int(first):,} tokens, over {int(caps[i]):,}")
            continue
        end, k = best[i]
        new_values[i] = typed[i][:end]
        for spec in field.specs:
            final[spec.name][i] = measured.values[spec][k]
        for name in ("trained_from", "final_eot_at", "ends_with_eot"):
            final[name][i] = measured.notes[name][k]
        if ids is not None:
            ids[i], labels[i] = measured.ids[k], measured.labels[k]
    table = _replace_column(table, column, new_values)
    return table, Decisions(decision, reason, reasons, d.truncate_to, d.crop_seconds, cut & (decision != DROP))


def _field_values(field, table: pa.Table, raw: dict | None) -> dict:
    """column -> the field's values of every row of ``table``: ``raw`` where given, else the table's."""
    from lengthscan.measure.batch import column_values

    return {c: raw[c] if raw and c in raw else column_values(_as_batch(table), c) for c in field.columns}


def _measure(chat, field, values: dict, rows, *, with_ids: bool):
    """Measure the conversation rows ``rows`` (positions in ``values``) with the field's template and tools."""
    columns = {c: [v[i] for i in rows] for c, v in values.items()}
    return chat.measure(columns, {s.name: s for s in field.specs}, with_ids=with_ids)


def _as_batch(table: pa.Table):
    from lengthscan.sources.scan import Batch

    return Batch(np.arange(table.num_rows, dtype=np.int64), table)


def _replace_column(table: pa.Table, column: str, values: list) -> pa.Table:
    """``table`` with ``column`` holding ``values``, in the column's own type."""
    position = table.schema.get_field_index(column)
    kind = table.schema.field(column).type
    if getattr(kind, "extension_name", None) == "arrow.json":
        storage = pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values],
                           kind.storage_type)
        array = pa.ExtensionArray.from_storage(kind, storage)
    else:
        array = pa.array(values, kind)
    return table.set_column(position, table.schema.field(column), array)


def token_columns(kept: pa.Table, ids: list, labels: list) -> pa.Table:
    """``input_ids``, ``attention_mask`` and ``labels`` (-100 outside the trained tokens) of the kept rows."""
    from lengthscan.write.token_columns import id_lists

    column, mask = id_lists(ids)
    label_column, _ = id_lists([np.asarray(x, np.int32) for x in labels])
    kept = kept.append_column("input_ids", column)
    kept = kept.append_column("attention_mask", mask)
    return kept.append_column("labels", label_column)
