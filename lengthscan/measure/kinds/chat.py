"""A conversation: rendered with the chat template, its trained tokens and, where the model has a
processor, the tokens of its images."""

from __future__ import annotations

from lengthscan.measure.cache import TableCacheReader, TableCacheWriter, chat_key
from lengthscan.measure.chat import stored
from lengthscan.measure.kinds.base import Kind, MeasureContext, raw_columns_of
from lengthscan.measure.records import Measured

#: a conversation's measurements given again after drop-turns or truncation, beside its sequence
AFTER_TRUNCATION = ("completion_tokens", "turns", "final_eot_at")


class ChatKind(Kind):
    name = "chat"
    tokenized = True
    errors_in_reasons = True
    python_bound = True
    renders_apart = True

    def pair(self, f):
        return self._spec(f, "prompt_tokens"), self._spec(f, "completion_tokens")

    def packed(self, f):
        return self._spec(f, "sequence_tokens")

    def after(self, f) -> tuple[str, ...]:
        return (f.primary.name, *AFTER_TRUNCATION)

    def trained(self, f):
        return next((s for s in f.specs if s.name == "completion_tokens"), None)

    @staticmethod
    def _spec(f, name: str):
        return next(s for s in f.specs if s.name == name)

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        columns = raw_columns_of(batch, f)
        rendered = ctx.rendered.get(f.role)
        return ctx.chat.measure(columns, {s.name: s for s in f.specs}, with_ids=ctx.with_ids,
                                base_dir=split_src.base_dir(batch.rows), **({"rendered": rendered} if rendered else {}))

    def job(self, batch, f, split_src, ctx: MeasureContext, light: str | None):
        """The batch for a worker process (``measure.chat.apart.BatchJob``): measured there by the
        counter pickled at ``light`` where it is written, else rendered there."""
        from lengthscan.measure.chat.apart import BatchJob

        return BatchJob(f.role, raw_columns_of(batch, f), {s.name: s for s in f.specs}, ctx.chat.render_spec(),
                        light, split_src.base_dir(batch.rows))

    def notes(self, f) -> dict[str, str]:
        from lengthscan.measure.chat.metrics import chat_notes

        return chat_notes(f.vision, f.video, f.audio_parts, f.reasoning)

    def cached(self, f) -> bool:
        return not (f.vision or f.video or f.audio_parts)  # media tokens depend on files the key does not cover

    def cache_key(self, fingerprint, f, ctx) -> str:
        return chat_key(fingerprint, f.columns, ctx.chat.signature(), ctx.counter.hash, ctx.counter.max_chars)

    def cache_reader(self, f, path, rows: int):
        return TableCacheReader(path, stored.schema(f), rows)

    def cache_writer(self, f, key: str):
        return TableCacheWriter(key, stored.schema(f))

    def from_cache(self, f, reader, rows, ctx) -> Measured:
        return stored.from_table(f, reader.take(rows))

    def to_cache(self, f, writer, measured: Measured) -> None:
        writer.write_batch(stored.to_batch(f, measured))

    def raw_columns(self, f) -> tuple[str, ...]:
        return f.columns  # conversations as the file has them

    def named_by(self, f) -> str:
        return "conversations"
