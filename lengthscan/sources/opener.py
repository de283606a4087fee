"""Open any supported source as ``datasets`` objects with a defined row identity.
"""

from __future__ import annotations

import glob as _glob
import json
import os
from dataclasses import replace
from pathlib import Path

from lengthscan.sources.cache_dir import file_stamp
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
from lengthscan.sources.streams import kind_of, open_regular
from lengthscan.sources.urls import display_url


def load_source(source, *, split: str | None = None):
    """Open ``source`` (path, glob, directory, hub id, Dataset) as a ``Dataset``/``DatasetDict``."""
    return open_source(source, split=split).to_datasets()


def open_source(source, *, split: str | None = None, config: str | None = None,
                revision: str | None = None) -> Source:
    """Open ``source`` with row identity; ``split`` selects one split of a multi-split source;
    ``config`` and ``revision`` are a hub dataset's (``revision``: a branch, tag or commit)."""
    from lengthscan.sources.audio_folder import open_audio_folder
    from lengthscan.sources.files import open_files
    from lengthscan.sources.remote.stores import is_remote

    if _is_datasets_object(source):
        from datasets import Dataset, DatasetDict

        quiet_datasets()
    if _is_datasets_object(source) and isinstance(source, Dataset):
        return Source(_describe(source), "dataset", (_single(split or "train", source),), False)
    if _is_datasets_object(source) and isinstance(source, DatasetDict):
        return _from_dict(_describe(source), "dataset", source, split)
    spec = os.fspath(source)
    if not spec.strip():
        raise SourceError("the source is an empty name: give a file, folder, glob, save_to_disk dataset or hub id")
    if (config is not None or revision is not None) and (is_remote(spec) or Path(spec).expanduser().exists()):
        raise SourceError(f"{display_url(spec)}: --config and --revision are a hub dataset id's; this source is files")
    if is_remote(spec):
        from lengthscan.sources.remote.opening import open_remote

        return open_remote(spec, split)
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _open_disk(spec, path, split)
        found = folder_files(path)
        files = [f for f in found if format_of(f)]
        if files:
            _check_regular(files)
            return open_files(spec, _distinct(spec, files), split)
        audio = [f for f in found if Path(f).suffix.lower() in AUDIO_SUFFIXES]
        if audio:
            _check_regular(audio)
            return open_audio_folder(spec, _distinct(spec, audio), split)
        raise SourceError(f"{spec}: directory holds no save_to_disk dataset, no data files "
                          f"({', '.join(FORMATS)}) and no audio files")
    if path.is_file():  # a literal name wins over its reading as a glob (train[2024].jsonl)
        return open_files(spec, [str(path)], split)
    if path.is_symlink() and not path.exists():  # exists() is False for a broken link and a loop of links
        raise SourceError(f"{spec}: a symbolic link that leads nowhere (a broken link, or a loop of links)")
    if path.exists():
        raise SourceError(f"{spec}: not a regular file or folder (a FIFO, socket or device): lengthscan reads "
                          "files, folders, globs, save_to_disk datasets and hub names")
    if any(ch in spec for ch in "*?["):
        files = _glob_files(os.path.expanduser(spec))
        _check_regular(files)
        if not files:
            raise SourceError(f"{spec}: the glob matches no file (a literal name with [ ] * ? is read as a file "
                              "when it exists)")
        return open_files(spec, _distinct(spec, files), split)
    if format_of(spec) or path.parent != Path(".") and path.parent.exists() or spec.startswith((".", "/", "~")):
        raise SourceError(f"{spec}: no such file or directory")
    return _open_hub(spec, split, config, revision)


def folder_files(root: Path) -> list[str]:
    """The files under ``root``, sorted (links and special files too: the caller checks those it
    reads; links to folders are followed, each folder once; a folder that cannot be listed is a
    ``SourceError``), without hidden files and folders (lengthscan's staging folders and locks among them)
    and without earlier lengthscan outputs: a folder holding lengthscan's ``report.json`` is
    skipped, with a warning naming it."""
    import warnings

    files, skipped, seen = [], [], set()
    cache = _cache_folder()
    for folder, dirs, names in os.walk(root, onerror=_unlistable, followlinks=True):
        if folder != str(root) and (_is_lengthscan_output(Path(folder)) or Path(folder).resolve() == cache):
            skipped.append(folder)
            dirs.clear()
            continue
        seen.add(os.path.realpath(folder))  # a link to a folder is followed once: never round a loop of links
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and os.path.realpath(os.path.join(folder, d)) not in seen)
        files.extend(os.path.join(folder, n) for n in names if not n.startswith("."))
    if skipped:
        warnings.warn(f"lengthscan: {root}: skipped {len(skipped)} earlier lengthscan output or cache folder(s) "
                      f"inside it ({', '.join(skipped[:3])}); they are not data", stacklevel=2)
    return sorted(files)


