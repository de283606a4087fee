"""A JSON Lines file's rows as the file holds them (``json.loads``, line by line), beside a reader."""

from __future__ import annotations

import json

import numpy as np

from lengthscan.sources.source import SourceError


class RawLines:
    """The ``columns`` of a JSON Lines file's rows parsed with ``json.loads``, line by line, for
    rows asked in increasing order (blank lines are skipped, as the readers skip them)."""

    def __init__(self, path: str, columns: tuple, open_stream=None):
        self.path, self.columns = path, columns
        self._lines = json_lines(path, open_stream)
        self._next = 0  # the row the next line holds

    def take(self, rows) -> dict:
        """column -> values of the rows at these (sorted, not yet passed) positions in the file."""
        from lengthscan.sources.json_lines import json_error

        parsed = []
        for row in np.asarray(rows).tolist():
            while self._next < row:
                next(self._lines)
                self._next += 1
            number, line = next(self._lines)
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SourceError(f"{self.path}: line {number} is not valid JSON: {json_error(exc)}; fix or remove "
                                  "that line") from None
            self._next += 1
        return {c: [r.get(c) if isinstance(r, dict) else None for r in parsed] for c in self.columns}


def json_lines(path: str, open_stream=None):
    """(line number, line) of the lines of a JSON Lines file (decompressed) that hold a row."""
    import io

    from lengthscan.sources.streams import open_text

    stream = open_stream() if open_stream is not None else open_text(path)
    with io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8", newline="\n") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, line


def raw_lines_of(part, raw: tuple) -> RawLines | None:
    """Raw values for a part that ``datasets`` read from one JSON Lines file (None otherwise)."""
    if not raw or not part.path:
        return None
    name = str(part.path).lower()
    for ext in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(ext)
    if not name.endswith((".jsonl", ".json", ".ndjson")):
        return None
    from lengthscan.sources.files import looks_like_lines

    return RawLines(part.path, raw) if looks_like_lines(part.path) else None


def part_stream(part):
    """The part's file front to back, decompressed (a remote file through its counted reads), as a
    ``streams.CheckedLines``: closing it stops the read-ahead of the Arrow reader reading it."""
    from lengthscan.sources.streams import CheckedLines, open_text

    if part.remote is not None:
        return CheckedLines(part.remote.stream(part.path), part.path, utf8=False)
    return open_text(part.path, utf8=False)  # checked as UTF-8 when the file was opened (its layout)
