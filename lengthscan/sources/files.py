"""File sources: data files and globs (JSONL/JSON, CSV/TSV read by ``load_dataset``, Parquet read
directly with pyarrow), with a manifest of each file's rows and columns so a rerun can skip
``load_dataset`` until it reads rows; and audio folders."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from lengthscan.sources.cache_dir import cache_root
from lengthscan.sources.source import (
    FORMATS,
    TRANSCRIPT_SUFFIXES,
    Part,
    Source,
    SourceError,
    SplitSource,
    digest,
    first_line,
    format_of,
    quiet_datasets,
)


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
    if builder != "parquet":  # an empty file (or shard of a glob) holds zero rows: left out
        files = [f for f in files if not _blank(f)]
        if not files:
            raise SourceError(f"{spec}: holds no rows (every file is empty)")
    stamp = [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
    fingerprint = digest(json.dumps([builder, options, stamp], default=str))[:16]
    if builder == "parquet":
        parts = _parquet_parts(spec, files)
    elif builder == "json" and (parts := _jsonl_parts(files, fingerprint)) is not None:
        pass
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
            raise SourceError(f"{f}: cannot read as parquet: {first_line(exc)}") from exc
        names = meta.schema.to_arrow_schema().names
        parts.append(Part(start, f, rows=meta.num_rows, columns=names, parquet=True,
                          loader=_single_file_loader("parquet", f, {})))
        start += meta.num_rows
    return parts


def _jsonl_parts(files: list[str], fingerprint: str) -> list[Part] | None:
    """JSON Lines read directly with pyarrow's streaming reader: one pass counts the rows and checks
    that every line parses with one schema (remembered in the cache for the same files, unchanged).
    None (use ``load_dataset``, which handles more) for a JSON array file, a column whose type
    changes, or a line longer than the reader's block."""
    import pyarrow as pa
    import pyarrow.json as pj

    known = _jsonl_manifest(fingerprint)
    if known is not None and [e["path"] for e in known] == files:
        return _jsonl_part_list(files, [e["rows"] for e in known],
                                [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(e["schema"]))) for e in known])
    rows_of, schemas = [], []
    for f in files:
        if not looks_like_lines(f):
            return None
        try:
            reader = pj.open_json(pa.input_stream(f, compression="detect"), read_options=json_read_options())
            rows_of.append(sum(batch.num_rows for batch in reader))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
            return None
        schemas.append(reader.schema)
    _write_manifest(_jsonl_manifest_path(fingerprint),
                    [{"path": f, "rows": n, "schema": base64.b64encode(s.serialize().to_pybytes()).decode()}
                     for f, n, s in zip(files, rows_of, schemas)])
    return _jsonl_part_list(files, rows_of, schemas)


def _jsonl_part_list(files, rows_of, schemas) -> list[Part]:
    parts, start = [], 0
    for f, rows, schema in zip(files, rows_of, schemas):
        parts.append(Part(start, f, rows=rows, columns=schema.names, jsonl_schema=schema,
                          loader=_single_file_loader("json", f, {})))
        start += rows
    return parts


def _jsonl_manifest_path(fingerprint: str) -> Path:
    import pyarrow as pa

    return cache_root() / "sources" / f"{fingerprint}-jsonl-pyarrow{pa.__version__}.json"


def _jsonl_manifest(fingerprint: str) -> list | None:
    try:
        return json.loads(_jsonl_manifest_path(fingerprint).read_text())
    except (OSError, ValueError):
        return None


def json_read_options():
    """Blocks of 1 MiB: lines up to that long stream directly (longer ones go through datasets); the
    reader reads a bounded number of blocks ahead, so its memory stays a few tens of MiB at most."""
    import pyarrow.json as pj

    return pj.ReadOptions(block_size=1 << 20)


def _blank(path: str) -> bool:
    """The file holds nothing but white space (decompressed as it is read)."""
    import pyarrow as pa

    if os.path.getsize(path) == 0:
        return True
    try:
        with pa.input_stream(path, compression="detect") as fh:
            while chunk := fh.read(1 << 16):
                if chunk.strip():
                    return False
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{path}: unreadable (corrupt or truncated?): {exc}") from None
    return True


def looks_like_lines(path: str) -> bool:
    """A JSON Lines file starts with an object, a JSON array file with '['."""
    import pyarrow as pa

    with pa.input_stream(path, compression="detect") as fh:
        head = fh.read(4096).lstrip()
    return head[:1] == b"{"


def _load_parts(spec, files, builder, options, suffix, fingerprint) -> list[Part]:
    """Convert the files with ``load_dataset`` (one call, one split per file) and remember their shape."""
    from datasets import load_dataset

    quiet_datasets()
    names = [f"file{i:06d}" for i in range(len(files))]
    try:
        loaded = load_dataset(builder, data_files={n: [f] for n, f in zip(names, files)}, **options)
    except Exception as exc:
        raise SourceError(f"{spec}: cannot read as {suffix[1:]}: {first_line(exc)}") from exc
    parts, start = [], 0
    for name, f in zip(names, files):
        ds = loaded[name]
        parts.append(Part(start, f, dataset=ds))
        start += len(ds)
    _remember_parts(fingerprint, parts)
    return parts


def _manifest_path(fingerprint: str) -> Path:
    from importlib.metadata import version

    return cache_root() / "sources" / f"{fingerprint}-datasets{version('datasets')}.json"


def _remember_parts(fingerprint: str, parts: list[Part]) -> None:
    """Rows and columns of each file, so a rerun can skip ``load_dataset`` until it reads rows."""
    _write_manifest(_manifest_path(fingerprint), [{"path": p.path, "start": p.start, "rows": p.rows,
                                                   "columns": p.column_names} for p in parts])


def _write_manifest(path: Path, entries: list) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries))
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
                builder, options = FORMATS[format_of(files[0])]
                memo["parts"] = _load_parts(files[0], files, builder, options, format_of(files[0]), fingerprint)
            return memo["parts"][i].dataset
        return load
    return for_part


def _single_file_loader(builder: str, path: str, options: dict):
    def load():
        from datasets import load_dataset

        quiet_datasets()
        return load_dataset(builder, data_files=[path], split="train", **options)
    return load


def open_audio_folder(spec: str, files: list[str], split: str | None) -> Source:
    """One row per audio file in sorted path order: ``audio`` (absolute path) and ``text``.

    ``text`` is the content of a sidecar ``.txt``/``.lab`` with the same stem, None without one.
    """
    from datasets import Dataset

    quiet_datasets()
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
                raise SourceError(f"{sidecar}: cannot read the transcript: {first_line(exc)}") from exc
        texts.append(text)
        for f in (path, sidecar) if sidecar else (path,):
            st = os.stat(f)
            stamp.append((f, st.st_size, st.st_mtime_ns))
    ds = Dataset.from_dict({"audio": paths, "text": texts})
    fingerprint = digest(json.dumps(["audiofolder", stamp]))[:16]
    return Source(spec, "audiofolder", (SplitSource("train", (Part(0, None, dataset=ds),), fingerprint),), False)
