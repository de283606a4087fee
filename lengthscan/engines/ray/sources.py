"""What the Ray engine reads, and how: the source's layout on the driver, its rows through Ray Data.

The layout (files in sorted path order, each file's row count, the columns, a fingerprint) is what
gives every row its id (its position in the source) without a global shuffle, so it is known
before any row is measured:

- local paths: ``sources.open_source``, exactly as the local engine opens them (Parquet: footers;
  JSON Lines: one streaming count on the driver; CSV/TSV: ``datasets``' own conversion, so the
  columns have the types the local engine gives them; ``save_to_disk``: memory-mapped, not read);
- object storage (``s3://``, ``gs://``, any URI pyarrow has a file system for): files listed on
  the driver, counted by Ray tasks, one a file (Parquet footers; JSON Lines and CSV streamed with
  pyarrow's readers), with each node's own credentials.

Rows are then read by Ray Data's readers (``read_parquet``, ``read_json``, ``read_csv``, given the
pyarrow file system), or, for a ``save_to_disk`` directory, its Arrow files in ``map_batches``.
Ray is imported only by the functions that take it as an argument.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

from lengthscan.engines.ray.session import EngineError
from lengthscan.sources.csv_files import pyarrow_parse_options
from lengthscan.sources.source import Part, Source, SplitSource, digest, format_of
from lengthscan.sources.urls import display_url, redact_urls

#: Formats the Ray engine reads from object storage.
REMOTE_FORMATS = (".parquet", ".jsonl", ".ndjson", ".json", ".csv", ".tsv")
#: Rows per Arrow batch when a ``save_to_disk`` file is read in ``map_batches``.
ARROW_FILE_BATCH = 2048 * 16


def check_source(source) -> None:
    """Refuse, before Ray starts, what the engine cannot read in a distributed way (EngineError)."""
    if type(source).__module__.startswith("datasets"):
        raise EngineError("the Ray engine reads files, not an in-memory Dataset: save it with "
                          "save_to_disk or to Parquet and give the path")
    spec = os.fspath(source)
    if spec.startswith("file://"):
        spec = spec[len("file://"):]
    elif "://" in spec:
        _filesystem(spec)
        return
    if not any(ch in spec for ch in "*?[") and not Path(spec).expanduser().exists():
        raise EngineError(f"{display_url(spec)}: not a local file, glob or directory; a hub dataset id cannot be read "
                          "in a distributed way: download it (save_to_disk or Parquet) and give the path")


def open_for_ray(ray, source, split: str | None) -> Source:
    """The source's layout, as the local engine sees it (local paths) or counted by Ray (URIs)."""
    check_source(source)
    spec = os.fspath(source)
    if spec.startswith("file://"):
        source = spec = spec[len("file://"):]
    if "://" in spec:
        return _open_remote(ray, spec, split)
    from lengthscan.sources.opener import open_source

    src = open_source(source, split=split)
    for part in (p for s in src.splits for p in s.parts or () if p.path):
        if part.path.lower().endswith((".zstd", ".xz")):  # pyarrow's readers in Ray detect .gz, .bz2 and .zst only
            raise EngineError(f"{display_url(part.path)}: the Ray engine reads .gz, .bz2 and .zst files, not "
                              f"{part.path.rsplit('.', 1)[-1]}: rename a .zstd file .zst, recompress an .xz one, or "
                              "drop --engine ray")
    if src.kind == "audiofolder":
        raise EngineError(f"{display_url(spec)}: audio folders are not supported by the Ray engine yet; "
                          "write a manifest (JSONL or Parquet) with the paths")
    return src


