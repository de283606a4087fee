"""File sources: data files and globs (JSONL/JSON, CSV/TSV read by ``load_dataset``, Parquet read
directly with pyarrow), with a manifest of each file's rows and columns so a rerun can skip
``load_dataset`` until it reads rows; and audio folders.

What makes a JSON line no row is in ``json_lines``; how CSV/TSV columns are read (all as text) and
their headers checked is in ``csv_files``."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from lengthscan.sources.cache_dir import cache_root, file_stamp, regular_cache_file
from lengthscan.sources.json_lines import (  # noqa: F401 (json_parse_options, json_read_options: scan.py's)
    NestingError,
    SeveralValues,
    check_nesting,
    first_bad_line,
    json_lines_layout,
    json_parse_options,
    json_read_options,
    lines_file,
    looks_like_lines,
    too_deep_before_reading,
)
from lengthscan.sources.source import (
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
from lengthscan.sources.streams import open_data, open_text

#: In the manifests' names, with the row limit: what a file passed when its manifest was written (2:
#: lines checked as UTF-8, no longer than a row may be, one JSON value each). A manifest written under
#: other checks or another limit is not read.
CHECKS = 2


def open_files(spec: str, files: list[str], split: str | None) -> Source:
    formats = {format_of(f) for f in files}
    if None in formats:
        bad = next(f for f in files if format_of(f) is None)
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
    if builder != "parquet":  # an empty file (or shard of a glob), or a CSV header alone, holds zero rows: left out
        files = [f for f in files if not _blank(f, header=builder == "csv", text=builder != "arrow")]
        if not files:
            raise SourceError(f"{spec}: holds no rows (every file is empty{' or a header alone' * (builder == 'csv')})")
    stamp = [file_stamp(f) for f in files]
    if builder == "csv":
        from lengthscan.sources.csv_files import READ_AS

        stamp.append(READ_AS)
    fingerprint = digest(json.dumps([builder, options, stamp], default=str))[:16]
    if builder == "parquet":
        parts = _parquet_parts(spec, files)
    elif builder == "json" and (parts := _jsonl_parts(files, fingerprint)) is not None:
        pass
    else:
        parts = _cached_parts(fingerprint, files) or _load_parts(spec, files, builder, options, suffix, fingerprint)
    return Source(spec, suffix[1:], (SplitSource("train", tuple(parts), fingerprint),), False)


def _parquet_parts(spec: str, files: list[str]) -> list[Part]:
    """Parquet is read directly with pyarrow (rows and columns from its footer, no conversion); a
    file with view columns (``string_view``...), which pyarrow cannot take rows of, is converted
    by ``load_dataset`` with those columns cast to their plain types (``string``...)."""
    import pyarrow.parquet as pq

    from lengthscan.sources.features import features_without_views

    parts, start = [], 0
    for f in files:
        try:
            pf = pq.ParquetFile(f)
            meta, schema = pf.metadata, pf.schema_arrow
        except Exception as exc:
            raise SourceError(f"{f}: cannot read as parquet: {first_line(exc)}") from exc
        features = features_without_views(schema)
        if features is None:
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
            parts.append(Part(start, f, rows=meta.num_rows, columns=schema.names, parquet=True, groups=groups,
                              loader=_single_file_loader("parquet", f, {})))
        else:
            parts.append(Part(start, f, rows=meta.num_rows, columns=schema.names,
                              loader=_single_file_loader("parquet", f, {"features": features})))
        start += meta.num_rows
    return parts


def _jsonl_parts(files: list[str], fingerprint: str) -> list[Part] | None:
    """JSON Lines read directly with pyarrow's streaming reader: one pass counts the rows and checks
    that every line parses with one schema (remembered in the cache for the same files, unchanged).
    None (use ``load_dataset``, which handles more) for a JSON array file, a column whose type
    changes, or a line longer than the reader's block."""
    import pyarrow as pa

    known = jsonl_manifest(fingerprint, files)
    if known is not None:
        return _jsonl_part_list(files, *known)
    rows_of, schemas = [], []
    for f in files:
        if not looks_like_lines(f):
            return None
        try:
            rows, schema = json_lines_layout(lambda f=f: open_text(f))
        except NestingError as exc:
            raise SourceError(f"{f}: {exc}") from None
        except SeveralValues as exc:
            raise SourceError(first_bad_line(f, json_lines=True) or f"{f}: {exc}") from None
        except (OSError, EOFError) as exc:  # the stream, not the JSON: a truncated or corrupt compressed file
            raise SourceError(f"{f}: unreadable (corrupt or truncated?): {first_line(exc)}") from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        rows_of.append(rows)
        schemas.append(schema)
    remember_jsonl(fingerprint, files, rows_of, schemas)
    return _jsonl_part_list(files, rows_of, schemas)


