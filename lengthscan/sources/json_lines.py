"""JSON Lines: how pyarrow's reader is set up for them, and what makes a line unfit to be a row.

A line is one row: a JSON object. Refused, each with its file and line (``first_bad_line``):

* a line that is not UTF-8, or not JSON;
* a line that is not an object (``3``, ``"x"``, ``[1]``); ``null`` is a row of nulls, as both
  pyarrow and ``datasets`` read it;
* an object that names one key twice (``{"text": "a", "text": "b"}``, at any depth). Python's
  ``json`` keeps the last value and pyarrow refuses the line, so reading on would depend on the
  reader: the line is refused, never read with one of its values dropped;
* a number too large for a 64-bit float (``1e400``), which would become infinity;
* a ``\\ud800``-style escape that is half of a UTF-16 surrogate pair: no Unicode character;
* objects and arrays nested more than ``MAX_NESTING`` levels (the row's own object is the
  first): Arrow's files hold at most 64 levels of types and Parquet fewer, so deeper rows could
  be read but never written, and readers recurse over them.
"""

from __future__ import annotations

import json
import math
import re

from lengthscan.sources.nesting import deep_line_in, first_deep_line, nesting

#: The deepest nesting of objects and arrays a row may have, its own object counted.
MAX_NESTING = 32

#: A line with more opening brackets than this (in one block read) is checked for its depth before
#: pyarrow reads on: its reader takes time quadratic in the depth (10,000 levels: half a minute).
_HEAVY = 1000

_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile("[\ud800-\udfff]")


class SeveralValues(ValueError):
    """pyarrow's reader found more rows than the file has lines: a line holds two JSON values
    (``{"a": 1} {"a": 2}``), which it reads as two rows and a JSON Lines file may not hold."""


class NestingError(ValueError):
    """A row nests objects and arrays deeper than ``MAX_NESTING`` levels (its message names the line)."""


#: The JSON reader's block: lines up to this long are read (``json_lines_layout`` of a remote file
#: grows it to fit its longest line; a local file's longer lines go through datasets).
BLOCK = 1 << 20
#: The key of a schema's metadata that holds a larger block the file needs (``json_read_options``).
BLOCK_KEY = b"lengthscan.json_block"


def json_read_options(schema=None):
    """Blocks of ``BLOCK`` bytes, or of the size ``schema`` (``json_lines_layout``'s) says the file
    needs; the reader reads a bounded number of blocks ahead, so its memory stays a few blocks."""
    import pyarrow.json as pj

    metadata = getattr(schema, "metadata", None) or {}
    block = int(metadata.get(BLOCK_KEY, BLOCK))
    return pj.ReadOptions(block_size=block)


def json_parse_options(schema=None):
    """The JSON reader's parse options for a file of ``schema`` (``json_lines_layout``'s): its
    text columns read as text, so a column of date-like strings stays the strings it holds."""
    import pyarrow as pa
    import pyarrow.json as pj

    if schema is None:
        return pj.ParseOptions()
    text = [f for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    return pj.ParseOptions(explicit_schema=pa.schema(text)) if text else pj.ParseOptions()


def json_lines_layout(open_stream, *, long_lines: bool = False) -> tuple:
    """(rows, schema) of a JSON Lines file (``open_stream()`` opens it), read as the measuring pass
    reads it: pyarrow infers types, except that strings it would take for timestamps or dates stay
    strings (pyarrow has no option for that: the columns are read again, named as text). A row
    nested too deep is a ``NestingError`` naming its line. With ``long_lines`` (a file that has no
    other reader: a remote one), a line longer than ``BLOCK`` is read with blocks that fit the
    file's longest line (at most the row limit), which the schema's metadata then says."""
    import pyarrow as pa

    open_stream = checked(open_stream)
    try:
        return _layout(open_stream, BLOCK)
    except pa.ArrowInvalid as exc:
        if not long_lines or "straddl" not in str(exc):  # pyarrow's "straddling object straddles two blocks"
            raise
    with open_stream() as fh:  # its longest line (one over the row limit stops the read, named)
        while fh.read(BLOCK):
            pass
        longest = fh.longest
    block = 1 << (longest + 1).bit_length()  # a power of two that holds the line and its line break
    rows, schema = _layout(open_stream, block)
    return rows, schema.with_metadata({**(schema.metadata or {}), BLOCK_KEY: str(block).encode()})


def _layout(open_stream, block: int) -> tuple:
    import pyarrow as pa
    import pyarrow.json as pj

    read_options = pj.ReadOptions(block_size=block)
    with open_stream() as fh:  # a line of many brackets is read on only once it is known not too deep
        reader = pj.open_json(_Guard(fh), read_options=read_options)
        rows = sum(batch.num_rows for batch in reader)
        schema, lines = reader.schema, fh.filled_lines
    if rows != lines:
        raise SeveralValues(f"{rows:,} rows in {lines:,} lines: a line holds more than one JSON value")
    check_nesting(schema, open_stream)
    guessed = [f for f in schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)]
    if not guessed:
        return rows, schema
    as_text = pa.schema([f.with_type(pa.string()) if f in guessed else f for f in schema])
    with open_stream() as fh:
        reader = pj.open_json(fh, read_options=read_options, parse_options=json_parse_options(as_text))
        rows = sum(batch.num_rows for batch in reader)
        return rows, reader.schema