def read_split(ray, split_src: SplitSource, columns: list[str], num_blocks: int | None):
    """A Ray Dataset of the split's ``columns``, its rows in source order (``preserve_order``)."""
    parts = split_src.parts
    kw = {"override_num_blocks": num_blocks} if num_blocks else {}
    paths = [p.path for p in parts]
    if all(paths):
        fs, paths = _filesystem_and_paths(paths)
        kw.update(filesystem=fs, partitioning=None)  # hive-style folder names are not columns here
    if all(p.parquet for p in parts):
        return ray.data.read_parquet(paths, **kw).select_columns(columns)
    if all(p.jsonl_schema is not None for p in parts):
        from lengthscan.sources.files import json_parse_options, json_read_options

        # pyarrow's JSON reader, as the local engine (``lines=True`` would read through pandas)
        widest = max((p.jsonl_schema for p in parts), key=lambda s: json_read_options(s).block_size)  # long lines
        return ray.data.read_json(paths, file_extensions=None, read_options=json_read_options(widest),
                                  parse_options=json_parse_options(parts[0].jsonl_schema), **kw).select_columns(columns)
    if all(paths) and all(format_of(p.path) in (".csv", ".tsv") for p in parts):
        return ray.data.read_csv(paths, file_extensions=None, **csv_options(split_src), **kw).select_columns(columns)
    if len(parts) == 1 and parts[0].path is None:
        from lengthscan.sources.scan import plain_arrow_files

        files = plain_arrow_files(parts[0].dataset)
        if files is not None:
            items = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
            return items.map_batches(_arrow_file_batches, batch_size=1, batch_format="pyarrow",
                                     fn_kwargs={"columns": columns, "batch_rows": ARROW_FILE_BATCH})
    raise EngineError(f"split {split_src.name}: the Ray engine reads Parquet, JSON Lines, CSV and save_to_disk "
                      "directories without transforms; convert this source to Parquet")


def csv_options(split_src: SplitSource) -> dict:
    """pyarrow CSV options that read the values the local engine reads: the columns' types as the
    split's features give them (``datasets``' conversion for local files), only an empty cell
    missing (``keep_default_na=False, na_values=[""]``), line breaks allowed inside quotes."""
    import pyarrow.csv as pacsv

    tsv = format_of(split_src.parts[0].path) == ".tsv"
    schema = features_schema(split_src.parts[0].features())
    return {"read_options": pacsv.ReadOptions(use_threads=False),
            "parse_options": pyarrow_parse_options(tsv),
            "convert_options": pacsv.ConvertOptions(column_types=schema, null_values=[""],
                                                    strings_can_be_null=True)}


def features_schema(features: dict):
    """The Arrow schema ``datasets`` stores ``features`` (the ``to_dict()`` form) as."""
    from lengthscan.sources import features as feats

    try:
        return feats.arrow_schema(features)
    except feats.NotPlain:
        from datasets import Features

        return Features.from_dict(features).arrow_schema


def _arrow_file_batches(items, *, columns: list[str], batch_rows: int):
    """Arrow stream files of a ``save_to_disk`` dataset, read through a file handle (no memory map)."""
    import pyarrow as pa

    for path in items.column("path").to_pylist():
        with pa.OSFile(path, "rb") as fh:
            for rb in pa.ipc.open_stream(fh):
                rb = rb.select(columns)
                for k in range(0, rb.num_rows, batch_rows):
                    yield pa.Table.from_batches([rb.slice(k, batch_rows)])


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
                          "engine reads s3://, gs:// and other URIs through pyarrow's file systems") from None
    authority, slash, path = rest.partition("/")
    return fs, f"{authority.rsplit('@', 1)[-1]}{slash}{path}"


def _filesystem_and_paths(paths: list[str]):
    """(file system, paths inside it) for local paths (None: Ray's default) or URIs of one store."""
    if not any("://" in p for p in paths):
        return None, paths
    fs, _ = _filesystem(paths[0])
    return fs, [p.partition("://")[2] for p in paths]