def jsonl_manifest(fingerprint: str, files: list[str]) -> tuple[list, list] | None:
    """(rows, schemas) of JSON Lines ``files`` remembered under ``fingerprint``, or None."""
    import pyarrow as pa

    known = _read_manifest(_jsonl_manifest_path(fingerprint), {"path": str, "rows": int, "schema": str})
    if known is None or [e["path"] for e in known] != files:
        return None
    try:
        schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(e["schema"]))) for e in known]
    except (OSError, ValueError, pa.ArrowException):  # never written so: rebuilt
        return None
    return [e["rows"] for e in known], schemas


def remember_jsonl(fingerprint: str, files: list[str], rows_of: list, schemas: list) -> None:
    """Remember each JSON Lines file's rows and schema (``jsonl_manifest`` reads them back)."""
    _write_manifest(_jsonl_manifest_path(fingerprint),
                    [{"path": f, "rows": n, "schema": base64.b64encode(s.serialize().to_pybytes()).decode()}
                     for f, n, s in zip(files, rows_of, schemas)])


def _jsonl_part_list(files, rows_of, schemas) -> list[Part]:
    parts, start = [], 0
    for f, rows, schema in zip(files, rows_of, schemas):
        parts.append(Part(start, f, rows=rows, columns=schema.names, jsonl_schema=schema,
                          loader=_single_file_loader("json", f, {})))
        start += rows
    return parts


def _jsonl_manifest_path(fingerprint: str) -> Path:
    import pyarrow as pa

    return cache_root() / "sources" / f"{fingerprint}-{_checks()}-jsonl-pyarrow{pa.__version__}.json"


def _blank(path: str, *, header: bool = False, text: bool = True) -> bool:
    """The file holds nothing but white space (decompressed as it is read), or with ``header`` (a
    CSV file) nothing but its first line."""
    import pyarrow as pa

    if os.path.getsize(path) == 0:
        return True
    try:
        with open_text(path) if text else open_data(path) as fh:  # an Arrow file is no text
            skipping = header  # the header line: up to the first newline after leading white space
            while chunk := fh.read(1 << 16):
                if skipping:
                    chunk = chunk.lstrip()
                    if not chunk:
                        continue
                    if b"\n" not in chunk:  # still inside the header line
                        continue
                    chunk, skipping = chunk.partition(b"\n")[2], False
                if chunk.strip():
                    # a JSON array file holding an empty array ("[]") or an empty object is zero rows too
                    return format_of(path) == ".json" and len(chunk) < 64 and \
                        bytes(chunk).split() in ([b"[]"], [b"{}"], [b"[", b"]"], [b"{", b"}"])
    except (OSError, EOFError, pa.ArrowException) as exc:
        raise SourceError(f"{path}: unreadable (corrupt or truncated?): {first_line(exc)}") from None
    return True


def _load_parts(spec, files, builder, options, suffix, fingerprint, *, checked: bool = False) -> list[Part]:
    """Convert the files with ``load_dataset`` (one call, one split per file) and remember their shape.
    Unless ``checked`` (done for these files before), JSON Lines files are first checked line by
    line (``json_lines.first_bad_line``), CSV headers for repeated or differing columns."""
    from datasets import load_dataset

    quiet_datasets()
    if not checked:
        _check_before_loading(spec, files, builder, options)
    if builder == "csv":
        from lengthscan.sources.csv_files import text_features

        options = {**options, "features": text_features(files[0], options)}
    _check_codecs(files)
    names = [f"file{i:06d}" for i in range(len(files))]
    try:
        loaded = load_dataset(builder, data_files={n: [f] for n, f in zip(names, files)}, **options)
    except Exception as exc:
        where = next((w for f in files if (w := first_bad_line(f, json_lines=builder == "json")) is not None), None)
        if where is None and builder == "csv":
            from lengthscan.sources.csv_files import different_headers

            where = different_headers(spec, files, options)
        if where is not None:
            raise SourceError(where) from None
        cause = exc
        while cause.__cause__ is not None or cause.__context__ is not None:  # datasets wraps the reader's error
            cause = cause.__cause__ or cause.__context__
        raise SourceError(f"{spec}: cannot read as {suffix[1:]}: {first_line(cause)}") from exc
    parts, start = [], 0
    for name, f in zip(names, files):
        ds = loaded[name]
        try:
            check_nesting(ds.data.schema, lambda f=f: _stream(f, document=builder == "json" and not lines_file(f),
                                                              text=builder != "arrow"))
        except NestingError as exc:
            raise SourceError(f"{f}: {exc}") from None
        except (OSError, EOFError) as exc:
            raise SourceError(f"{f}: unreadable (corrupt or truncated?): {first_line(exc)}") from None
        parts.append(Part(start, f, dataset=ds))
        start += len(ds)
    _remember_parts(fingerprint, parts)
    return parts


