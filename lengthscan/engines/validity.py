"""A column that is not what its flag says: every row (or nearly every row) without a length for a
reason of the column's kind (not a conversation, no such audio file, not audio) is exit 2, naming
the column and the first reasons, instead of a report of empty charts over "0 rows over".

``KindCheck`` is a sink of the measuring loop (``engines.loop``): it counts, per field, the rows
measured and those flagged for such a reason, and keeps the first few messages.
"""

from __future__ import annotations

import numpy as np

from lengthscan.measure.columns import ColumnError
from lengthscan.measure.records import (
    FLAG_INVALID_CONVERSATION,
    FLAG_MISSING_FILE,
    FLAG_NAMES,
    FLAG_TEMPLATE_ERROR,
    FLAG_UNREADABLE,
    FLAG_UNSUPPORTED_CONTENT,
)

#: Flags that say a row's value is not of the kind its column was named for.
KIND_FLAGS = (FLAG_INVALID_CONVERSATION, FLAG_TEMPLATE_ERROR, FLAG_UNSUPPORTED_CONTENT, FLAG_MISSING_FILE,
              FLAG_UNREADABLE)
#: The share of measured rows so flagged at which the run stops (exit 2).
INVALID_SHARE = 0.95
#: Reasons quoted in the message.
FIRST_REASONS = 3

_HINTS = {
    "invalid_conversation": "is it the column of conversations (a list of {role, content} messages)?",
    "template_error": "does the chat template fit these conversations (--chat-template)?",
    "unsupported_content": "the first reasons say what the run needs to measure such content:",
    "missing_file": "are the paths relative to another folder than the data file's?",
    "unreadable": "does it hold audio (paths, bytes or an Audio column)?",
}


class KindError(ColumnError):
    """Nearly every row of a column is not of the kind asked for (exit 2)."""


class KindCheck:
    """The measuring loop's sink that refuses a column nearly none of whose rows are of its kind."""

    def __init__(self, fields, *, multi_split: bool = False):
        self.fields, self.multi_split = fields, multi_split
        self.rows = {f.role: 0 for f in fields}
        self.invalid = {f.role: 0 for f in fields}
        self.codes = {f.role: {} for f in fields}
        self.first = {f.role: [] for f in fields}

    def open_split(self, split_src, plan) -> None:
        pass

    def close_split(self, split_src) -> None:
        pass

    def write(self, split_src, batch, measured: dict) -> None:
        for f in self.fields:
            m = measured.get(f.role)
            if m is None:
                continue
            bad = np.isin(m.flags, KIND_FLAGS)
            self.rows[f.role] += int(m.flags.size)
            n = int(bad.sum())
            if not n:
                continue
            self.invalid[f.role] += n
            codes, counts = np.unique(m.flags[bad], return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist()):
                self.codes[f.role][code] = self.codes[f.role].get(code, 0) + count
            first = self.first[f.role]
            for i in np.flatnonzero(bad)[:FIRST_REASONS - len(first)].tolist():
                where = f"split {split_src.name} row {int(batch.rows[i])}" if self.multi_split \
                    else f"row {int(batch.rows[i])}"
                message = m.errors[i] if m.errors is not None and m.errors[i] else FLAG_NAMES[int(m.flags[i])]
                first.append(f"{where}: {message}")

    def check(self) -> None:
        """A ``KindError`` for the first field whose rows are nearly all of another kind."""
        for f in self.fields:
            rows, invalid = self.rows[f.role], self.invalid[f.role]
            if not rows or invalid < INVALID_SHARE * rows:
                continue
            code = max(self.codes[f.role], key=self.codes[f.role].get)
            name = FLAG_NAMES[code]
            share = "every row measured is" if invalid == rows else f"{invalid:,} of {rows:,} rows measured are"
            counts = ", ".join(f"{FLAG_NAMES[c]} {n:,}" for c, n in self.codes[f.role].items())
            counts = f" ({counts})" if len(self.codes[f.role]) > 1 else ""
            raise KindError(f"column {f.column!r} ({flag_of(f)}): {share} {name}{counts}; "
                            f"{_HINTS.get(name, 'is it the right column?')} First reasons: "
                            + "; ".join(self.first[f.role]))


def flag_of(f) -> str:
    """What the field was named by on the command line."""
    return f.kind.named_by(f)
