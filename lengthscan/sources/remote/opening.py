"""Open remote files and globs as a ``Source``: Parquet from its footers (row groups are the
blocks a block sample draws), JSON Lines streamed with pyarrow, CSV/TSV streamed with pyarrow's
CSV reader (every column as text, as local CSV is read). The datasets cache is never filled.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field

from lengthscan.sources.parquet_pages import PageIndex, page_blocks
from lengthscan.sources.remote.network import Gone, RemoteEntry, has_magic, is_timeout, timeout_text
from lengthscan.sources.remote.remote_file import Traffic, input_stream, parquet_file
from lengthscan.sources.remote.stores import is_remote, store_for
from lengthscan.sources.source import (
    FORMATS,
    Part,
    Source,
    SourceError,
    SplitSource,
    digest,
    first_line,
    format_of,
)
from lengthscan.sources.urls import display_url

__all__ = ["RemoteFiles", "is_remote", "open_remote", "remote_split", "list_remote"]


@dataclass(eq=False)
class RemoteFiles:
    """The remote files of a source, what reading them cost, and how they were found. Files are
    keyed by their shown name (``RemoteEntry.name``: no credentials, no query string), the name
    their parts, rows and messages carry; only their entries hold the URL read."""

    entries: dict[str, RemoteEntry]
    traffic: Traffic = field(default_factory=Traffic)
    resolved: str = "the files named"  # how the files were found (a hub id's Parquet files ...)
    revision: str | None = None        # the hub commit sha every file was read at
    notes: tuple[str, ...] = ()
    _parquet: dict = field(default_factory=dict)
    _pages: dict = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __getstate__(self) -> dict:
        """Picklable (the Ray engine's actors read the files): without the opened footers and the lock."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_parquet", "_pages", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _parquet={}, _pages={}, _lock=threading.RLock())

    @property
    def bytes_total(self) -> int:
        return sum(e.size for e in self.entries.values())

    def parquet(self, url: str):
        """The file's ``ParquetFile``, its footer read once for the run."""
        return self._opened(url)[0]

    def page_index(self, url: str) -> PageIndex:
        """The file's raw footer and page index (``parquet_pages``), read through the same counted file."""
        with self._lock:
            if url not in self._pages:
                _, footer, raw = self._opened(url)
                self._pages[url] = PageIndex(footer, raw.read_range)
            return self._pages[url]

    def _opened(self, url: str) -> tuple:
        with self._lock:
            if url not in self._parquet:
                self._parquet[url] = parquet_file(self.entries[url], self.traffic)
            return self._parquet[url]

    def blocks(self, url: str, groups: tuple[int, ...], columns: list[str]) -> list[int]:
        """The file's blocks for a block sample: each row group, or the page blocks of a huge one
        whose ``columns`` are all flat with a page index (``parquet_pages.PageIndex.sub_blocks``)."""
        return page_blocks(self.parquet(url).metadata, lambda: self.page_index(url), groups, columns)

    def stream(self, url: str):
        return input_stream(self.entries[url], self.traffic)

    def check_unchanged(self, url: str) -> None:
        """The file is still the one listed (size and version), asked again after it was read."""
        entry = self.entries[url]
        try:
            now = store_for(entry.url).stat(entry.url)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"{url}: cannot be asked again after it was read (is it unchanged?): "
                              f"{first_line(exc)}") from None
        if now is None:
            raise SourceError(f"{url}: the file disappeared during the run")
        # a version is compared where both listings give one (the hub's refreshed info gives sizes only;
        # its files are read at a commit sha, which never changes)
        if now.size != entry.size or now.version and entry.version and now.version != entry.version:
            raise SourceError(f"{url}: the file changed during the run (size {entry.size:,} -> {now.size:,}, "
                              f"version {entry.version!r} -> {now.version!r}); its rows would mix two versions: "
                              "run again")

    def to_dict(self) -> dict:
        """The report's account: files, bytes read of bytes total, requests, retries, how they were found
        (no bytes for a ``load_dataset`` fallback, which reads through datasets' own download)."""
        counted = bool(self.entries)
        return {"location": "remote", "resolved": self.resolved, "revision": self.revision,
                "files": len(self.entries) if counted else None,
                "bytes_total": self.bytes_total if counted else None,
                "bytes_read": self.traffic.bytes_read if counted else None,
                "requests": self.traffic.requests if counted else None,
                "retries": self.traffic.retries if counted else None, "notes": list(self.notes)}


def list_remote(spec: str) -> list[RemoteEntry]:
    """The files a remote URL, folder or glob names, sorted; a ``SourceError`` when none or unreachable."""
    try:
        entries = store_for(spec).list(spec)
    except SourceError:
        raise
    except Gone as exc:
        raise SourceError(str(exc)) from None
    except Exception as exc:
        why = timeout_text(exc) if is_timeout(exc) else first_line(exc)
        raise SourceError(f"{display_url(spec)}: cannot list: {why}") from None
    if has_magic(spec) or spec.endswith("/"):
        entries = [e for e in entries if format_of(e.name)]
    if not entries:
        raise SourceError(f"{display_url(spec)}: matches no data file ({', '.join(FORMATS)}, optionally compressed)")
    return entries


