"""CSV and TSV files: their headers checked, and every column read as the text the file holds.

A CSV row must come out of ``clean`` as it went in, and ``clean`` writes every column, measured or
not: so no column is converted to a number (``00501`` stays ``00501``, an id column with a blank
stays integers-as-text, not ``1.0``, and a 30-digit number keeps its digits). Nothing lengthscan
measures needs a CSV column as a number: text is tokenized and audio is measured from its files'
headers. A blank cell is missing (null), whatever column it is in.

A header naming one column twice is refused (pandas would rename the second ``text.1``, in silence).
"""

from __future__ import annotations

from lengthscan.sources.source import SourceError, first_line, name_list

#: In the source fingerprint: how a CSV/TSV file's columns are read (a change reads them anew).
READ_AS = "every column as text"


def raw_header(path: str, options: dict) -> list[str]:
    """The names on a CSV/TSV file's first line, as written (a TSV's without quoting)."""
    import csv

    from lengthscan.sources.streams import open_text

    try:
        return read_header(open_text(path), options)
    except csv.Error as exc:  # a name of more than 1 GiB, say
        raise SourceError(f"{path}: cannot read its header (line 1): {exc}") from None


def read_header(stream, options: dict) -> list[str]:
    """The names on the first line of a binary ``stream`` (closed after) of CSV/TSV with ``options``
    (``FORMATS``'): for any file system's stream (the Ray engine's remote files too)."""
    return _first_records(stream, options, 1)[0][0]


def _first_records(stream, options: dict, count: int) -> tuple[list[list[str]], list[int]]:
    """The first ``count`` records of ``stream`` (closed after) that are not blank lines (pandas skips
    those), each ``[]`` past the end, and the line each starts on."""
    import csv
    import io

    limit = csv.field_size_limit(1 << 30)  # a name may be long (the module's limit: 128 KiB)
    records, lines = [], []
    try:
        with io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8-sig", errors="replace", newline="") as fh:
            reader = csv.reader(fh, delimiter=options.get("sep", ","),
                                quoting=csv.QUOTE_NONE if options.get("quoting") == 3 else csv.QUOTE_MINIMAL)
            while len(records) < count:
                start = reader.line_num + 1
                record = next(reader, None)
                if record is None:
                    records.append([])
                    lines.append(start)
                elif record or not records:  # a blank line is no record, but a blank header is one
                    records.append(record)
                    lines.append(start)
    finally:
        csv.field_size_limit(limit)
    return records, lines


def check_first_row(path: str, options: dict) -> None:
    """The first row of a local CSV/TSV file has no more fields than its header names: pandas would
    read the surplus leading fields as the row index, silently, for every row of the file (a file
    whose lines end with a comma loses its first column, every other column shifted by one)."""
    import csv

    from lengthscan.sources.streams import open_text

    try:
        (header, row), (_, line) = _first_records(open_text(path), options, 2)
    except csv.Error as exc:
        raise SourceError(f"{path}: cannot read its first rows: {exc}") from None
    if len(row) > len(header):
        raise SourceError(f"{path}: line {line} has {len(row)} fields where the header names {len(header)} "
                          "columns (a comma or tab too many, at the end of each line?); the columns would be read "
                          "shifted: give each row as many fields as the header")


def check_rows(path: str, options: dict) -> None:
    """No row of a local CSV/TSV file is longer than ``streams.max_row_bytes()`` (a ``SourceError``
    naming it otherwise), checked before pandas reads the file (it would hold a row of any length).
    Every line is checked as it streams by (``streams.open_text``, which also checks UTF-8); a CSV
    row may also span lines inside quotes, so a CSV with quotes that is larger than the limit is
    also parsed by pyarrow in blocks of the limit, which stops at a row that does not fit in one.
    A file no larger than the limit needs none of this."""
    import os

    from lengthscan.sources.streams import codec_of, max_row_bytes, open_text

    cap = max_row_bytes()
    if codec_of(path) is None and os.path.getsize(path) <= cap:
        return
    quoted = False
    with open_text(path) as fh:
        while chunk := fh.read(1 << 20):
            quoted = quoted or b'"' in chunk
        total = fh.total
    if options.get("sep") != "\t" and quoted and total > cap:
        _rows_fit(path, cap)


def _rows_fit(path: str, cap: int) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from lengthscan.sources.streams import MAX_ROW_ENV, open_text

    first = read_header(open_text(path), {})[:1]
    rows = 0
    with open_text(path) as fh:
        try:
            reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(use_threads=False, block_size=cap),
                                    parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                                     invalid_row_handler=lambda row: "skip"),
                                    convert_options=pacsv.ConvertOptions(include_columns=first, column_types={
                                        name: pa.string() for name in first}))
            for batch in reader:
                rows += batch.num_rows
        except pa.ArrowInvalid as exc:
            if "straddling" not in str(exc):
                return  # the reader pandas uses decides what else is wrong
            raise SourceError(f"{path}: holds a row longer than {cap:,} bytes, the longest row lengthscan reads "
                              f"(after {rows:,} rows that fit: a quoted field running over many lines); shorten it, "
                              f"or raise the limit with {MAX_ROW_ENV}=BYTES if the row is real") from None