def checked(open_stream):
    """``open_stream`` with each stream it opens read through ``streams.CheckedLines`` (lines of at most
    ``max_row_bytes()``, UTF-8), unless it is one already (a local file's: ``streams.open_text``)."""
    from lengthscan.sources.streams import CheckedLines, max_row_bytes

    def opened():
        stream = open_stream()
        stream = stream if isinstance(stream, CheckedLines) else CheckedLines(stream, line_cap=max_row_bytes())
        stream.tally = True  # its lines of white space counted: rows are compared with lines
        return stream
    return opened


class _Guard:
    """The stream pyarrow's JSON reader reads through. Where a read holds a line of more than
    ``_HEAVY`` opening brackets, its whole lines' depth is found (``nesting.deep_line_in``: numpy,
    strings skipped) before the reader gets them: a line too deep is a ``NestingError`` naming it,
    before the reader spends minutes on it; the others read on in the same pass. A line the read
    cuts is checked with the read that ends it (the reader parses no line before its end)."""

    def __init__(self, inner):
        self.inner, self.closed = inner, False
        self.tail, self.lines = b"", 0  # the line begun and not ended yet; the lines ended before it

    def read(self, nbytes: int = -1) -> bytes:
        data = self.inner.read(nbytes)
        seen = self.tail + data if self.tail else data
        end = seen.rfind(b"\n") + 1 if data else len(seen)  # at the end of the file, its last line too
        if heavy_line(seen):
            found = deep_line_in(seen[:end], MAX_NESTING)
            if found is not None:
                raise too_deep(f"line {self.lines + found + 1}")
        self.lines += seen.count(b"\n", 0, end)
        self.tail = seen[end:]
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def heavy_line(data: bytes) -> bool:
    """Some line of ``data`` (or part of one, cut by the block's ends) has more than ``_HEAVY``
    opening brackets: cheap (numpy), for every block of every file, unlike ``_nesting``."""
    if data.count(b"[") + data.count(b"{") <= _HEAVY:
        return False
    import numpy as np

    raw = np.frombuffer(data, np.uint8)
    opens = np.flatnonzero((raw == 0x5B) | (raw == 0x7B))
    ends = np.flatnonzero(raw == 0x0A)
    return bool(np.bincount(np.searchsorted(ends, opens), minlength=ends.size + 1).max() > _HEAVY)


def too_deep_before_reading(open_stream) -> None:
    """A ``NestingError`` for a file with a line too deep among those of many brackets (read with
    ``heavy_line`` first): what a reader with time quadratic in the depth must not be given."""
    with open_stream() as fh:
        while data := fh.read(1 << 20):
            if heavy_line(data):
                break
        else:
            return
    check_nesting(None, open_stream)


def schema_depth(schema) -> int:
    """How deep the rows of a table of ``schema`` nest: 1 (the row) plus its deepest column's levels
    of lists, structs and maps (counted without recursion: a crafted schema may be thousands deep)."""
    import pyarrow as pa

    deepest, stack = 1, [(field.type, 1) for field in schema]
    while stack:
        t, depth = stack.pop()
        if pa.types.is_dictionary(t):
            stack.append((t.value_type, depth))
            continue
        if pa.types.is_struct(t):
            inner = [t.field(i).type for i in range(t.num_fields)]
        elif pa.types.is_map(t):
            inner = [t.key_type, t.item_type]
        elif isinstance(t, (pa.ListType, pa.LargeListType, pa.FixedSizeListType, pa.ListViewType,
                            pa.LargeListViewType)):
            inner = [t.value_type]
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((u, depth + 1) for u in inner)
    return deepest


def check_nesting(schema, open_stream) -> None:
    """A ``NestingError`` naming the first line too deep when ``schema``'s rows nest deeper than
    ``MAX_NESTING`` (``open_stream()`` opens the file, read again only then); with ``schema`` None,
    when any line does."""
    if schema is not None and schema_depth(schema) <= MAX_NESTING:
        return
    line = first_deep_line(open_stream, MAX_NESTING)
    if line is None and schema is None:
        return
    raise too_deep(f"line {line}" if line is not None else "a row")


def too_deep(where: str) -> NestingError:
    return NestingError(f"{where} nests objects and arrays more than {MAX_NESTING} levels deep; flatten it or "
                        "store the value as a JSON string")