def open_remote(spec: str, split: str | None, *, entries: list[RemoteEntry] | None = None) -> Source:
    """A remote file, folder or glob as a one-split source."""
    shown = display_url(spec)
    if split not in (None, "train"):
        raise SourceError(f"{shown}: data files have one split, 'train'; --split {split} does not exist")
    entries = list_remote(spec) if entries is None else entries
    shas = {m.group(1) for e in entries if (m := re.search(r"@([0-9a-f]{40})/", e.name))}
    revision = next(iter(shas)) if len(shas) == 1 else None  # hf:// files, pinned to their commit
    files = RemoteFiles(by_name(entries), revision=revision,
                        resolved="the files named" + (f" at hub commit {revision}" if revision else ""))
    return Source(shown, _format(shown, entries)[1:], (remote_split("train", entries, files),), False, remote=files)


def by_name(entries) -> dict[str, RemoteEntry]:
    """``entries`` keyed by their shown name; two files that only their query strings tell apart are refused."""
    out: dict[str, RemoteEntry] = {}
    for e in entries:
        if out.setdefault(e.name, e) is not e:
            raise SourceError(f"{e.name}: two files of the source have this name once their query strings are "
                              "dropped (lengthscan never shows a query string): give each file its own path")
    return out


def remote_split(name: str, entries: list[RemoteEntry], files: RemoteFiles) -> SplitSource:
    """One split read from ``entries`` (all of one format), their reads counted in ``files``."""
    suffix = _format(name, entries)
    builder, options = FORMATS[suffix]
    stamp = [(e.name, e.size, e.version) for e in entries]
    fingerprint = digest(json.dumps(["remote", builder, options, stamp], default=str))[:16]
    if builder == "parquet":
        parts = _parquet_parts(entries, files)
    elif builder == "json":
        parts = _jsonl_parts(entries, files, fingerprint)
    elif builder == "csv":
        from lengthscan.sources.csv_files import remote_csv_parts

        parts = remote_csv_parts(entries, files, options)
    else:
        raise SourceError(f"{entries[0].name}: {suffix} files are read locally only; give Parquet, JSON Lines or "
                          "CSV/TSV files")
    return SplitSource(name, tuple(parts), fingerprint)


def _format(spec: str, entries: list[RemoteEntry]) -> str:
    formats = {format_of(e.name) for e in entries}
    if None in formats:
        bad = next(e.name for e in entries if format_of(e.name) is None)
        raise SourceError(f"{bad}: unknown file type (supported: {', '.join(FORMATS)}, optionally compressed)")
    if len(formats) > 1:
        raise SourceError(f"{spec}: files of several formats ({', '.join(sorted(formats))}); give one format")
    return formats.pop()


def _parquet_parts(entries: list[RemoteEntry], files: RemoteFiles) -> list[Part]:
    from lengthscan.sources.features import features_without_views

    parts, start = [], 0
    for e in entries:
        try:
            pf = files.parquet(e.name)
            meta, schema = pf.metadata, pf.schema_arrow
        except SourceError:
            raise
        except Exception as exc:
            files.check_unchanged(e.name)  # rewritten while its footer was read: said so
            raise SourceError(f"{e.name}: cannot read as parquet: {first_line(exc)}") from None
        if features_without_views(schema) is not None:
            raise SourceError(f"{e.name}: has view columns (string_view ...), which lengthscan converts with datasets "
                              "from local files only: download the file first")
        groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        parts.append(Part(start, e.name, rows=meta.num_rows, columns=schema.names, parquet=True, remote=files,
                          groups=groups, schema=schema))
        start += meta.num_rows
    return parts


def _jsonl_parts(entries: list[RemoteEntry], files: RemoteFiles, fingerprint: str) -> list[Part]:
    """JSON Lines files, each streamed once to count its rows and learn its schema (remembered in
    the cache for the same files at the same versions: a rerun reads only the rows it measures)."""
    from lengthscan.sources.files import jsonl_manifest, remember_jsonl
    from lengthscan.sources.json_lines import NestingError, json_lines_layout
    from lengthscan.sources.streams import LineError

    known = jsonl_manifest(fingerprint, [e.name for e in entries])
    if known is None:
        rows_of, schemas = [], []
        for e in entries:
            try:
                rows, schema = json_lines_layout(lambda e=e: files.stream(e.name), long_lines=True)
            except (NestingError, LineError) as exc:  # a row too deep or too long, its line named
                raise SourceError(f"{e.name}: {exc}") from None
            except SourceError:
                raise
            except Exception as exc:
                files.check_unchanged(e.name)  # rewritten while it was counted: said so
                raise SourceError(f"{e.name}: cannot read as JSON Lines (one JSON object a line; a JSON array file "
                                  f"is read from local disk only): {first_line(exc)}") from None
            rows_of.append(rows)
            schemas.append(schema)
        remember_jsonl(fingerprint, [e.name for e in entries], rows_of, schemas)
    else:
        rows_of, schemas = known
    parts, start = [], 0
    for e, rows, schema in zip(entries, rows_of, schemas):
        parts.append(Part(start, e.name, rows=rows, columns=schema.names, jsonl_schema=schema, remote=files))
        start += rows
    return parts


def open_hub_files(spec: str, hub, split: str | None) -> Source:
    """A hub dataset resolved to Parquet files (``hub_ids.HubFiles``): one split or all of them."""
    names = list(hub.splits)
    if split is not None and split not in hub.splits:
        raise SourceError(f"{spec}: no split {split!r}; splits are {', '.join(names)}")
    chosen = [split] if split is not None else names
    files = RemoteFiles(by_name(e for s in chosen for e in hub.splits[s]), resolved=hub.resolved, revision=hub.sha,
                        notes=hub.notes)
    splits = tuple(remote_split(s, hub.splits[s], files) for s in chosen)
    return Source(spec, "hub", splits, True, remote=files)
