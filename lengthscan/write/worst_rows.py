"""The longest rows of the source, kept for the report, with their decisions."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from lengthscan.policy.decisions import redacted

#: Longest rows of the source listed in the report, per primary measurement.
WORST_ROWS = 20


#: Characters of a text shown in the report's worst rows.
PREVIEW_CHARS = 160


#: characters of an ``--id`` value shown in the report (lengths.parquet keeps it whole, to join on)
ID_CHARS = 200


def shown_id(value):
    """An ``--id`` value as the report shows it: numbers as they are, anything else as text of at
    most ``ID_CHARS`` characters (a megabyte-long id, or bytes, cannot bloat or break report.json)."""
    if value is None or isinstance(value, (bool, int)) or isinstance(value, float) and math.isfinite(value):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= ID_CHARS else text[:ID_CHARS] + f"… ({len(text):,} characters)"


class WorstRows:
    """The ``WORST_ROWS`` longest rows per field, with a short preview (or the audio path)."""

    def __init__(self, fields, *, redact: bool, identity=None):
        self.fields, self.redact, self.identity = fields, redact, identity  # identity: the --id column's field
        self.best: dict[str, list] = {f.primary.name: [] for f in fields}

    def add(self, split: str, rows, base: dict, d, source: pa.Table, final: dict | None = None) -> None:
        """The batch's longest rows by each field; ``final`` (measurement -> values after truncation,
        cropping or dropped turns) gives a kept row's ``after`` lengths (None for a dropped row)."""
        measures = [s.name for f in self.fields for s in f.specs]
        for f in self.fields:
            values = base[f.primary.name].astype(np.float64)
            values = np.where(values >= 0, values, -np.inf)
            top = np.argsort(-values, kind="stable")[:WORST_ROWS]
            top = [i for i in top if np.isfinite(values[i])]
            if not top:
                continue
            column, names = source.column(f.column), d.names()
            ids = (source.column(self.identity.name) if self.identity is not None and not self.redact
                   and self.identity.name in source.column_names else None)
            for i in top:
                entry = {"split": split, "row": int(rows[i]), "decision": names[i], "reason": d.reason[i],
                         "field": f.primary.name,
                         # the measurements, as the audit lists them (not a conversation's side columns)
                         "lengths": {name: plain_length(v[i]) for name, v in base.items() if name in measures}}
                if ids is not None:
                    entry["id"] = shown_id(ids[int(i)].as_py())
                if final is not None:
                    entry["after"] = None if names[i] == "drop" else {
                        name: plain_length(final[name][i]) for name in measures if name in final}
                if self.redact:
                    entry["reason"] = redacted(entry["reason"])
                else:
                    entry.update(preview_of(f, column[int(i)].as_py()))
                self.best[f.primary.name].append((float(values[i]), -entry["row"], entry))
            self.best[f.primary.name] = sorted(self.best[f.primary.name], key=lambda t: (-t[0], -t[1]))[:WORST_ROWS]

    def merge(self, other: "WorstRows") -> "WorstRows":
        """The longest rows of both (``other`` from another block or worker), ordered as ``add`` orders them."""
        for name, items in other.best.items():
            self.best[name] = sorted(self.best[name] + items, key=lambda t: (-t[0], -t[1]))[:WORST_ROWS]
        return self

    def rows(self) -> list[dict]:
        """The kept rows' report entries, by field, longest first."""
        return [entry for items in self.best.values() for _, _, entry in items]


def preview_of(f, value) -> dict:
    """A row's preview in the report: ``{"audio": path}`` of an audio field, ``{"preview": {column:
    text}}`` of a text (its start) or a conversation (its first turns); empty for anything else."""
    if f.kind.holds_files:
        return {"audio": value.get("path") if isinstance(value, dict) else (
            value if isinstance(value, str) else "<bytes>")}
    if isinstance(value, str):
        return {"preview": {f.column: value[:PREVIEW_CHARS]}}
    if isinstance(value, list):  # a conversation: its first turns
        return {"preview": {f.column: _turns_preview(value)}}
    return {}


def plain_length(v):
    """A measured length as report.json holds it: an int, a float (seconds), None where there is none."""
    if isinstance(v, (float, np.floating)):
        return None if not np.isfinite(v) or v < 0 else float(v)
    return None if v < 0 else int(v)


def _parts_text(content) -> str:
    """A message's content parts as a preview reads them: the text parts' text, ``[image]`` (or the
    part's type) for the others; ``[parts]`` for what is no list of parts."""
    if not isinstance(content, (list, tuple)):
        return "[parts]"
    out = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type", "text") == "text":
            out.append(part["text"])
        elif isinstance(part, dict):
            kind = str(part.get("type") or "part")
            out.append(f"[{'image' if kind == 'image_url' else kind}]")
        else:
            out.append(str(part) if isinstance(part, str) else "[part]")
    return " ".join(out)


def _turns_preview(messages: list) -> str:
    """``role: text | role: text ...`` of a conversation's first messages, ``PREVIEW_CHARS`` at most."""
    parts = []
    for m in messages[:4]:
        if isinstance(m, dict):
            role = m.get("role") or m.get("from") or "?"
            content = m.get("content", m.get("value"))
            parts.append(f"{role}: {content if isinstance(content, str) else _parts_text(content)}"[:80])
    text = " | ".join(parts)
    return text[:PREVIEW_CHARS]
