"""Reading a batch's columns as what their role needs (texts, audio values, conversations), and the
checks that name the file and row of a value that is not: ``ColumnError`` (exit code 2)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from lengthscan.sources.scan import Batch
from lengthscan.sources.source import SplitSource, did_you_mean, name_list


class ColumnError(ValueError):
    """A named column is missing or does not hold what its role needs (exit code 2)."""


def column_audio(batch: Batch, column: str, split_src: SplitSource) -> list:
    """Audio values of a column: path strings, raw bytes, or ``{"bytes", "path"}`` dicts (HF Audio)."""
    col = _decoded(batch.table.column(column))
    t = col.type
    if pa.types.is_struct(t) and {"bytes", "path"} <= {t.field(i).name for i in range(t.num_fields)}:
        return col.to_pylist()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_null(t):
        return col.to_pylist()
    valid = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
    if valid.size == 0:
        return [None] * len(col)
    wrong_value(column, split_src, batch, int(valid[0]), col[int(valid[0])].as_py(), str(t),
                 "audio (a path, bytes, or an Audio(decode=False) column)")


def column_values(batch: Batch, column: str) -> list:
    """A column's values as Python objects; a JSON column (datasets' ``arrow.json`` extension, which
    holds values of mixed types as JSON text) decoded."""
    col = batch.table.column(column)
    if getattr(col.type, "extension_name", None) == "arrow.json":
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        return [None if v is None else json.loads(v) for c in chunks for v in c.storage.to_pylist()]
    values = col.to_pylist()
    if _holds_json(col.type):  # e.g. a message's content of mixed strings and part lists: decoded, as datasets does
        values = [_json_decoded(v, col.type) for v in values]
    return values


def _holds_json(t: pa.DataType) -> bool:
    if getattr(t, "extension_name", None) == "arrow.json":
        return True
    return any(_holds_json(t.field(k).type) for k in range(t.num_fields))


def _json_decoded(value, t: pa.DataType):
    """A Python value of Arrow type ``t`` with its ``arrow.json`` parts (JSON text) decoded."""
    if value is None:
        return None
    if getattr(t, "extension_name", None) == "arrow.json":
        return json.loads(value)
    if pa.types.is_struct(t):
        return {f.name: _json_decoded(value.get(f.name), f.type) if _holds_json(f.type) else value.get(f.name)
                for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_json_decoded(v, t.value_type) for v in value]
    return value


def column_texts(batch: Batch, column: str, split_src: SplitSource) -> list:
    """The column's values as Python strings (None kept); anything that is not text is an error."""
    col = _decoded(batch.table.column(column))
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type):
        try:
            return col.to_pylist()
        except UnicodeDecodeError as exc:  # a reader that let bytes through that are not UTF-8
            bad = next(i for i in range(len(col)) if not _decodes(col, i))
            raise ColumnError(f"column {column!r} holds text that is not UTF-8: {where_row(split_src, batch, bad)} "
                              f"({exc.reason} at byte {exc.start}); re-encode the file as UTF-8") from None
    if pa.types.is_string_view(col.type):
        return col.cast(pa.large_string()).to_pylist()
    if getattr(col.type, "extension_name", None) == "arrow.json":
        # datasets stores a JSON column of mixed value types as JSON text: decode, then check
        values = [None if v is None else json.loads(v) for v in col.storage.to_pylist()]
        bad = next((i for i, v in enumerate(values) if v is not None and not isinstance(v, str)), None)
        if bad is None:
            return values
        wrong_value(column, split_src, batch, bad, values[bad], "mixed JSON values", "text")
    valid = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
    if valid.size == 0:
        return [None] * len(col)
    wrong_value(column, split_src, batch, int(valid[0]), col[int(valid[0])].as_py(), str(col.type), "text")


def _decoded(col):
    """A dictionary-encoded column as the values it stands for (text stays text); others as they are."""
    if pa.types.is_dictionary(col.type):
        return col.cast(col.type.value_type)
    return col


