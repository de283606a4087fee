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
    file read directly with pyarrow, never needs it (nor the seconds ``import datasets`` costs).
    """

    def __init__(self, start: int, path: str | None = None, *, dataset=None, loader=None,
                 rows: int | None = None, columns: list[str] | None = None, parquet: bool = False):
        self.start, self.path, self.parquet = start, path, parquet
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

    def features(self):
        """The part's ``datasets.Features`` (from the Parquet schema without converting it)."""
        if self.parquet and self._dataset is None:
            import pyarrow.parquet as pq
            from datasets import Features

            return Features.from_arrow_schema(pq.read_schema(self.path))
        return self.dataset.features


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
            return _open_files(spec, files, split)
        audio = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        if audio:
            return _open_audio_folder(spec, audio, split)
        raise SourceError(f"{spec}: directory holds no save_to_disk dataset, no data files "
                          f"({', '.join(FORMATS)}) and no audio files")
    if any(ch in spec for ch in "*?["):
        files = sorted(f for f in _glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(f))
        if not files:
            raise SourceError(f"{spec}: the glob matches no file")
        return _open_files(spec, files, split)
    if path.is_file():
        return _open_files(spec, [str(path)], split)
    if _format_of(spec) or path.parent != Path(".") and path.parent.exists() or spec.startswith((".", "/", "~")):
        raise SourceError(f"{spec}: no such file or directory")
    return _open_hub(spec, split)


# -- kinds of source -----------------------------------------------------------------------------

def _open_files(spec: str, files: list[str], split: str | None) -> Source:
    formats = {_format_of(f) for f in files}
    if None in formats:
        bad = next(f for f in files if _format_of(f) is None)
        raise SourceError(f"{bad}: unknown file type (supported: {', '.join(FORMATS)}, optionally compressed)")
    if len(formats) > 1:
        raise SourceError(f"{spec}: files of several formats ({', '.join(sorted(formats))}); give one format")
    if split not in (None, "train"):
        raise SourceError(f"{spec}: data files have one split, 'train'; --split {split} does not exist")
    suffix = formats.pop()
    builder, options = FORMATS[suffix]
    for f in files:
        if not os.access(f, os.R_OK):
            raise SourceError(f"{f}: file is not readable")
    stamp = [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
    fingerprint = _sha(json.dumps([builder, options, stamp], default=str))[:16]
    if builder == "parquet":
        parts = _parquet_parts(spec, files)
    else:
        parts = _cached_parts(fingerprint, files) or _load_parts(spec, files, builder, options, suffix, fingerprint)
    return Source(spec, suffix[1:], (SplitSource("train", tuple(parts), fingerprint),), False)


def _parquet_parts(spec: str, files: list[str]) -> list[Part]:
    """Parquet is read directly with pyarrow (rows and columns from its footer, no conversion)."""
    import pyarrow.parquet as pq

    parts, start = [], 0
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception as exc:
            raise SourceError(f"{f}: cannot read as parquet: {_first_line(exc)}") from exc
        names = meta.schema.to_arrow_schema().names
        parts.append(Part(start, f, rows=meta.num_rows, columns=names, parquet=True,
                          loader=_single_file_loader("parquet", f, {})))
        start += meta.num_rows
    return parts


def _load_parts(spec, files, builder, options, suffix, fingerprint) -> list[Part]:
    """Convert the files with ``load_dataset`` (one call, one split per file) and remember their shape."""
    from datasets import load_dataset

    _quiet_datasets()
    names = [f"file{i:06d}" for i in range(len(files))]
    try:
        loaded = load_dataset(builder, data_files={n: [f] for n, f in zip(names, files)}, **options)
    except Exception as exc:
        raise SourceError(f"{spec}: cannot read as {suffix[1:]}: {_first_line(exc)}") from exc
    parts, start = [], 0
    for name, f in zip(names, files):
        ds = loaded[name]
        parts.append(Part(start, f, dataset=ds))
        start += len(ds)
    _remember_parts(fingerprint, parts)
    return parts


def _manifest_path(fingerprint: str) -> Path:
    from importlib.metadata import version

    from .cache import cache_root

    return cache_root() / "sources" / f"{fingerprint}-datasets{version('datasets')}.json"


def _remember_parts(fingerprint: str, parts: list[Part]) -> None:
    """Rows and columns of each file, so a rerun can skip ``load_dataset`` until it reads rows."""
    path = _manifest_path(fingerprint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps([{"path": p.path, "start": p.start, "rows": p.rows, "columns": p.column_names}
                                   for p in parts]))
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs speed, never correctness
        pass


def _cached_parts(fingerprint: str, files: list[str]) -> list[Part] | None:
    path = _manifest_path(fingerprint)
    if not path.exists():
        return None
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if [e["path"] for e in entries] != files:
        return None
    builder_loader = _lazy_loader(files, fingerprint)
    return [Part(e["start"], e["path"], rows=e["rows"], columns=e["columns"], loader=builder_loader(i))
            for i, e in enumerate(entries)]


def _lazy_loader(files: list[str], fingerprint: str):
    """Loaders for each file's Dataset that share one ``load_dataset`` call, made on first use."""
    memo: dict = {}

    def for_part(i: int):
        def load():
            if "parts" not in memo:
                builder, options = FORMATS[_format_of(files[0])]
                memo["parts"] = _load_parts(files[0], files, builder, options, _format_of(files[0]), fingerprint)
            return memo["parts"][i].dataset
        return load
    return for_part


def _single_file_loader(builder: str, path: str, options: dict):
    def load():
        from datasets import load_dataset

        _quiet_datasets()
        return load_dataset(builder, data_files=[path], split="train", **options)
    return load


def _open_audio_folder(spec: str, files: list[str], split: str | None) -> Source:
    """One row per audio file in sorted path order: ``audio`` (absolute path) and ``text``.

    ``text`` is the content of a sidecar ``.txt``/``.lab`` with the same stem, None without one.
    """
    from datasets import Dataset

    _quiet_datasets()
    if split not in (None, "train"):
        raise SourceError(f"{spec}: an audio folder has one split, 'train'; --split {split} does not exist")
    paths = [os.path.abspath(f) for f in files]
    texts, stamp = [], []
    for path in paths:
        stem = os.path.splitext(path)[0]
        sidecar = next((stem + s for s in TRANSCRIPT_SUFFIXES if os.path.isfile(stem + s)), None)
        text = None
        if sidecar is not None:
            try:
                text = Path(sidecar).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise SourceError(f"{sidecar}: cannot read the transcript: {_first_line(exc)}") from exc
        texts.append(text)
        for f in (path, sidecar) if sidecar else (path,):
            st = os.stat(f)
            stamp.append((f, st.st_size, st.st_mtime_ns))
    ds = Dataset.from_dict({"audio": paths, "text": texts})
    fingerprint = _sha(json.dumps(["audiofolder", stamp]))[:16]
    return Source(spec, "audiofolder", (SplitSource("train", (Part(0, None, dataset=ds),), fingerprint),), False)


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