def check_names(path: str, header: list[str]) -> None:
    """A ``SourceError`` naming the file and the column when its header names a column twice."""
    seen: dict = {}
    for i, name in enumerate(header, start=1):
        if name in seen and name != "":  # empty names pandas calls "Unnamed: N"
            raise SourceError(f"{path}: the header names the column {_short(name)!r} twice (columns {seen[name]} and "
                              f"{i}); rename one (lengthscan does not rename columns)")
        seen.setdefault(name, i)


def text_names(header: list[str]) -> list[str]:
    """The column names pandas (so ``datasets``) gives a header that names each column once: as
    written, an empty name ``Unnamed: N`` (N from 0)."""
    return [name or f"Unnamed: {i}" for i, name in enumerate(header)]


def check_headers(spec: str, files: list[str], options: dict) -> None:
    """Each file names each column once, and every file names the same columns: a ``SourceError``
    naming the file and the column otherwise."""
    first = None
    for f in files:
        header = raw_header(f, options)
        check_names(f, header)
        if first is None:
            first = (f, header)
        elif set(header) != set(first[1]):
            raise SourceError(different_columns(spec, first, (f, header)))


def different_columns(spec: str, one: tuple, other: tuple) -> str:
    """The message for two files, each (path, header), that hold different columns."""
    (a, ha), (b, hb) = one, other
    only_a, only_b = [c for c in ha if c not in set(hb)], [c for c in hb if c not in set(ha)]
    detail = "; ".join(part for part in (f"only {a} has {name_list(only_a)}" if only_a else "",
                                         f"only {b} has {name_list(only_b)}" if only_b else "") if part)
    return (f"{spec}: the files have different columns: {a} has {name_list(ha)}; {b} has {name_list(hb)}"
            f"{f' ({detail})' if detail else ''}; give files with the same columns")


def different_headers(spec: str, files: list[str], options: dict) -> str | None:
    """A message when CSV files disagree on their columns (``load_dataset`` says "Couldn't cast")."""
    headers = [(f, raw_header(f, options)) for f in files]
    odd = next((h for h in headers[1:] if h[1] != headers[0][1]), None)
    return None if odd is None else different_columns(spec, headers[0], odd)


def text_features(path: str, options: dict):
    """``datasets.Features`` reading every column of ``path`` as text (``text_names``; its header names
    each column once: ``check_headers``). Read with the ``csv`` module: pandas takes seconds over a
    header of 100,000 columns."""
    from datasets import Features, Value

    return Features({name: Value("string") for name in text_names(raw_header(path, options))})


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def pyarrow_parse_options(tsv: bool):
    """pyarrow's CSV parsing as the local reading parses: a TSV without quoting (each line a row), a
    CSV with line breaks allowed inside quotes."""
    import pyarrow.csv as pacsv

    if tsv:
        return pacsv.ParseOptions(delimiter="\t", quote_char=False)
    return pacsv.ParseOptions(delimiter=",", newlines_in_values=True)


def pyarrow_convert_options(schema, columns: list[str] | None = None):
    """Every column as text, only an empty cell missing (``keep_default_na=False, na_values=[""]``)."""
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(column_types=schema, null_values=[""], strings_can_be_null=True,
                                include_columns=columns)


def remote_csv_parts(entries, files, options: dict) -> list:
    """Remote CSV/TSV files (``sources.remote``), each streamed once to count its rows; their
    columns read as text from the header, as local files are."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from lengthscan.sources.source import Part
    from lengthscan.sources.streams import CheckedLines

    parts, start, first = [], 0, None
    for e in entries:
        header = read_header(files.stream(e.name), options)
        check_names(e.name, header)
        if first is None:
            first = (e.name, header)
        elif set(header) != set(first[1]):
            raise SourceError(different_columns(e.name, first, (e.name, header)))
        schema = pa.schema([(name, pa.string()) for name in text_names(header)])
        try:
            with CheckedLines(files.stream(e.name), e.name, utf8=False) as fh:  # its close stops the read-ahead
                reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(use_threads=False),
                                        parse_options=pyarrow_parse_options(options.get("sep") == "\t"),
                                        convert_options=pyarrow_convert_options(schema, [schema.names[0]]))
                rows = sum(batch.num_rows for batch in reader)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"{e.name}: cannot read as CSV: {first_line(exc)}") from None
        parts.append(Part(start, e.name, rows=rows, columns=schema.names, csv_schema=schema, remote=files))
        start += rows
    return parts
