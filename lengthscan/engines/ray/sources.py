"""What the Ray engine reads: the source's layout on the driver, as the local engine opens it.

The layout (files in sorted path order, each file's row count, the columns, a fingerprint) is what
gives every row its id (its position in the source) without a global shuffle, so it is known
before any row is measured:

- local paths, hub dataset ids, ``http(s)://`` and ``hf://`` files: ``sources.open_source``,
  exactly as the local engine opens them (the same parts, the same fingerprint: the length cache
  serves both engines);
- object storage (``s3://``, ``gs://``, any URI pyarrow has a file system for): files listed on
  the driver, counted by Ray tasks, one a file (Parquet footers; JSON Lines and CSV streamed with
  pyarrow's readers), with each node's own credentials; their parts read through ``FsFiles``.

Rows are then read by the actors with the local engine's own readers (``sources.formats``), one
read task (a file's row groups or a row span) at a time. Ray is imported only by the functions
that take it as an argument.
"""

from __future__ import annotations

import fnmatch
import json
import os

from lengthscan.engines.ray.session import EngineError
from lengthscan.sources.csv_files import pyarrow_parse_options
from lengthscan.sources.remote.stores import is_remote
from lengthscan.sources.source import Part, Source, SourceError, SplitSource, digest, format_of
from lengthscan.sources.urls import display_url, redact_urls

#: Formats the Ray engine reads from object storage.
REMOTE_FORMATS = (".parquet", ".jsonl", ".ndjson", ".json", ".csv", ".tsv")


def check_source(source) -> None:
    """Refuse, before Ray starts, what the engine cannot read in a distributed way (EngineError)."""
    if type(source).__module__.startswith("datasets"):
        raise EngineError("the Ray engine reads files, not an in-memory Dataset: save it with "
                          "save_to_disk or to Parquet and give the path")
    spec = os.fspath(source)
    if "://" in spec and not spec.startswith("file://") and not is_remote(spec):
        _filesystem(spec)


def object_storage(spec: str) -> bool:
    """``spec`` is an object-storage URI Ray's tasks list and count (s3://, gs://, other pyarrow file
    systems); ``http(s)://`` and ``hf://`` go through the local engine's opener."""
    scheme = spec.partition("://")[0].lower()
    return "://" in spec and scheme not in ("http", "https", "hf", "file")


def open_for_ray(ray, source, split: str | None, *, config: str | None = None, revision: str | None = None,
                 layouts=None) -> Source:
    """The source's layout, as the local engine sees it, or counted by Ray (object-storage URIs):
    each file's ``file_layout`` by a Ray task, or by ``layouts`` (a function of the calls' arguments,
    answering in order: the warm actors of a kept pool, which hold the CPUs tasks would wait for)."""
    check_source(source)
    spec = os.fspath(source)
    if spec.startswith("file://"):
        source = spec = spec[len("file://"):]
    if object_storage(spec):
        if config is not None or revision is not None:
            raise SourceError(f"{display_url(spec)}: --config and --revision are a hub dataset id's; this source is "
                              "files")
        return _open_remote(ray, spec, split, layouts)
    from lengthscan.sources.opener import open_source

    return open_source(source, split=split, config=config, revision=revision)


# -- object storage -------------------------------------------------------------------------------

def _filesystem(uri: str):
    """(pyarrow file system, path inside it) of a URI; EngineError when pyarrow has none for it. The
    path does not hold the URI's user information (credentials)."""
    import pyarrow.fs as pafs

    head, _, rest = uri.partition("://")
    try:
        # glob characters are not part of the path pyarrow resolves (and S3 needs a bucket only)
        fs, _ = pafs.FileSystem.from_uri(f"{head}://{rest.split('/')[0]}")
    except Exception as exc:
        raise EngineError(f"{display_url(uri)}: cannot open this object-storage location ({_first(exc)}); the Ray "
                          "engine reads http(s):// and hf:// as the local engine does, s3://, gs:// and other "
                          "URIs through pyarrow's file systems") from None
    authority, slash, path = rest.partition("/")
    return fs, f"{authority.rsplit('@', 1)[-1]}{slash}{path}"