def _unlistable(exc: OSError) -> None:
    """A folder inside a source that cannot be listed is named, never skipped in silence."""
    raise SourceError(f"{exc.filename}: cannot list this folder of the source ({exc.strerror or exc}); make it "
                      "readable, or name the files to read")


def _glob_files(pattern: str) -> list[str]:
    """The files a glob matches, sorted, without those inside earlier lengthscan outputs below the
    glob's fixed folder (a ``**`` over a folder that holds a ``--format parquet`` clean would read its
    dataset/ and rejects/ as data); naming an output's own files (``out/dataset/*.parquet``) reads them.
    A ``**`` that goes round a loop of links (``dir/self/self/...``) reads the files it finds once."""
    import warnings

    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if _glob.has_magic(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    outputs: dict[Path, bool] = {}
    reals: dict[Path, str] = {}
    files, skipped, cache = [], set(), _cache_folder()
    for f in sorted(_glob.glob(pattern, recursive=True)):
        if os.path.isdir(f):
            continue
        inside = [p for p in Path(f).parents if p != root and p.is_relative_to(root)] if Path(f).is_relative_to(root) \
            else []
        folders = [reals.setdefault(p, os.path.realpath(p)) for p in [root, *inside]]
        if len(set(folders)) < len(folders):  # inside a loop of links (dir/self/self/...): the file is read once
            continue
        hit = next((p for p in inside if outputs.setdefault(p, _is_lengthscan_output(p) or p.resolve() == cache)),
                   None)
        if hit is not None:
            skipped.add(str(hit))
            continue
        files.append(f)
    if skipped:
        warnings.warn(f"lengthscan: {pattern}: skipped files in {len(skipped)} earlier lengthscan output or "
                      f"cache folder(s) ({', '.join(sorted(skipped)[:3])}); they are not data", stacklevel=3)
    return files


def _check_regular(files: list[str]) -> None:
    """Every path a source reads is a regular file: a FIFO, socket or device would block or never
    end, and a broken link holds nothing; neither is skipped in silence."""
    for f in files:
        if not os.path.isfile(f):
            what = "a broken symbolic link" if os.path.islink(f) and not os.path.exists(f) else \
                "not a regular file (a FIFO, socket or device)"
            raise SourceError(f"{f}: {what}; remove it from the source, or name the files to read")


def _distinct(spec: str, files: list[str]) -> list[str]:
    """``files`` without those that are a file already listed, reached again through a symbolic link
    (a glob's ``**`` goes round a link to a folder above it dozens of times): each file is read once,
    with a warning saying how many were left out."""
    import warnings

    seen, kept, again = set(), [], []
    for f in files:
        real = os.path.realpath(f)
        (again if real in seen else kept).append(f)
        seen.add(real)
    if again:
        warnings.warn(f"lengthscan: {spec}: {len(again):,} of the paths are files already listed, reached again "
                      f"through symbolic links ({', '.join(again[:3])}); each file is read once", stacklevel=3)
    return kept


def _cache_folder() -> Path:
    """lengthscan's cache (``$LENGTHSCAN_CACHE``), never read as data when it lies inside a source."""
    from lengthscan.sources.cache_dir import cache_root

    return cache_root().resolve()


def _is_lengthscan_output(folder: Path) -> bool:
    report = folder / "report.json"
    if not report.is_file():
        return False
    try:
        with open(report, encoding="utf-8") as fh:
            head = fh.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return '"lengthscan_version"' in head


def _open_disk(spec: str, path: Path, split: str | None) -> Source:
    from datasets import DatasetDict, load_from_disk

    quiet_datasets()
    _check_disk_layout(spec, path)
    try:
        loaded = load_from_disk(str(path))
    except Exception as exc:
        raise SourceError(f"{spec}: cannot load the save_to_disk dataset: {first_line(exc)}") from exc
    if isinstance(loaded, DatasetDict):
        return _from_dict(spec, "disk", loaded, split)
    if split not in (None, "train"):
        raise SourceError(f"{spec}: a single-split dataset; --split {split} does not exist")
    return Source(spec, "disk", (_single("train", loaded),), False)


def _check_disk_layout(spec: str, path: Path) -> None:
    """A save_to_disk folder names its splits and data files itself: each must be a plain name inside
    it. A crafted ``../`` would read data from elsewhere, and could put an ``--out`` that looks apart
    from the source over the very files being read."""
    import json

    def plain(name) -> bool:
        return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name

    def read(file: Path) -> dict:
        try:
            with open_regular(file) as fh:
                text = fh.read(_MAX_METADATA + 1)
            if len(text) > _MAX_METADATA:
                raise ValueError(f"more than {_MAX_METADATA:,} bytes, no dataset's metadata")
            data = json.loads(text.decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise SourceError(f"{spec}: cannot read {file.name}: {first_line(exc)}") from None
        if not isinstance(data, dict):
            raise SourceError(f"{spec}: {file.name} is not a JSON object")
        return data

    def regular(file: Path) -> None:
        """What ``load_from_disk`` opens must be a regular file: a FIFO would block it for ever."""
        try:
            what = kind_of(file.stat().st_mode)
        except OSError:
            return  # missing: load_from_disk says so
        if what is not None:
            raise SourceError(f"{spec}: {file} is {what}, not a regular file; a save_to_disk dataset holds files")

    folders = [path]
    if (path / "dataset_dict.json").exists():
        splits = read(path / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(plain(s) for s in splits):
            raise SourceError(f"{spec}: dataset_dict.json names splits that are not plain folder names inside it "
                              f"({str(splits)[:120]})")
        folders = [path / s for s in splits]
    for folder in folders:
        if not (folder / "state.json").exists():
            continue
        files = read(folder / "state.json").get("_data_files", [])
        names = [f.get("filename") if isinstance(f, dict) else f for f in files] if isinstance(files, list) else [files]
        if not all(plain(n) for n in names):
            raise SourceError(f"{spec}: {folder.name}/state.json names data files that are not plain file names "
                              f"inside its folder ({str(names)[:120]})")
        for name in ("dataset_info.json", *names):
            regular(folder / name)


#: The most a save_to_disk dataset's own JSON file (state.json...) may hold: it lists files and features.
_MAX_METADATA = 64 << 20


def _open_hub(spec: str, split: str | None, config: str | None, revision: str | None) -> Source:
    """A hub dataset id: its Parquet files (or the hub's conversion) read by range at one commit,
    else ``load_dataset`` (which downloads and converts it), said in the report."""
    from lengthscan.sources.hub import hub_offline, offline_reason

    offline = hub_offline()  # fast, once: no minute of retries without a network
    fallback = None
    if not offline:
        from lengthscan.sources.remote.hub_ids import resolve_hub
        from lengthscan.sources.remote.opening import RemoteFiles, open_hub_files

        hub = resolve_hub(spec, config=config, revision=revision)
        if hub is not None:
            return open_hub_files(spec, hub, split)
        fallback = RemoteFiles({}, resolved="load_dataset: the repository has no Parquet files and the hub no "
                                             "Parquet conversion, so the dataset was downloaded and converted whole")
    from datasets import DatasetDict, load_dataset

    quiet_datasets()
    try:
        loaded = load_dataset(spec, name=config, split=split, revision=revision)
    except Exception as exc:
        if offline:
            raise SourceError(f"{spec}: not a local file or directory, and {offline_reason()}: a hub dataset can only "
                              "load from the local cache now, and it is not there") from None
        raise SourceError(
            f"{spec}: not a local file or directory, and loading it as a hub dataset failed "
            f"(offline, or no such dataset?): {first_line(exc)}"
        ) from exc
    if isinstance(loaded, DatasetDict):
        return replace(_from_dict(spec, "hub", loaded, None), remote=fallback)
    return Source(spec, "hub", (_single(split or "train", loaded),), False, remote=fallback)


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
        stamp = [file_stamp(f) for f in files]
        return digest(json.dumps([stamp, ds.column_names, len(ds)]))[:16]
    return str(ds._fingerprint)


def _is_datasets_object(source) -> bool:
    """True for a Dataset/DatasetDict, judged without importing datasets for a path."""
    return type(source).__module__.startswith("datasets")




def _describe(ds) -> str:
    return f"<{type(ds).__name__} {getattr(ds, '_fingerprint', '')}>".replace(" >", ">")






