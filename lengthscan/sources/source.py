"""A source's model: its splits, their parts (data files or datasets) and the layout workers need.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lengthscan.sources.urls import redact_urls

#: File suffix -> (datasets builder, builder options). CSV keeps "NA"/"null" as text: only an
#: empty cell is missing, so a transcript that reads "NA" is not silently turned into None. Every
#: CSV/TSV column is read as text (``csv_files.text_features``): "00501" stays "00501". A TSV file
#: has no quoting (``quoting=3``, ``csv.QUOTE_NONE``, as Common Voice's): each line is one row and
#: a double quote is a character of its field.
FORMATS = {
    ".jsonl": ("json", {}),
    ".ndjson": ("json", {}),
    ".json": ("json", {}),
    ".csv": ("csv", {"keep_default_na": False, "na_values": [""]}),
    ".tsv": ("csv", {"sep": "\t", "quoting": 3, "keep_default_na": False, "na_values": [""]}),
    ".parquet": ("parquet", {}),
    ".arrow": ("arrow", {}),
}


COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".zstd")


#: Files an audio folder holds; each becomes a row (readable or not: unreadable ones are reported).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".au", ".snd",
                  ".caf", ".w64", ".rf64", ".m4a", ".aac", ".wma", ".webm", ".sph", ".nist", ".raw", ".pcm")


#: Sidecar transcript files, tried in this order, beside an audio file with the same stem.
TRANSCRIPT_SUFFIXES = (".txt", ".lab")


class SourceError(ValueError):
    """A source that is missing, unreadable or of an unknown kind (exit code 2)."""


class Part:
    """A contiguous run of rows of one split, from one file when the source has several.

    Its ``datasets.Dataset`` is opened lazily: a rerun whose lengths are all cached, or a Parquet
    or JSON Lines file read directly with pyarrow, never needs it (nor the seconds
    ``import datasets`` and its conversion cost). A remote file's part reads through ``remote``
    (``sources.remote.opening.RemoteFiles``), which counts its bytes.
    """

    def __init__(self, start: int, path: str | None = None, *, dataset=None, loader=None,
                 rows: int | None = None, columns: list[str] | None = None, parquet: bool = False,
                 jsonl_schema=None, csv_schema=None, remote=None, groups: tuple[int, ...] | None = None,
                 schema=None, reader=None):
        self.start, self.path, self.parquet = start, path, parquet
        # the part's format object (``sources.formats``) when its opener names it; else the first of
        # ``formats.READERS`` that claims the part (by the attributes below) reads it
        self.reader = reader
        self.jsonl_schema = jsonl_schema  # set when the file is JSON Lines read directly with pyarrow
        self.csv_schema = csv_schema  # set when the file is CSV/TSV streamed with pyarrow (a remote file)
        self.remote = remote
        self.groups = groups  # a Parquet file's row groups' row counts: the blocks a block sample draws
        self._schema = schema  # a Parquet file's Arrow schema, when its footer is already read
        self._dataset, self._loader = dataset, loader
        self._rows, self._columns = rows, columns

    @property
    def dataset(self):
        if self._dataset is None:
            if self._loader is None:
                raise SourceError(f"{self.path}: a remote file is read with pyarrow only; this needs it as a "
                                  "datasets.Dataset: download it first")
            self._dataset = self._loader()
        return self._dataset

    @property
    def rows(self) -> int:
        return self._rows if self._rows is not None else len(self.dataset)

    @property
    def column_names(self) -> list[str]:
        return list(self._columns) if self._columns is not None else list(self.dataset.column_names)

    def features(self) -> dict:
        """The part's features as ``datasets.Features.to_dict()`` gives them: read from the Parquet
        or JSON Lines schema without importing ``datasets`` where every column is plain."""
        from lengthscan.sources import features as feats

        schema = None
        if self._schema is not None or self.csv_schema is not None:
            schema = self._schema if self._schema is not None else self.csv_schema
        elif self.parquet and self._dataset is None:
            import pyarrow.parquet as pq

            schema = pq.read_schema(self.path)
        elif self.jsonl_schema is not None and self._dataset is None:
            schema = self.jsonl_schema
        if schema is not None:
            try:
                return feats.from_schema(schema)
            except feats.NotPlain:
                from datasets import Features

                return Features.from_arrow_schema(schema).to_dict()
        return self.dataset.features.to_dict()


@dataclass(frozen=True, eq=False)
class SplitSource:
    """One split: its parts in row order and a fingerprint of its content."""

    name: str
    parts: tuple[Part, ...]
    fingerprint: str

    @property
    def num_rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def multi_file(self) -> bool:
        return len(self.parts) > 1 and all(p.path for p in self.parts)

    def blocks(self, columns: list[str] | None = None) -> list | None:
        """Each file's blocks' row counts, in row order (None unless every part is Parquet): its row
        groups, a remote file's huge ones split by their page index where ``columns`` allow."""
        if not self.parts or any(p.groups is None for p in self.parts):
            return None
        from lengthscan.sources.parquet_pages import SPLIT_OVER, local_page_index, page_blocks

        out = []
        for p in self.parts:
            if p.remote is not None:
                out.append(p.remote.blocks(p.path, p.groups, columns or []))
            elif columns and p.path and os.path.getsize(p.path) >= SPLIT_OVER:  # a row group may be huge
                import pyarrow.parquet as pq

                out.append(page_blocks(pq.read_metadata(p.path), lambda p=p: local_page_index(p.path), p.groups,
                                       columns))
            else:
                out.append(list(p.groups))
        return out

    @property
    def column_names(self) -> list[str]:
        return self.parts[0].column_names if self.parts else []

    def dataset(self):
        """The split as one ``datasets.Dataset``."""
        if len(self.parts) == 1:
            return self.parts[0].dataset
        from datasets import concatenate_datasets

        return concatenate_datasets([p.dataset for p in self.parts])

    def base_dir(self, rows: np.ndarray) -> str | None:
        """The folder relative paths of these rows resolve against: their file's, if any."""
        return self.layout().base_dir(rows)

    def layout(self) -> "SplitLayout":
        """What the measure step needs of the split, small and picklable (for worker processes)."""
        return SplitLayout(self.name, tuple(p.start for p in self.parts), tuple(p.path for p in self.parts))

    def locate(self, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
        """``source_file`` and ``file_row`` of global row positions."""
        return self.layout().locate(rows)


@dataclass(frozen=True)
class SplitLayout:
    """Where a split's rows come from: part starts and files (picklable; no datasets inside)."""

    name: str
    starts: tuple[int, ...]
    paths: tuple[str | None, ...]

    @property
    def multi_file(self) -> bool:
        return len(self.paths) > 1 and all(self.paths)

    def _part(self, row: int) -> int:
        return int(np.searchsorted(np.asarray(self.starts), row, side="right") - 1)

    def base_dir(self, rows: np.ndarray) -> str | None:
        if rows.size == 0:
            return None
        path = self.paths[self._part(int(rows[0]))]
        if path and "://" in path:
            return path.rsplit("/", 1)[0]  # a remote file's folder (relative audio paths resolve there)
        return os.path.dirname(os.path.abspath(path)) if path else None

    def locate(self, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
        starts = np.asarray(self.starts, np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        return [self.paths[i] for i in which], rows - starts[which]


class RemoteReader(Protocol):
    """A remote source's files as the readers use them (``sources.remote.opening.RemoteFiles``,
    which imports this module): each file's stream, Parquet footer and page index, its blocks,
    the check that it did not change while read, and the report's account."""

    revision: str | None

    def parquet(self, url: str): ...

    def page_index(self, url: str): ...

    def blocks(self, url: str, groups: tuple[int, ...], columns: list[str]) -> list[int]: ...

    def stream(self, url: str): ...

    def check_unchanged(self, url: str) -> None: ...

    def to_dict(self) -> dict: ...


@dataclass(frozen=True, eq=False)
class Source:
    """An opened source: its splits in order; ``has_splits`` when it is a DatasetDict."""

    spec: str
    kind: str
    splits: tuple[SplitSource, ...]
    has_splits: bool
    remote: RemoteReader | None = None  # a remote source's files: its bytes, its revision

    @property
    def fingerprint(self) -> str:
        return digest("|".join(f"{s.name}:{s.fingerprint}" for s in self.splits))[:16]

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.splits)

    def to_datasets(self):
        """The source as ``datasets.Dataset`` (one split) or ``DatasetDict``."""
        if not self.has_splits:
            return self.splits[0].dataset()
        from datasets import DatasetDict

        return DatasetDict({s.name: s.dataset() for s in self.splits})


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def format_of(path: str) -> str | None:
    name = path.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    suffix = os.path.splitext(name)[1]
    return suffix if suffix in FORMATS else None


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message for a one-line message of ours, any URL in it without its
    credentials and query string (``urls.redact_urls``)."""
    text = str(exc).strip() or type(exc).__name__
    return redact_urls(text.splitlines()[0])[:300]


def did_you_mean(name: str, choices) -> str | None:
    """The choice closest to a mistyped ``name`` (the same but for case, else by ``difflib``'s
    similarity of at least 0.6), or None when none is close."""
    import difflib

    choices = [str(c) for c in choices]
    same = [c for c in choices if c.lower() == str(name).lower()]
    if same:
        return same[0]
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    return close[0] if close else None


def name_list(names, limit: int = 10) -> str:
    """Column names for a message: the first ``limit`` (each cut to 60 characters), then how many more."""
    names = [str(n) if len(str(n)) <= 60 else f"{str(n)[:57]}..." for n in names]
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit:,} more"


def quiet_datasets() -> None:
    import datasets

    datasets.disable_progress_bars()
    # CRITICAL: a file that fails to load is our one-line error, not also datasets' own log line
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
