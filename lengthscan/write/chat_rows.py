"""clean's conversation rows: what ``truncate`` and ``drop-turns`` do to them, and their token columns.

* ``truncate`` (as TRL's SFTTrainer slices ``input_ids[:max_length]``): the conversation stays
  whole in ``dataset/`` (the trainer cuts it; a conversation cannot be cut at a token and stay a
  conversation); its lengths after cleaning are those of the first L tokens (the trained tokens
  among them counted exactly), and ``--tokenize`` writes the first L ids and labels. A row whose
  trained tokens all lie past L was already dropped by the decision table (``no_trained_tokens``).
* ``drop-turns``: the longest prefix of the conversation that ends with an assistant message and
  whose rendering, rendered again (templates such as Qwen3's render the last turn differently), is
  within L tokens. The prefixes ending with an assistant message are measured with the same
  template and tools; the system message and tools stay; the ``messages`` column keeps its form
  with the later turns gone. A conversation whose first exchange does not fit is dropped. The kept
  prefix has a trained token (``completion_tokens`` > 0, or no count where the template rewrites
  earlier turns): a fitting prefix with none is passed over for a shorter one, and a conversation
  whose every fitting prefix has none is dropped (``no_trained_tokens (after dropping turns ...)``),
  unless ``--keep-empty-targets``. The search (``measure.chat.prefixes``) goes from the longest
  prefix down and never renders the prefixes shorter than the one kept; a conversation of
  thousands of turns far over the limit is finished by bisection, noted in its reasons.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from lengthscan.policy.rules import DROP, TRUNCATE, Decisions

#: The reason of a conversation whose first exchange alone is over the drop-turns limit.
FIRST_EXCHANGE = "drop-turns: the first exchange does not fit"


def clean_chat(chat, field, table: pa.Table, d: Decisions, final: dict, given: dict | None, *,
               tokenize: bool, raw: dict | None = None, keep_empty_targets: bool = False
               ) -> tuple[pa.Table, Decisions, dict | None]:
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
        if tokenize:
            d = _unlabelled(d, ids, labels)
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
        table, d = _drop_turns(chat, field, table, values, d, cut, caps, final, ids, labels, keep_empty_targets)
    if tokenize:
        d = _unlabelled(d, ids, labels)
    return table, d, ({"ids": ids, "labels": labels} if tokenize else None)


def _unlabelled(d: Decisions, ids, labels) -> Decisions:
    """With ``--tokenize``, a kept conversation whose tokens or labels could not be made (a template
    that renders earlier turns differently as the conversation grows, a rendering past the per-turn
    budget: no trained-token count) is dropped with its reason: labels cannot be written exactly."""
    missing = [i for i in np.flatnonzero(d.decision != DROP)
               if ids is None or labels is None or ids[i] is None or labels[i] is None]
    if not missing:
        return d
    decision, reason, reasons = d.decision.copy(), list(d.reason), [list(r) for r in d.reasons]
    for i in missing:
        decision[i], reason[i] = DROP, "no_labels"
        reasons[i].append("no_labels: --tokenize cannot write this conversation's labels (its trained tokens "
                          "could not be counted exactly: see the row's measurement note)")
    drop_turns = None if d.drop_turns is None else d.drop_turns & (decision != DROP)
    return Decisions(decision, reason, reasons, d.truncate_to, d.crop_seconds, drop_turns)


def _drop_turns(chat, field, table, values, d, cut, caps, final, ids, labels, keep_empty: bool):
    """Cut the ``cut`` rows to their longest fitting prefix ending with an assistant message (one
    with a trained token unless ``keep_empty``)."""
    from lengthscan.measure.chat.conversations import Conversation, RowProblem, messages_of
    from lengthscan.measure.chat.prefixes import PrefixSearch

    column = field.column
    source = values[column]
    ends: dict = {}
    for i in np.flatnonzero(cut):
        try:  # roles of the normalized messages (ShareGPT's "from" mapped): the cut points
            roles = [m.get("role") for m in messages_of(source[i], Conversation())]
        except RowProblem:
            continue
        ends[int(i)] = [k + 1 for k, role in enumerate(roles) if role == "assistant" and k + 1 < len(roles)]
    search = PrefixSearch(chat, field, values, caps, keep_empty, with_ids=ids is not None)
    found = search.run(ends)
    decision, reason, reasons = d.decision.copy(), list(d.reason), [list(r) for r in d.reasons]
    kept_messages: dict = {}
    for i in np.flatnonzero(cut):
        cap = int(caps[i])
        if i not in found:
            why, detail = search.failure(int(i), cap, final["sequence_tokens"][i], FIRST_EXCHANGE)
            decision[i], reason[i] = DROP, why
            reasons[i].append(detail)
            continue
        end, measured, k = found[i]
        if search.note(int(i)):
            reasons[i].append(search.note(int(i)))
        kept_messages[int(i)] = end
        for spec in field.specs:
            final[spec.name][i] = measured.values[spec][k]
        for name in ("trained_from", "final_eot_at", "ends_with_eot"):
            final[name][i] = measured.notes[name][k]
        if ids is not None:
            ids[i], labels[i] = measured.ids[k], measured.labels[k]
    table = _first_messages(table, column, kept_messages)
    return table, Decisions(decision, reason, reasons, d.truncate_to, d.crop_seconds, cut & (decision != DROP))


def _field_values(field, table: pa.Table, raw: dict | None) -> dict:
    """column -> the field's values of every row of ``table``: ``raw`` where given, else the table's."""
    from lengthscan.measure.columns import column_values

    return {c: raw[c] if raw and c in raw else column_values(_as_batch(table), c) for c in field.columns}


def _measure(chat, field, values: dict, rows, *, with_ids: bool):
    """Measure the conversation rows ``rows`` (positions in ``values``) with the field's template and tools."""
    columns = {c: [v[i] for i in rows] for c, v in values.items()}
    return chat.measure(columns, {s.name: s for s in field.specs}, with_ids=with_ids)


