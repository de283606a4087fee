"""Text: a column of strings counted by the tokenizer as the model receives them."""

from __future__ import annotations

from lengthscan.measure.cache import CacheReader, CacheWriter, field_key
from lengthscan.measure.columns import ColumnError, column_texts
from lengthscan.measure.kinds.base import Kind, MeasureContext
from lengthscan.measure.records import FLAG_TOO_LONG, Measured


class TextKind(Kind):
    name = "text"
    tokenized = True
    truncates = True

    def packed(self, f):
        return f.primary if f.role == "input" else None  # a decoder's text; a target is no packed sequence

    def after(self, f) -> tuple[str, ...]:
        return (f.primary.name,)

    def empty_length(self, f, counter) -> int:
        return counter.empty_length(f.role)

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        counter = ctx.counter
        texts = column_texts(batch, f.column, split_src)
        limit = ctx.decide_caps.get(f.role)
        bounds = ids = None
        try:
            if ctx.with_ids:
                lengths, flags, ids = counter.count_ids(texts, f.role)
            elif limit is None:
                lengths, flags = counter.count(texts, f.role)
            else:
                lengths, flags, at_least, at_most = counter.decide_count(texts, f.role, limit)
                bounds = {f.primary: (at_least, at_most)}
        except TypeError as exc:  # a non-string that slipped past the type check
            raise ColumnError(f"column {f.column!r}: {exc}") from None
        return Measured({f.primary: lengths}, flags, too_long_errors(flags, counter), bounds=bounds, ids=ids)

    def cached(self, f) -> bool:
        return True

    def cache_key(self, fingerprint, f, ctx) -> str:
        return field_key(fingerprint, f.column, f.primary.name, ctx.counter.hash, ctx.counter.max_chars)

    def cache_reader(self, f, path, rows: int):
        return CacheReader(path, rows)

    def cache_writer(self, f, key: str):
        return CacheWriter(key)

    def from_cache(self, f, reader, rows, ctx) -> Measured:
        lengths, flags = reader.take(rows)
        return Measured({f.primary: lengths}, flags, too_long_errors(flags, ctx.counter))

    def to_cache(self, f, writer, measured: Measured) -> None:
        writer.write(measured.values[f.primary], measured.flags)


def too_long_errors(flags, counter) -> list | None:
    """Per-row messages for rows over ``--max-chars`` (None when there is none)."""
    if not (flags == FLAG_TOO_LONG).any():
        return None
    return [f"longer than --max-chars {counter.max_chars:,} characters" if k == FLAG_TOO_LONG else None
            for k in flags]
