"""The audit's longest rows: kept while measuring (a sink of the measuring loop, ``WORST_ROWS`` per
measurement, flat memory), then their texts read back for the report's previews.

A clean keeps its worst rows as it writes them (``write.worst_rows``); an audit takes the preview
of a row when it enters the longest, from the batch being measured, and reads rows again
afterwards only where the batch did not hold the column (its lengths came from the cache): by
row group for Parquet, by position for ``datasets`` sources, and one streaming pass (no
tokenizing) for JSON Lines. A remote source is thus never read twice for its previews.
"""

from __future__ import annotations

import numpy as np

from lengthscan.write.worst_rows import WORST_ROWS, plain_length, preview_of, shown_id


class LongestSink:
    """A sink of the measuring loop: the ``WORST_ROWS`` longest rows of each primary measurement,
    with every length of those rows (and ``--id COL``'s value)."""

    def __init__(self, fields, identity=None):
        self.fields, self.identity = fields, identity
        self.best: dict[str, list] = {f.primary.name: [] for f in fields}

    def open_split(self, split_src, plan) -> None:
        """Nothing to do: the longest rows of every split are kept together."""

    def close_split(self, split_src) -> None:
        """Nothing to do."""

    def write(self, split_src, batch, measured: dict) -> None:
        ids = None
        if self.identity is not None and batch.table is not None and self.identity.name in batch.table.column_names:
            ids = batch.table.column(self.identity.name)
        for f in self.fields:
            m = measured.get(f.role)
            if m is None:
                continue
            values = m.values[f.primary].astype(np.float64)
            values = np.where(values >= 0, values, -np.inf)  # no length (-1, NaN): never among the longest
            k = min(WORST_ROWS, values.size)
            top = np.argpartition(-values, k - 1)[:k] if k else []
            items = self.best[f.primary.name]
            at = {}
            for i in top:
                if not np.isfinite(values[i]):
                    continue
                lengths = {spec.name: plain_length(v[i])
                           for role_m in measured.values() for spec, v in role_m.values.items()}
                entry = {"split": split_src.name, "row": int(batch.rows[i]), "field": f.primary.name,
                         "lengths": lengths}
                if ids is not None:
                    entry["id"] = shown_id(ids[int(i)].as_py())
                items.append((float(values[i]), -entry["row"], entry))
                at[id(entry)] = int(i)
            self.best[f.primary.name] = sorted(items, key=lambda t: (-t[0], -t[1]))[:WORST_ROWS]
            if at and batch.table is not None and f.column in batch.table.column_names:
                column = batch.table.column(f.column)
                for _, _, entry in self.best[f.primary.name]:
                    if id(entry) in at:  # a row of this batch among the longest: its preview now
                        entry["_preview"] = preview_of(f, column[at[id(entry)]].as_py())

    def rows(self) -> list[dict]:
        """The longest rows' entries, by measurement, longest first."""
        return [entry for items in self.best.values() for _, _, entry in items]


def with_previews(src, fields, rows: list[dict]) -> list[dict]:
    """``rows`` (``LongestSink.rows()``) with ``preview`` (texts, conversations) or ``audio`` (the
    path): the measured columns of those rows read back from ``src``."""
    from lengthscan.sources.scan import iter_batches

    by_field = {f.primary.name: f for f in fields}
    columns = list(dict.fromkeys(f.column for f in fields))
    for r in rows:
        if "_preview" in r:
            r.update(r.pop("_preview"))
            r["_taken"] = True
    for split_src in src.splits:
        wanted = np.unique([r["row"] for r in rows if r["split"] == split_src.name and not r.get("_taken")]) \
            .astype(np.int64)
        if not wanted.size:
            continue
        values: dict[int, dict] = {}
        for batch in iter_batches(split_src, columns, indices=wanted, batch_rows=len(wanted)):
            table = batch.table
            for k, row in enumerate(batch.rows.tolist()):
                values[row] = {c: table.column(c)[k].as_py() for c in columns}
        for r in rows:
            if r["split"] == split_src.name and r["row"] in values and not r.get("_taken"):
                f = by_field[r["field"]]
                r.update(preview_of(f, values[r["row"]][f.column]))
    for r in rows:
        r.pop("_taken", None)
    return rows

