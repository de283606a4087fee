"""Open any supported source as ``datasets`` objects with a defined row identity.
"""

from __future__ import annotations

import glob as _glob
import json
import os
from pathlib import Path

from lengthscan.sources.source import (
    AUDIO_SUFFIXES,
    FORMATS,
    Part,
    Source,
    SourceError,
    SplitSource,
    digest,
    first_line,
    format_of,
    quiet_datasets,
)


def load_source(source, *, split: str | None = None):
    """Open ``source`` (path, glob, directory, hub id, Dataset) as a ``Dataset``/``DatasetDict``."""
    return open_source(source, split=split).to_datasets()


def open_source(source, *, split: str | None = None) -> Source:
    """Open ``source`` with row identity; ``split`` selects one split of a multi-split source."""
    from lengthscan.sources.files import open_audio_folder, open_files

    if _is_datasets_object(source):
        from datasets import Dataset, DatasetDict

        quiet_datasets()
    if _is_datasets_object(source) and isinstance(source, Dataset):
        return Source(_describe(source), "dataset", (_single(split or "train", source),), False)
    if _is_datasets_object(source) and isinstance(source, DatasetDict):
        return _from_dict(_describe(source), "dataset", source, split)
    spec = os.fspath(source)
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _open_disk(spec, path, split)
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and format_of(str(p)))
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
    if format_of(spec) or path.parent != Path(".") and path.parent.exists() or spec.startswith((".", "/", "~")):
        raise SourceError(f"{spec}: no such file or directory")
    return _open_hub(spec, split)


def _open_disk(spec: str, path: Path, split: str | None) -> Source:
    from datasets import DatasetDict, load_from_disk

    quiet_datasets()
    try:
        loaded = load_from_disk(str(path))
    except Exception as exc:
        raise SourceError(f"{spec}: cannot load the save_to_disk dataset: {first_line(exc)}") from exc
    if isinstance(loaded, DatasetDict):
        return _from_dict(spec, "disk", loaded, split)
    if split not in (None, "train"):
        raise SourceError(f"{spec}: a single-split dataset; --split {split} does not exist")
    return Source(spec, "disk", (_single("train", loaded),), False)


def _open_hub(spec: str, split: str | None) -> Source:
    from datasets import DatasetDict, load_dataset

    quiet_datasets()
    try:
        loaded = load_dataset(spec, split=split)
    except Exception as exc:
        raise SourceError(
            f"{spec}: not a local file or directory, and loading it as a hub dataset failed "
            f"(offline, or no such dataset?): {first_line(exc)}"
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
    # ``_indices`` and ``_fingerprint`` are datasets' own private attributes: there is no public
    # accessor for an indices mapping on top of the files, nor for the content fingerprint.
    if files and ds._indices is None:
        stamp = [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
        return digest(json.dumps([stamp, ds.column_names, len(ds)]))[:16]
    return str(ds._fingerprint)


def _is_datasets_object(source) -> bool:
    """True for a Dataset/DatasetDict, judged without importing datasets for a path."""
    return type(source).__module__.startswith("datasets")




def _describe(ds) -> str:
    return f"<{type(ds).__name__} {getattr(ds, '_fingerprint', '')}>".replace(" >", ">")