def _as_batch(table: pa.Table):
    from lengthscan.sources.scan import Batch

    return Batch(np.arange(table.num_rows, dtype=np.int64), table)


def _first_messages(table: pa.Table, column: str, ends: dict) -> pa.Table:
    """``table`` with row i of the list ``column`` cut to its first ``ends[i]`` messages, in the
    column's own type (cut in Arrow: a message's values, e.g. datasets' ``Json`` content of mixed
    strings and part lists, are written as they were read)."""
    if not ends:
        return table
    position = table.schema.get_field_index(column)
    field = table.schema.field(column)
    col = table.column(column).combine_chunks() if table.num_rows else pa.array([], field.type)
    if getattr(field.type, "extension_name", None) == "arrow.json":  # the whole list held as JSON text
        texts = col.storage.to_pylist()
        for i, end in ends.items():
            texts[i] = json.dumps(json.loads(texts[i])[:end], ensure_ascii=False)
        array = pa.ExtensionArray.from_storage(field.type, pa.array(texts, field.type.storage_type))
        return table.set_column(position, field, array)
    offsets = col.offsets.to_numpy().astype(np.int64)  # a list array; its offsets past any slice
    starts, stops = offsets[:-1], offsets[1:].copy()
    for i, end in ends.items():
        stops[i] = min(stops[i], starts[i] + end)
    lengths = np.where(col.is_valid().to_numpy(zero_copy_only=False), stops - starts, 0)
    new_offsets = np.concatenate([[0], np.cumsum(lengths)])
    take = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    values = col.values.take(pa.array(take, pa.int64()))
    kind = pa.LargeListArray if pa.types.is_large_list(field.type) else pa.ListArray
    offset_type = pa.int64() if kind is pa.LargeListArray else pa.int32()
    array = kind.from_arrays(pa.array(new_offsets, offset_type), values, type=field.type, mask=col.is_null())
    return table.set_column(position, field, array)


def token_columns(kept: pa.Table, ids: list, labels: list) -> pa.Table:
    """``input_ids``, ``attention_mask`` and ``labels`` (-100 outside the trained tokens) of the kept rows."""
    from lengthscan.write.token_columns import id_lists

    column, mask = id_lists(ids)
    label_column, _ = id_lists([np.asarray(x, np.int32) for x in labels])
    kept = kept.append_column("input_ids", column)
    kept = kept.append_column("attention_mask", mask)
    return kept.append_column("labels", label_column)
