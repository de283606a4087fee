"""``lengths.parquet``: one row per measured source row, streamed as rows are measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lengthscan.measure.records import FLAG_NAMES
from lengthscan.sources import arrays

#: the field metadata marking ``--id COL``'s column in ``lengths.parquet``
IDENTITY = {b"lengthscan": b"id"}
_FLAG_LOOKUP = np.array([FLAG_NAMES[k] for k in sorted(FLAG_NAMES)], dtype=object)


def lengths_schema(fields, *, with_split: bool, multi_file: bool, bounded=(), identity: pa.Field | None = None
                   ) -> pa.Schema:
    """Columns of ``lengths.parquet`` for these role fields (``measure.batch.RoleField``); ``bounded``
    roles (decide-only mode) also get ``{name}_at_least`` and ``{name}_at_most``; ``identity`` is
    ``--id COL``'s column, carried from the source after ``row``."""
    cols = [pa.field("row", pa.int64())]
    if identity is not None:
        cols.append(pa.field(identity.name, identity.type, metadata=IDENTITY))
    if with_split:
        cols.append(("split", pa.string()))
    if multi_file:
        cols += [("source_file", pa.string()), ("file_row", pa.int64())]
    for f in fields:
        for spec in f.specs:
            cols.append((spec.name, pa.float64() if spec.unit == "seconds" else pa.int64()))
            if f.role in bounded and spec.unit == "tokens":
                cols += [(f"{spec.name}_at_least", pa.int64()), (f"{spec.name}_at_most", pa.int64())]
        cols += [(name, pa.bool_() if kind == "bool" else pa.int64()) for name, kind in f.notes.items()]
        cols += [(f"{f.role}_flag", pa.string()), (f"{f.role}_error", pa.string())]
    return pa.schema(cols)


def lengths_batch(schema: pa.Schema, rows: np.ndarray, *, split: str | None,
                  located: tuple[list[str], np.ndarray] | None, measured: dict, table=None) -> pa.RecordBatch:
    """One batch of ``lengths.parquet`` rows (``schema`` from ``lengths_schema``): ``measured``
    maps role -> ``measure.records.Measured``; ``located`` is (source files, rows in them) or None;
    ``table`` holds the batch's source columns (``--id COL``'s among them)."""
    cols: dict[str, pa.Array] = {"row": arrays.numeric(rows, pa.int64())}
    identity = schema.field(1) if len(schema) > 1 and schema.field(1).metadata == IDENTITY else None
    if identity is not None:
        cols[identity.name] = table.column(identity.name).cast(identity.type)
    if "split" in schema.names:
        cols["split"] = arrays.strings([split] * rows.size)
    if "source_file" in schema.names:
        files, file_rows = located
        cols["source_file"] = arrays.strings(files)
        cols["file_row"] = arrays.numeric(file_rows, pa.int64())
    for role, m in measured.items():
        for spec, values in m.values.items():
            kind = schema.field(spec.name).type
            cols[spec.name] = arrays.numeric(values, kind, mask=~(values >= 0))
            if f"{spec.name}_at_least" in schema.names:
                lo, hi = (m.bounds or {}).get(spec, (np.full(rows.size, -1), np.full(rows.size, -1)))
                cols[f"{spec.name}_at_least"] = arrays.numeric(lo, pa.int64(), mask=lo < 0)
                cols[f"{spec.name}_at_most"] = arrays.numeric(hi, pa.int64(), mask=hi < 0)
        for name, values in (m.notes or {}).items():
            if values.dtype == bool:
                cols[name] = arrays.booleans(values)
            else:
                cols[name] = arrays.numeric(values, pa.int64(), mask=values < 0)
        cols[f"{role}_flag"] = arrays.strings(_FLAG_LOOKUP[m.flags])
        cols[f"{role}_error"] = arrays.strings(m.errors if m.errors is not None else [None] * rows.size)
    return pa.record_batch([cols[n] for n in schema.names], schema=schema)


class LengthsWriter:
    """Streams per-row measurements into a Parquet file."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.schema = schema
        self._writer = pq.ParquetWriter(path, schema)
        self.rows = 0

    def write(self, rows: np.ndarray, *, split: str | None, located: tuple[list[str], np.ndarray] | None,
              measured: dict, table=None) -> None:
        """One batch: ``measured`` maps role -> ``measure.records.Measured``."""
        self._writer.write_batch(lengths_batch(self.schema, rows, split=split, located=located, measured=measured,
                                               table=table))
        self.rows += rows.size

    def close(self) -> None:
        self._writer.close()


class LengthsSink:
    """A sink of the measuring loop (``engines.loop``): every measured batch into a ``LengthsWriter``."""

    def __init__(self, writer: LengthsWriter, *, with_split: bool):
        self.writer, self.with_split = writer, with_split

    def open_split(self, split_src, plan) -> None:
        """Nothing to do: one file holds every split."""

    def write(self, split_src, batch, measured: dict) -> None:
        # every split of a source whose files are listed (a split of one file too, beside one of several)
        located = split_src.locate(batch.rows) if "source_file" in self.writer.schema.names else None
        self.writer.write(batch.rows, split=split_src.name if self.with_split else None, located=located,
                          measured=measured, table=batch.table)

    def close_split(self, split_src) -> None:
        """Nothing to do: the file is closed by its owner."""