def _open_remote(ray, spec: str, split: str | None) -> Source:
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
    layouts = ray.get([ray.remote(_file_layout).remote(fs, i.path, fmt) for i in infos])
    parts, start = [], 0
    for info, (rows, schema, problem) in zip(infos, layouts):
        uri = f"{scheme}://{info.path}"
        if problem:
            raise EngineError(f"{uri}: {problem}")
        if schema.names != layouts[0][1].names:
            raise EngineError(f"{uri}: columns {schema.names} differ from the first file's {layouts[0][1].names}")
        listed = (info.size, info.mtime_ns)
        if fmt == ".parquet":
            parts.append(_StoredPart(start, uri, listed=listed, rows=rows, columns=schema.names, parquet=True,
                                     loader=_no_loader(uri)))
        elif fmt in (".csv", ".tsv"):
            parts.append(_TablePart(start, uri, listed=listed, rows=rows, columns=schema.names, schema=layouts[0][1],
                                    loader=_no_loader(uri)))
        else:
            parts.append(_StoredPart(start, uri, listed=listed, rows=rows, columns=schema.names, jsonl_schema=schema,
                                     loader=_no_loader(uri)))
        start += rows
    stamp = [(f"{scheme}://{i.path}", i.size, i.mtime_ns) for i in infos]
    fingerprint = digest(json.dumps([fmt, stamp], default=str))[:16]
    return Source(shown, fmt[1:], (SplitSource("train", tuple(parts), fingerprint),), False)


class _StoredPart(Part):
    """An object-storage file: its size and modification time when it was listed (``check_unchanged``)."""

    def __init__(self, start, path, *, listed: tuple, **kw):
        super().__init__(start, path, **kw)
        self.listed = listed


def check_unchanged(split_src: SplitSource) -> None:
    """The split's object-storage files are still the ones listed (size and modification time), asked
    again once their rows were read, or when reading them failed: a file rewritten during the run is
    said so (EngineError, exit 2), never read as a mix of two versions."""
    import pyarrow.fs as pafs

    stored = [p for p in split_src.parts if isinstance(p, _StoredPart)]
    if not stored:
        return
    fs, paths = _filesystem_and_paths([p.path for p in stored])
    try:
        infos = fs.get_file_info(paths)
    except OSError as exc:
        raise EngineError(f"{stored[0].path}: cannot be asked again after it was read: {_first(exc)}") from None
    for part, info in zip(stored, infos):
        now = (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None
        if now != part.listed:
            said = "it is gone" if now is None else f"size {part.listed[0]:,} -> {now[0]:,}, modified " \
                f"{part.listed[1]} -> {now[1]} ns"
            raise EngineError(f"{part.path}: the file changed during the run ({said}); its rows would mix two "
                              "versions: run again")


class _TablePart(_StoredPart):
    """A remote CSV file: its columns' types as pyarrow infers them from the first file."""

    def __init__(self, start, path, *, schema, **kw):
        super().__init__(start, path, **kw)
        self.schema = schema

    def features(self) -> dict:
        from lengthscan.sources import features as feats

        return feats.from_schema(self.schema)


def _no_loader(uri: str):
    def load():
        raise EngineError(f"{uri}: an object-storage file is read by Ray, not loaded with datasets")
    return load


def _file_layout(fs, path: str, fmt: str):
    """(rows, arrow schema, problem or None) of one remote file: a Ray task, where the data is."""
    import pyarrow as pa

    try:
        if fmt == ".parquet":
            import pyarrow.parquet as pq

            with fs.open_input_file(path) as fh:
                meta = pq.ParquetFile(fh).metadata
                return meta.num_rows, meta.schema.to_arrow_schema(), None
        if fmt in (".csv", ".tsv"):
            return _csv_layout(fs, path, fmt)
        with fs.open_input_stream(path, compression="detect") as fh:
            if fh.read(4096).lstrip()[:1] != b"{":
                return 0, pa.schema([]), "a JSON array file: the Ray engine reads JSON Lines (one object a line)"
        from lengthscan.sources.files import json_lines_layout

        rows, schema = json_lines_layout(lambda: fs.open_input_stream(path, compression="detect"), long_lines=True)
        return rows, schema, None
    except (OSError, ValueError) as exc:  # pa.ArrowInvalid and pandas' parser errors are ValueErrors
        return 0, pa.schema([]), f"cannot read it: {_first(exc)}"


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