def _check_before_loading(spec: str, files: list[str], builder: str, options: dict) -> None:
    """What ``load_dataset`` is not given to find: CSV headers naming a column twice or differing,
    rows over the row limit; JSON Lines files line by line (``json_lines.first_bad_line``); a JSON
    array file, read whole, over its limit or nested too deep. A file whose compressed stream is cut
    short or corrupt is named as unreadable."""
    if builder == "csv":
        from lengthscan.sources.csv_files import check_first_row, check_headers, check_rows

        check_headers(spec, files, options)
    for f in files:
        try:
            if builder == "csv":
                check_rows(f, options)
                check_first_row(f, options)
            elif builder == "json" and lines_file(f):
                if (where := first_bad_line(f, json_lines=True)) is not None:
                    raise SourceError(where)
            elif builder == "json":  # read whole: its size checked, and its readers are slow on deep rows
                too_deep_before_reading(lambda f=f: _stream(f, document=True))
        except NestingError as exc:
            raise SourceError(f"{f}: {exc}") from None
        except (OSError, EOFError) as exc:
            raise SourceError(f"{f}: unreadable (corrupt or truncated?): {first_line(exc)}") from None


def _check_codecs(files: list[str]) -> None:
    """``datasets`` reads zstd through fsspec, which needs the ``zstandard`` package (a dependency)."""
    import importlib.util

    from lengthscan.sources.streams import codec_of

    zstd = next((f for f in files if codec_of(f) == "zstd"), None)
    if zstd is not None and importlib.util.find_spec("zstandard") is None:
        raise SourceError(f"{zstd}: reading this zstd-compressed file needs the zstandard package, which lengthscan "
                          "depends on but is not installed: pip install zstandard")


def _stream(path: str, *, document: bool = False, text: bool = True):
    return open_text(path, document=document) if text else open_data(path)


def _manifest_path(fingerprint: str) -> Path:
    from importlib.metadata import version

    return cache_root() / "sources" / f"{fingerprint}-{_checks()}-datasets{version('datasets')}.json"


def _remember_parts(fingerprint: str, parts: list[Part]) -> None:
    """Rows and columns of each file, so a rerun can skip ``load_dataset`` until it reads rows."""
    _write_manifest(_manifest_path(fingerprint), [{"path": p.path, "start": p.start, "rows": p.rows,
                                                   "columns": p.column_names} for p in parts])


def _checks() -> str:
    """What a file passed when a manifest was written: the checks and the row limit they used."""
    from lengthscan.sources.streams import max_row_bytes

    return f"checks{CHECKS}-row{max_row_bytes()}"


def _write_manifest(path: Path, entries: list) -> None:
    """The entries with their SHA-256, so a damaged or edited manifest is never trusted."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"entries": entries, "sha256": _digest_of(entries)}))
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs speed, never correctness
        pass


def _digest_of(entries: list) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def _read_manifest(path: Path, fields: dict) -> list | None:
    """A manifest's entries, or None: absent, or (with one warning, and removed to be rebuilt)
    unreadable, of another shape, or not matching its own SHA-256."""
    if not regular_cache_file(path):  # missing; or a FIFO, a device, a folder (removed, with a warning)
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, list) and data and isinstance(data[0], dict) and "sha256" not in data[0]:
            return None  # the format before checksums: rewritten by this run, nothing to warn about
        entries = data["entries"]
        ok = data["sha256"] == _digest_of(entries) and all(
            isinstance(e, dict) and all(isinstance(e.get(k), t) and not isinstance(e.get(k), bool)
                                        for k, t in fields.items()) for e in entries)
    except (OSError, ValueError, TypeError, KeyError):
        ok = False
    if ok:
        return entries
    import warnings

    warnings.warn(f"lengthscan: the source cache entry {path} is damaged: ignored and rebuilt", RuntimeWarning,
                  stacklevel=3)
    try:
        path.unlink()
    except OSError:
        pass
    return None


def _cached_parts(fingerprint: str, files: list[str]) -> list[Part] | None:
    entries = _read_manifest(_manifest_path(fingerprint), {"path": str, "start": int, "rows": int, "columns": list})
    if entries is None or [e["path"] for e in entries] != files:
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
                builder, options = FORMATS[format_of(files[0])]
                memo["parts"] = _load_parts(files[0], files, builder, options, format_of(files[0]), fingerprint,
                                            checked=True)
            return memo["parts"][i].dataset
        return load
    return for_part


def _single_file_loader(builder: str, path: str, options: dict):
    def load():
        from datasets import load_dataset

        quiet_datasets()
        return load_dataset(builder, data_files=[path], split="train", **options)
    return load