def _filesystem_and_paths(paths: list[str]):
    """(file system, paths inside it) for local paths (None: Ray's default) or URIs of one store."""
    if not any("://" in p for p in paths):
        return None, paths
    fs, _ = _filesystem(paths[0])
    return fs, [p.partition("://")[2] for p in paths]


def _open_remote(ray, spec: str, split: str | None, layouts=None) -> Source:
    """Files of a URI (a file, a folder or a glob), each counted by a Ray task; one split, 'train'."""
    import pyarrow.fs as pafs

    shown = display_url(spec)  # the spec as messages and the report show it (no credentials, no query)
    if split not in (None, "train"):
        raise EngineError(f"{shown}: data files have one split, 'train'; --split {split} does not exist")
    fs, path = _filesystem(spec)
    scheme = spec.partition("://")[0]
    glob = any(ch in path for ch in "*?[")
    try:
        if glob:
            base = path[:min(path.find(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
            infos = [i for i in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
                     if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, path)]
        else:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
                         if i.type == pafs.FileType.File and format_of(i.path) in REMOTE_FORMATS]
            elif info.type == pafs.FileType.File:
                infos = [info]
            else:
                infos = []
    except OSError as exc:
        raise EngineError(f"{shown}: cannot list it: {_first(exc)}") from None
    if not infos:
        raise EngineError(f"{shown}: no such file, or the folder or glob matches no data file")
    infos.sort(key=lambda i: i.path)
    formats = {format_of(i.path) for i in infos}
    if len(formats) > 1 or not formats <= set(REMOTE_FORMATS):
        raise EngineError(f"{shown}: the Ray engine reads one format of Parquet, JSON Lines or CSV/TSV files from "
                          f"object storage; found {', '.join(sorted(str(f) for f in formats))}")
    fmt = formats.pop()
    calls = [(fs, i.path, fmt) for i in infos]
    found = layouts(calls) if layouts is not None else ray.get([ray.remote(file_layout).remote(*c) for c in calls])
    files = FsFiles(fs, {f"{scheme}://{i.path}": (i.size, i.mtime_ns) for i in infos})
    parts, start = [], 0
    for info, (rows, schema, problem, groups) in zip(infos, found):
        uri = f"{scheme}://{info.path}"
        if problem:
            raise EngineError(f"{uri}: {problem}")
        if schema.names != found[0][1].names:
            raise EngineError(f"{uri}: columns {schema.names} differ from the first file's {found[0][1].names}")
        kind = {".parquet": {"parquet": True, "groups": groups, "schema": schema},
                ".csv": {"csv_schema": found[0][1]}, ".tsv": {"csv_schema": found[0][1]}}
        parts.append(Part(start, uri, rows=rows, columns=schema.names, remote=files, loader=_no_loader(uri),
                          **kind.get(fmt, {"jsonl_schema": schema})))
        start += rows
    stamp = [(f"{scheme}://{i.path}", i.size, i.mtime_ns) for i in infos]
    fingerprint = digest(json.dumps([fmt, stamp], default=str))[:16]
    return Source(shown, fmt[1:], (SplitSource("train", tuple(parts), fingerprint),), False)


class FsFiles:
    """Object-storage files read through a pyarrow file system, as the local engine's readers read a
    remote part (``part.remote``): picklable, each actor opening the files it reads. ``listed``: each
    file's (size, modification time) when it was listed."""

    def __init__(self, fs, listed: dict):
        self.fs, self.listed = fs, listed
        self._opened: dict = {}

    def __getstate__(self):
        return {"fs": self.fs, "listed": self.listed}

    def __setstate__(self, state):
        self.fs, self.listed, self._opened = state["fs"], state["listed"], {}

    def _path(self, uri: str) -> str:
        return uri.partition("://")[2]

    def parquet(self, uri: str):
        import pyarrow.parquet as pq

        if uri not in self._opened:
            self._opened[uri] = pq.ParquetFile(self.fs.open_input_file(self._path(uri)))
        return self._opened[uri]

    def stream(self, uri: str):
        return self.fs.open_input_stream(self._path(uri), compression="detect")

    def page_index(self, uri: str):
        return None  # rows are read by whole row groups

    def blocks(self, uri: str, groups, columns) -> list[int]:
        return list(groups)

    def check_unchanged(self, uri: str) -> None:
        """The file is still the one listed (size and modification time): EngineError otherwise."""
        import pyarrow.fs as pafs

        try:
            info = self.fs.get_file_info(self._path(uri))
        except OSError as exc:
            raise EngineError(f"{uri}: cannot be asked again after it was read: {_first(exc)}") from None
        now = (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None
        listed = self.listed[uri]
        if now != listed:
            said = "it is gone" if now is None else f"size {listed[0]:,} -> {now[0]:,}, modified " \
                f"{listed[1]} -> {now[1]} ns"
            raise EngineError(f"{uri}: the file changed during the run ({said}); its rows would mix two "
                              "versions: run again")


def check_unchanged(split_src: SplitSource) -> None:
    """The split's remote files are still the ones listed, asked again once their rows were read,
    or when reading them failed: a file rewritten during the run is said so (exit 2), never read as
    a mix of two versions."""
    for part in split_src.parts:
        if part.remote is not None:
            part.remote.check_unchanged(part.path)


def _no_loader(uri: str):
    def load():
        raise EngineError(f"{uri}: an object-storage file is read by Ray, not loaded with datasets")
    return load


def file_layout(fs, path: str, fmt: str):
    """(rows, arrow schema, problem or None, row groups' rows or None) of one remote file: a Ray
    task, where the data is."""
    import pyarrow as pa

    try:
        if fmt == ".parquet":
            import pyarrow.parquet as pq

            with fs.open_input_file(path) as fh:
                meta = pq.ParquetFile(fh).metadata
                groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
                return meta.num_rows, meta.schema.to_arrow_schema(), None, groups
        if fmt in (".csv", ".tsv"):
            return (*_csv_layout(fs, path, fmt), None)
        with fs.open_input_stream(path, compression="detect") as fh:
            if fh.read(4096).lstrip()[:1] != b"{":
                return 0, pa.schema([]), "a JSON array file: the Ray engine reads JSON Lines (one object a line)", None
        from lengthscan.sources.files import json_lines_layout

        rows, schema = json_lines_layout(lambda: fs.open_input_stream(path, compression="detect"), long_lines=True)
        return rows, schema, None, None
    except (OSError, ValueError) as exc:  # pa.ArrowInvalid and pandas' parser errors are ValueErrors
        return 0, pa.schema([]), f"cannot read it: {_first(exc)}", None


#: Rows ``datasets``' CSV builder converts per pandas chunk; the first chunk's types are the file's.
CSV_CHUNK_ROWS = 10_000


def _csv_layout(fs, path: str, fmt: str):
    """A remote CSV file's rows (counted with pyarrow, parsing as the readers do) and its columns,
    every one text as the local engine reads them (``sources.csv_files``); a header naming a
    column twice is refused."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from lengthscan.sources.csv_files import check_names, read_header, text_names
    from lengthscan.sources.source import FORMATS

    header = read_header(fs.open_input_stream(path, compression="detect"), FORMATS[fmt][1])
    check_names(path, header)  # a SourceError (a ValueError): "cannot read it: ..." below
    schema = pa.schema([(name, pa.string()) for name in text_names(header)])  # every column as text, as locally
    first = schema.names[0]
    with fs.open_input_stream(path, compression="detect") as fh:
        reader = pacsv.open_csv(fh, parse_options=pyarrow_parse_options(fmt == ".tsv"),
            convert_options=pacsv.ConvertOptions(include_columns=[first], column_types={first: pa.large_string()}))
        rows = sum(batch.num_rows for batch in reader)
    return rows, schema, None


def _first(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return redact_urls(text.splitlines()[0])[:300]
