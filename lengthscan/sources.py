"""Open any supported source as ``datasets`` objects with a defined row identity.

One function, ``open_source``, handles JSONL/JSON, CSV/TSV and Parquet files and globs, a
``save_to_disk`` directory, a directory of data files, a hub dataset id, and an in-memory
``Dataset``/``DatasetDict``. ``row`` is the 0-based position in the source, per split: files of a
glob in sorted path order; ``source_file``/``file_row`` locate a row of a multi-file source.
``load_source`` returns the plain ``Dataset``/``DatasetDict``.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: File suffix -> (datasets builder, builder options). CSV keeps "NA"/"null" as text: only an
#: empty cell is missing, so a transcript that reads "NA" is not silently turned into None.
FORMATS = {
    ".jsonl": ("json", {}),
    ".ndjson": ("json", {}),
    ".json": ("json", {}),
    ".csv": ("csv", {"keep_default_na": False, "na_values": [""]}),
    ".tsv": ("csv", {"sep": "\t", "keep_default_na": False, "na_values": [""]}),
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
    ``import datasets`` and its conversion cost).
    """

    def __init__(self, start: int, path: str | None = None, *, dataset=None, loader=None,
                 rows: int | None = None, columns: list[str] | None = None, parquet: bool = False,
                 jsonl_schema=None):
        self.start, self.path, self.parquet = start, path, parquet
        self.jsonl_schema = jsonl_schema  # set when the file is JSON Lines read directly with pyarrow
        self._dataset, self._loader = dataset, loader
        self._rows, self._columns = rows, columns

    @property
    def dataset(self):
        if self._dataset is None:
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
        from . import features as feats

        schema = None
        if self.parquet and self._dataset is None:
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
        return os.path.dirname(os.path.abspath(path)) if path else None

    def locate(self, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
        starts = np.asarray(self.starts, np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        return [self.paths[i] for i in which], rows - starts[which]


@dataclass(frozen=True, eq=False)
class Source:
    """An opened source: its splits in order; ``has_splits`` when it is a DatasetDict."""

    spec: str
    kind: str
    splits: tuple[SplitSource, ...]
    has_splits: bool

    @property
    def fingerprint(self) -> str:
        return _sha("|".join(f"{s.name}:{s.fingerprint}" for s in self.splits))[:16]

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.splits)

    def to_datasets(self):
        """The source as ``datasets.Dataset`` (one split) or ``DatasetDict``."""
        if not self.has_splits:
            return self.splits[0].dataset()
        from datasets import DatasetDict

        return DatasetDict({s.name: s.dataset() for s in self.splits})


def load_source(source, *, split: str | None = None):
    """Open ``source`` (path, glob, directory, hub id, Dataset) as a ``Dataset``/``DatasetDict``."""
    return open_source(source, split=split).to_datasets()


def open_source(source, *, split: str | None = None) -> Source:
    """Open ``source`` with row identity; ``split`` selects one split of a multi-split source."""
    from .filesources import open_audio_folder, open_files

    if _is_datasets_object(source):
        from datasets import Dataset, DatasetDict

        _quiet_datasets()
    if _is_datasets_object(source) and isinstance(source, Dataset):
        return Source(_describe(source), "dataset", (_single(split or "train", source),), False)
    if _is_datasets_object(source) and isinstance(source, DatasetDict):
        return _from_dict(_describe(source), "dataset", source, split)
    spec = os.fspath(source)
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _open_disk(spec, path, split)
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and _format_of(str(p)))
        if files:
            return open_files(spec, files, split)
        audio = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        if audio:
            return open_audio_folder(spec, audio, split)
        raise SourceError(f"{spec}: directory holds no save_to_disk dataset, no data files "
                          f"({', '.join(FORMATS)}) and no audio files")
    if any(ch in spec for ch in "*?["):
        files = sorted(f for f in _glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(f))
        if not files:
            raise SourceError(f"{spec}: the glob matches no file")
        return open_files(spec, files, split)
    if path.is_file():
        return open_files(spec, [str(path)], split)
    if _format_of(spec) or path.parent != Path(".") and path.parent.exists() or spec.startswith((".", "/", "~")):
        raise SourceError(f"{spec}: no such file or directory")
    return _open_hub(spec, split)


# -- kinds of source -----------------------------------------------------------------------------

def _open_disk(spec: str, path: Path, split: str | None) -> Source:
    from datasets import DatasetDict, load_from_disk

    _quiet_datasets()
    try:
        loaded = load_from_disk(str(path))
    except Exception as exc:
        raise SourceError(f"{spec}: cannot load the save_to_disk dataset: {_first_line(exc)}") from exc
    if isinstance(loaded, DatasetDict):
        return _from_dict(spec, "disk", loaded, split)
    if split not in (None, "train"):
        raise SourceError(f"{spec}: a single-split dataset; --split {split} does not exist")
    return Source(spec, "disk", (_single("train", loaded),), False)


def _open_hub(spec: str, split: str | None) -> Source:
    from datasets import DatasetDict, load_dataset

    _quiet_datasets()
    try:
        loaded = load_dataset(spec, split=split)
    except Exception as exc:
        raise SourceError(
            f"{spec}: not a local file or directory, and loading it as a hub dataset failed "
            f"(offline, or no such dataset?): {_first_line(exc)}"
        ) from exc
    if isinstance(loaded, DatasetDict):
        return _from_dict(spec, "hub", loaded, None)
    return Source(spec, "hub", (_single(split or "train", loaded),), False)


def _from_dict(spec: str, kind: str, dd, split: str | None) -> Source:
    if split is not None:
        if split not in dd:
            raise SourceError(f"{spec}: no split {split!r}; splits are {', '.join(dd)}")
        return Source(spec, kind, (_single(split, dd[split]),), True)
    return Source(spec, kind, tuple(_single(name, ds) for name, ds in dd.items()), True)


def _single(name: str, ds) -> SplitSource:
    return SplitSource(name, (Part(0, None, dataset=ds),), _dataset_fingerprint(ds))


def _dataset_fingerprint(ds) -> str:
    """Content identity of a Dataset: its Arrow files' stamps when on disk, else its fingerprint."""
    files = [c["filename"] for c in ds.cache_files]
    if files and ds._indices is None:
        stamp = [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
        return _sha(json.dumps([stamp, ds.column_names, len(ds)]))[:16]
    return str(ds._fingerprint)


# -- helpers ---------------------------------------------------------------------------------------

def _is_datasets_object(source) -> bool:
    """True for a Dataset/DatasetDict, judged without importing datasets for a path."""
    return type(source).__module__.startswith("datasets")


def _format_of(path: str) -> str | None:
    name = path.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    suffix = os.path.splitext(name)[1]
    return suffix if suffix in FORMATS else None


def _describe(ds) -> str:
    return f"<{type(ds).__name__} {getattr(ds, '_fingerprint', '')}>".replace(" >", ">")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _quiet_datasets() -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
