"""CSV/TSV files streamed with pyarrow's CSV reader, every column as text (remote files: local
ones go through ``datasets``' conversion, ``formats.datasets``)."""

from __future__ import annotations

from collections.abc import Iterator

from lengthscan.sources.formats.batch import STREAM_PIECES, Batch, even_spans, sliced
from lengthscan.sources.formats.raw_lines import part_stream


class CsvFormat:
    """A part with a CSV schema (``Part.csv_schema``)."""

    name = "csv"

    def claims(self, part) -> bool:
        return part.csv_schema is not None

    def spans(self, part, pieces: int, least: int) -> list[tuple[int, int]]:
        return even_spans(part.rows, min(pieces, STREAM_PIECES), least)

    def read(self, part, columns: list[str], wanted, batch_rows: int, raw: tuple = (), *,
             stop: bool = False) -> Iterator[Batch]:
        import pyarrow.csv as pacsv

        from lengthscan.sources.csv_files import pyarrow_convert_options, pyarrow_parse_options

        tsv = str(part.path).lower().split("?")[0].removesuffix(".gz").removesuffix(".bz2").endswith(".tsv")
        with part_stream(part) as fh:
            reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(use_threads=False),
                                    parse_options=pyarrow_parse_options(tsv),
                                    convert_options=pyarrow_convert_options(part.csv_schema, columns))
            yield from sliced(part, reader, wanted, batch_rows, stop=stop)
