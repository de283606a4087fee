"""The measure step: one Arrow record batch in, per-role measurements out.

Text columns are counted by ``TokenCounter``; audio columns are measured from file headers by
``audio/durations.py`` (seconds), then converted by arithmetic to samples at the model's rate and to the
model's frames. Values that are not what the column should hold raise ``ColumnError`` naming the
row; files that cannot be read are recorded per row with their reason, and the audit goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lengthscan.measure.records import FLAG_CODES, FLAG_TOO_LONG, MEASURED_FLAGS, FieldSpec, Measured
from lengthscan.sources.scan import Batch
from lengthscan.sources.source import SplitLayout, SplitSource, did_you_mean, name_list

if TYPE_CHECKING:
    from lengthscan.measure.audio.durations import FrameRule
    from lengthscan.measure.chat.counter import ChatCounter
    from lengthscan.measure.text.counter import TokenCounter


class ColumnError(ValueError):
    """A named column is missing or does not hold what its role needs (exit code 2)."""


@dataclass(frozen=True)
class AudioSettings:
    """How audio becomes samples and frames: the model's sampling rate and frame rule, if known."""

    sampling_rate: int | None = None
    frame_rule: FrameRule | None = None

    def units(self) -> tuple[str, ...]:
        units = ["seconds"]
        if self.sampling_rate:
            units.append("samples")
            if self.frame_rule is not None:
                units.append("frames")
        return tuple(units)


@dataclass(frozen=True)
class RoleField:
    """One role's column, its kind, and the measurements taken of it."""

    role: str
    column: str
    kind: str  # "text", "audio" or "chat"
    specs: tuple[FieldSpec, ...]
    extra: tuple[str, ...] = ()  # other columns read with it (chat: completion, tools)
    flags: tuple[tuple[str, str], ...] = ()  # (column, the option that named it) where not --{role}

    @property
    def primary(self) -> FieldSpec:
        return self.specs[0]

    @property
    def vision(self) -> bool:
        """A conversation field whose images are counted."""
        return any(s.metric == "image_tokens" for s in self.specs)

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column, *self.extra)

    @property
    def notes(self) -> dict:
        """Per-row side columns (name -> Arrow type name) this field writes to lengths.parquet."""
        if self.kind != "chat":
            return {}
        from lengthscan.measure.chat.metrics import chat_notes

        return chat_notes(self.vision)


def role_fields(*, input: str | None = None, target: str | None = None, audio: str | None = None,
                audio_settings: AudioSettings = AudioSettings(), chat=None) -> tuple[RoleField, ...]:
    """The measured fields for ``--input``/``--audio`` and ``--target`` column names, or for a
    conversation (``chat``: a ``measure.chat.conversations.ChatFormat``)."""
    if input and audio:
        raise ColumnError("give the input as text (--input) or as audio (--audio), not both")
    if chat is not None:
        if input or audio or target:
            raise ColumnError("give conversations (--messages, or --prompt with --completion) or text and audio "
                              "columns (--input, --target, --audio), not both")
        from lengthscan.measure.chat.metrics import chat_specs

        extra = tuple(c for c in chat.columns if c != chat.column)
        named = (("--images", chat.images), ("--tools", chat.tools), ("--completion", chat.completion),
                 ("--prompt", chat.prompt), ("--messages", chat.messages))  # the first option naming it last
        flags = tuple(dict((column, flag) for flag, column in named if column).items())
        return (RoleField("chat", chat.column, "chat", chat_specs(chat.column, chat.vision), extra, flags),)
    fields = []
    if input:
        fields.append(RoleField("input", input, "text", (FieldSpec("input", input, "tokens"),)))
    if audio:
        specs = tuple(FieldSpec("input", audio, u) for u in audio_settings.units())
        fields.append(RoleField("input", audio, "audio", specs, flags=((audio, "--audio"),)))
    if target:
        fields.append(RoleField("target", target, "text", (FieldSpec("target", target, "tokens"),)))
    if not fields:
        raise ColumnError("name at least one column: --input COL (text) or --audio COL, and/or --target COL")
    return tuple(fields)


