"""JSON Lines files (local or remote) streamed with pyarrow's JSON reader, block by block."""

from __future__ import annotations

from collections.abc import Iterator

from lengthscan.sources.formats.batch import STREAM_PIECES, Batch, even_spans, sliced
from lengthscan.sources.formats.raw_lines import RawLines, part_stream


class JsonLinesFormat:
    """A part with a JSON Lines schema (``Part.jsonl_schema``): read with pyarrow, its ``raw``
    columns also parsed line by line with ``json.loads``, in step with the reader."""

    name = "jsonl"

    def claims(self, part) -> bool:
        return part.jsonl_schema is not None

    def spans(self, part, pieces: int, least: int) -> list[tuple[int, int]]:
        """Row spans read apart (each task streams the file up to its span's end)."""
        return even_spans(part.rows, min(pieces, STREAM_PIECES), least)

    def read(self, part, columns: list[str], wanted, batch_rows: int, raw: tuple = (), *,
             stop: bool = False) -> Iterator[Batch]:
        import pyarrow.json as pj

        from lengthscan.sources.files import json_parse_options, json_read_options

        with part_stream(part) as fh:  # closed at the end, on an error, or when the batches are left unread
            reader = pj.open_json(fh, read_options=json_read_options(part.jsonl_schema),
                                  parse_options=json_parse_options(part.jsonl_schema))
            lines = RawLines(part.path, raw, lambda: part_stream(part)) if raw else None
            yield from sliced(part, (rb.select(columns) for rb in reader), wanted, batch_rows, lines, stop=stop)
