"""A conversation field's measurements as a table, for the length cache: every metric, the side
columns, the flag and the message of each row (the ids of ``--tokenize`` are not kept)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lengthscan.measure.records import Measured
from lengthscan.sources import arrays


def schema(field) -> pa.Schema:
    cols = [(s.name, pa.int64()) for s in field.specs]
    cols += [(name, pa.bool_() if kind == "bool" else pa.int64()) for name, kind in field.notes.items()]
    return pa.schema(cols + [("flag", pa.int8()), ("error", pa.string())])


def to_batch(field, m: Measured) -> pa.RecordBatch:
    """One batch of the cache file from one batch of measurements."""
    cols = [arrays.numeric(m.values[s], pa.int64()) for s in field.specs]
    for name, kind in field.notes.items():
        values = m.notes[name]
        cols.append(arrays.booleans(values) if kind == "bool" else arrays.numeric(values, pa.int64()))
    cols.append(arrays.numeric(m.flags, pa.int8()))
    cols.append(arrays.strings(m.errors if m.errors is not None else [None] * m.rows))
    return pa.record_batch(cols, schema=schema(field))


def from_table(field, table: pa.Table) -> Measured:
    """The measurements of cached rows."""
    values = {s: arrays.to_numpy(table.column(s.name).combine_chunks()).astype(np.int64) for s in field.specs}
    notes = {}
    for name, kind in field.notes.items():
        col = table.column(name).combine_chunks()
        notes[name] = (col.to_numpy(zero_copy_only=False).astype(bool) if kind == "bool"
                       else arrays.to_numpy(col).astype(np.int64))
    flags = arrays.to_numpy(table.column("flag").combine_chunks()).astype(np.int8)
    errors = table.column("error").to_pylist()
    return Measured(values, flags, errors if any(e is not None for e in errors) else None, notes=notes)