def measure_batch(batch: Batch, fields: tuple[RoleField, ...], split_src: SplitSource | SplitLayout, *,
                  counter: TokenCounter | None = None, audio: AudioSettings = AudioSettings(),
                  decide_caps: dict[str, int] | None = None, with_ids: bool = False,
                  chat: ChatCounter | None = None) -> dict[str, Measured]:
    """Measure every field of ``batch``: role -> ``Measured``.

    ``split_src`` is a ``SplitSource`` or its picklable ``SplitLayout`` (for error messages and
    relative audio paths). ``decide_caps`` (role -> upper token limit) turns on decide-only
    counting for those roles: rows proven within or over the limit keep a bound, not a length.
    ``with_ids`` keeps the token ids of text roles (``Measured.ids``).
    """
    out = {}
    for f in fields:
        if f.kind == "chat":
            columns = {c: batch.raw[c] if batch.raw and c in batch.raw else column_values(batch, c)
                       for c in f.columns}
            out[f.role] = chat.measure(columns, {s.name: s for s in f.specs}, with_ids=with_ids,
                                       base_dir=split_src.base_dir(batch.rows))
        elif f.kind == "text":
            texts = column_texts(batch, f.column, split_src)
            limit = (decide_caps or {}).get(f.role)
            bounds = ids = None
            try:
                if with_ids:
                    lengths, flags, ids = counter.count_ids(texts, f.role)
                elif limit is None:
                    lengths, flags = counter.count(texts, f.role)
                else:
                    lengths, flags, at_least, at_most = counter.decide_count(texts, f.role, limit)
                    bounds = {f.primary: (at_least, at_most)}
            except TypeError as exc:  # a non-string that slipped past the type check
                raise ColumnError(f"column {f.column!r}: {exc}") from None
            errors = None
            if (flags == FLAG_TOO_LONG).any():
                errors = [f"longer than --max-chars {counter.max_chars:,} characters" if k == FLAG_TOO_LONG
                          else None for k in flags]
            out[f.role] = Measured({f.primary: lengths}, flags, errors, bounds=bounds, ids=ids)
        else:
            out[f.role] = _measure_audio(batch, f, split_src, audio)
    return out


# -- audio ------------------------------------------------------------------------------------------

def _measure_audio(batch: Batch, f: RoleField, split_src: SplitSource, settings: AudioSettings) -> Measured:
    from lengthscan.measure.audio.durations import read_infos, resampled_length

    values = column_audio(batch, f.column, split_src)
    infos = read_infos(values, base_dir=split_src.base_dir(batch.rows))
    n = len(infos)
    flags = np.zeros(n, np.int8)
    seconds = np.full(n, np.nan)
    frames = np.full(n, -1, np.int64)
    rates = np.ones(n, np.int64)
    errors: list = [None] * n
    decoded = np.zeros(n, bool)
    for i, info in enumerate(infos):
        code = FLAG_CODES[info.flag] if info.flag else 0
        flags[i] = code
        errors[i] = info.error
        decoded[i] = info.decoded
        if code in MEASURED_FLAGS and info.frames is not None:
            seconds[i] = info.frames / info.samplerate
            frames[i], rates[i] = info.frames, info.samplerate
    result = {f.specs[0]: seconds}
    ok = frames >= 0
    if settings.sampling_rate:
        samples = np.full(n, -1, np.int64)
        samples[ok] = resampled_length(frames[ok], rates[ok], settings.sampling_rate)
        result[f.specs[1]] = samples
        if settings.frame_rule is not None:
            model_frames = np.full(n, -1, np.int64)
            model_frames[ok] = settings.frame_rule.frames(samples[ok])
            result[f.specs[2]] = model_frames
    return Measured(result, flags, errors if any(e is not None for e in errors) else None,
                    decoded if decoded.any() else None)


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
    _wrong_value(column, split_src, batch, int(valid[0]), col[int(valid[0])].as_py(), str(t),
                 "audio (a path, bytes, or an Audio(decode=False) column)")


# -- text -------------------------------------------------------------------------------------------

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
            raise ColumnError(f"column {column!r} holds text that is not UTF-8: {_where(split_src, batch, bad)} "
                              f"({exc.reason} at byte {exc.start}); re-encode the file as UTF-8") from None
    if pa.types.is_string_view(col.type):
        return col.cast(pa.large_string()).to_pylist()
    if getattr(col.type, "extension_name", None) == "arrow.json":
        # datasets stores a JSON column of mixed value types as JSON text: decode, then check
        values = [None if v is None else json.loads(v) for v in col.storage.to_pylist()]
        bad = next((i for i, v in enumerate(values) if v is not None and not isinstance(v, str)), None)
        if bad is None:
            return values
        _wrong_value(column, split_src, batch, bad, values[bad], "mixed JSON values", "text")
    valid = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
    if valid.size == 0:
        return [None] * len(col)
    _wrong_value(column, split_src, batch, int(valid[0]), col[int(valid[0])].as_py(), str(col.type), "text")


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
                              f"{_where(split_src, Batch(rows, table), bad)}; re-encode the file as UTF-8") from None


def _decodes(col, i: int) -> bool:
    try:
        col[i].as_py()
        return True
    except UnicodeDecodeError:
        return False


def _where(split_src: SplitSource, batch: Batch, i: int) -> str:
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


def _wrong_value(column: str, split_src: SplitSource, batch: Batch, i: int, value, kind: str, wanted: str):
    where = _where(split_src, batch, i)
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


def _columns_hint(column: str, have) -> str:
    """What a message on a missing column ends with: the closest column, and those there are."""
    guess = did_you_mean(column, have)
    return (f"did you mean {guess!r}? " if guess else "") + f"columns are: {name_list(have)}"