def check_utf8(table: pa.Table, rows: np.ndarray, split_src) -> None:
    """Every text column of rows about to be written holds UTF-8 (a reader may let other bytes
    through, and a dataset written with them cannot be loaded): a ColumnError naming the first bad
    row otherwise."""
    for name in table.column_names:
        col = table.column(name)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            continue
        try:
            col.validate(full=True)
        except pa.ArrowInvalid:
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            bad = next(i for i in range(len(col)) if not _decodes(col, i))
            raise ColumnError(f"column {name!r} holds text that is not UTF-8: "
                              f"{where_row(split_src, Batch(rows, table), bad)}; re-encode the file as UTF-8") from None


def _decodes(col, i: int) -> bool:
    try:
        col[i].as_py()
        return True
    except UnicodeDecodeError:
        return False


def where_row(split_src: SplitSource, batch: Batch, i: int) -> str:
    """``row N`` with the file it comes from: ``row N of FILE`` for a source of one file, ``row N
    (FILE, row M of that file)`` for a source of several (a dataset object: ``row N`` alone)."""
    row = int(batch.rows[i])
    where = f"row {row}"
    files, file_rows = split_src.locate(np.asarray([row]))
    if split_src.multi_file:
        where += f" ({files[0]}, row {int(file_rows[0])} of that file)"
    elif files[0]:
        where += f" of {files[0]}"
    return where


def wrong_value(column: str, split_src: SplitSource, batch: Batch, i: int, value, kind: str, wanted: str):
    where = where_row(split_src, batch, i)
    raise ColumnError(f"column {column!r} holds {kind}, not {wanted}: {where} has {type(value).__name__} "
                      f"value {str(value)[:60]!r}")


def identity_field(src, column: str | None, reserved=()) -> pa.Field | None:
    """``--id COL``'s field in ``lengths.parquet``: a column of every split holding a plain value
    (an integer, a string ...), named apart from the lengths file's own columns."""
    if column is None:
        return None
    from lengthscan.sources.features import NotPlain, to_arrow_type

    if column in reserved:
        raise ColumnError(f"--id {column}: lengths.parquet has a column of that name already; name another column")
    kind = None
    for split_src in src.splits:
        if column not in split_src.column_names:
            hint = _columns_hint(column, split_src.column_names)
            raise ColumnError(f"{src.spec}: no column {column!r} for --id; {hint}")
        feature = split_src.parts[0].features().get(column) if split_src.parts else None
        try:
            kind = to_arrow_type(feature)
        except NotPlain:
            kind = None
        if kind is None or pa.types.is_nested(kind):
            raise ColumnError(f"--id {column}: the column holds {feature}, not a plain value (an integer or a string) "
                              "that identifies a row")
    return pa.field(column, kind)


def check_columns(src, fields) -> None:
    """Every named column exists in every file of every split, or a ColumnError naming the file
    and listing the columns it has; a source of no rows at all (a zero-row Parquet file, an empty
    saved dataset) is refused as an empty file is."""
    if src.num_rows == 0:
        raise ColumnError(f"{src.spec}: holds no rows")
    for split_src in src.splits:
        for part in split_src.parts or ():
            have = part.column_names
            for f in fields:
                for column in f.columns:
                    if column not in have:
                        where = part.path if split_src.multi_file and part.path else src.spec
                        where += f" (split {split_src.name})" if src.has_splits else ""
                        flag = dict(f.flags).get(column, f"--{f.role}")
                        raise ColumnError(f"{where}: no column {column!r} for {flag}; {_columns_hint(column, have)}")
    _warn_unnamed_prompt(src, fields)


def _warn_unnamed_prompt(src, fields) -> None:
    """Preference pairs without --prompt, from a source that has a ``prompt`` column: TRL's trainers
    take that column as the prompt (and extract none), so the lengths would not be what they see."""
    pairs = [f for f in fields if f.role == "pair" and "--prompt" not in dict(f.flags).values()]
    if pairs and any("prompt" in split_src.column_names for split_src in src.splits):
        import warnings

        warnings.warn("lengthscan: the source has a 'prompt' column, which TRL's DPOTrainer and RewardTrainer take "
                      "as the prompt; without --prompt the prompt is what extract_prompt finds in chosen and "
                      "rejected: pass --prompt prompt to measure what the trainer sees", stacklevel=3)


def _columns_hint(column: str, have) -> str:
    """What a message on a missing column ends with: the closest column, and those there are."""
    guess = did_you_mean(column, have)
    return (f"did you mean {guess!r}? " if guess else "") + f"columns are: {name_list(have)}"