def looks_like_lines(path: str) -> bool:
    """A JSON Lines file starts with an object, a JSON array file with '['."""
    from lengthscan.sources.streams import open_text

    with open_text(path) as fh:
        head = fh.read(4096).lstrip()
    return head[:1] == b"{"


def named_lines(path: str) -> bool:
    """The file is JSON Lines by its name (``.jsonl``, ``.ndjson``, compressed or not): every line is
    a row whatever it starts with; a ``.json`` file may also be one JSON document over many lines."""
    from lengthscan.sources.source import format_of

    return format_of(path) in (".jsonl", ".ndjson")


def lines_file(path: str) -> bool:
    """The file holds one JSON value a line, to check line by line: JSON Lines by name, or a file whose
    first line is an object that closes on that line (not one document over many lines)."""
    import io

    from lengthscan.sources.streams import open_text

    if named_lines(path):
        return True
    if not looks_like_lines(path):
        return False
    with io.BufferedReader(open_text(path)) as fh:
        for raw in fh:
            if raw.strip():
                return nesting(raw)[1] == 0
    return False


class _Refused(ValueError):
    """A JSON value that parses but is no row (its message says why)."""


def _distinct_keys(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"has the key {_short(key)!r} twice in one object; give each key once (lengthscan "
                           "does not pick one of the values)")
        seen.add(key)
    return dict(pairs)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"holds the number {_short(text)}, too large for a 64-bit float (it would become infinity)")
    return value


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def json_line_problem(raw: bytes, text: str) -> str | None:
    """Why one line of a JSON Lines file (its bytes, and the text they decode to) is no row, or None."""
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and nesting(raw)[0] > MAX_NESTING:
        return f"nests objects and arrays more than {MAX_NESTING} levels deep; flatten it or store the value " \
               "as a JSON string"
    try:
        value = json.loads(text, object_pairs_hook=_distinct_keys, parse_float=_finite)
    except _Refused as exc:
        return str(exc)
    except json.JSONDecodeError as exc:
        if b"\r" in raw.rstrip(b"\r\n"):  # lines ended by a carriage return alone read as one line
            return (f"is not valid JSON: {json_error(exc)}: its lines end with a carriage return alone (\\r); end "
                    "them with line feeds (\\n or \\r\\n)")
        return f"is not valid JSON: {json_error(exc)}; fix or remove that line"
    except ValueError as exc:  # what ``_finite`` passes on: float() of a number Python cannot read
        return f"is not valid JSON: {_short(str(exc))}; fix or remove that line"
    except RecursionError:
        return "nests objects and arrays too deep to read; flatten it or store the value as a JSON string"
    if value is not None and not isinstance(value, dict):  # null: a row of nulls, as the readers take it
        kind = {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")
        return (f"is {kind} ({_short(text.strip())}), not an object: each line of JSON Lines is one row, "
                '{"column": value, ...}')
    if _SURROGATE.search(text) and (lone := _lone_surrogate(value)) is not None:
        return (f"holds the escape \\u{ord(lone):04x}, half of a UTF-16 surrogate pair without its other half: "
                "no Unicode character (pyarrow refuses it, and it cannot be written as UTF-8); fix that escape")
    return None


def json_error(exc: json.JSONDecodeError) -> str:
    """What is wrong with one line's JSON and where, as a column of that line ("Extra data at column
    59"), without the json module's own positions (its "line 2 column 1 (char 59)" counts the line's
    ending as a second line)."""
    line = exc.doc.rstrip("\r\n") if isinstance(exc.doc, str) else ""
    where = "at the end of the line" if exc.pos >= len(line) else f"at column {exc.pos + 1:,}"
    return f"{exc.msg} {where}"


def _lone_surrogate(value) -> str | None:
    """The first lone surrogate in a parsed value's strings (a pair decodes to one character), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(v.keys())
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, str) and (hit := _LONE.search(v)):
            return hit.group()
    return None


def first_bad_line(path: str, *, json_lines: bool) -> str | None:
    """Where a text file goes wrong, for the message: the first line that is not UTF-8 or longer than
    a row may be (a ``SourceError`` from ``streams.open_text``, raised) or, in JSON Lines
    (``json_lines`` and a file that is JSON Lines by name or by its first character), no row (see
    the module's list); None when every line is fine."""
    import io

    import pyarrow as pa

    from lengthscan.sources.streams import open_text

    try:
        lines = json_lines and (named_lines(path) or looks_like_lines(path))
        with io.BufferedReader(open_text(path), buffer_size=1 << 20) as fh:
            for number, raw in enumerate(fh, start=1):
                if number == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, which the readers skip
                if lines and raw.strip():
                    problem = json_line_problem(raw, raw.decode("utf-8"))
                    if problem is not None:
                        return f"{path}: line {number} {problem}"
    except (OSError, EOFError, pa.ArrowException):
        return None
    return None
