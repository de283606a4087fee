"""Where remote files live, one store per scheme: list a URL or glob, stat a file, read a byte range.

Every read is one ranged request for exactly the bytes asked (no read-ahead): pyarrow's
``S3FileSystem``/``GcsFileSystem`` ``read_at``, a ranged GET on fsspec's HTTP session
(``http_store``: the answer checked against the range asked and the file listed), and
``HfFileSystem`` files opened with ``cache_type="none"`` at a revision pinned to a commit sha.
Connections and reads time out (``network.timeouts``). Credentials come from where each
library looks: the AWS environment and configuration (``AWS_ENDPOINT_URL`` too), Google's
application default credentials, ``HF_TOKEN`` and the hub's login; none is ever written anywhere.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from urllib.parse import urlsplit

from lengthscan.sources.remote.http_store import HttpStore
from lengthscan.sources.remote.network import Gone, RemoteEntry, has_magic, timeouts

__all__ = ["store_for", "is_remote", "has_magic", "hub_version", "ArrowStore", "HttpStore", "HubStore"]

#: Seconds a GCS request is retried for before it fails.
GCS_RETRY_S = 15
#: Schemes read remotely.
SCHEMES = ("s3", "gs", "gcs", "http", "https", "hf")


def is_remote(spec) -> bool:
    """``spec`` names a remote file, glob or folder (``s3://``, ``gs://``, ``http(s)://``, ``hf://``)."""
    return isinstance(spec, str) and urlsplit(spec).scheme.lower() in SCHEMES and "://" in spec


def store_for(url: str):
    """The store of ``url``'s scheme (one per scheme, endpoint and process: each keeps its connections)."""
    scheme = urlsplit(url).scheme.lower()
    kind = {"gcs": "gs", "https": "http"}.get(scheme, scheme)
    key = (kind, *(os.environ.get(v) for v in _ENDPOINT_VARS.get(kind, ())))
    with _LOCK:
        if key not in _STORES:
            _STORES[key] = {"s3": ArrowStore.s3, "gs": ArrowStore.gcs, "http": HttpStore, "hf": HubStore}[kind]()
        return _STORES[key]


#: The environment that says where a scheme's store is (a store is made anew when it changes).
_ENDPOINT_VARS = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                         "LENGTHSCAN_HTTP_TIMEOUT"),
                  "http": ("LENGTHSCAN_HTTP_TIMEOUT",), "hf": ("HF_ENDPOINT",)}


_STORES: dict = {}
_LOCK = threading.Lock()


class ArrowStore:
    """Object storage through pyarrow's own filesystems (no fsspec, no botocore pin)."""

    def __init__(self, fs, scheme: str):
        self.fs, self.scheme = fs, scheme

    @classmethod
    def s3(cls) -> "ArrowStore":
        from pyarrow import fs

        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs = {}
        if endpoint:
            parts = urlsplit(endpoint)
            kwargs = {"endpoint_override": parts.netloc or parts.path, "scheme": parts.scheme or "https"}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        connect, read = timeouts()
        return cls(fs.S3FileSystem(connect_timeout=connect, request_timeout=read, **kwargs), "s3")

    @classmethod
    def gcs(cls) -> "ArrowStore":
        """Google Cloud Storage with the application default credentials where there are some
        (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's file, a token in ``GCS_ACCESS_TOKEN``), else
        anonymous (public buckets): the credentials' search on a machine outside Google Cloud asks a
        metadata server that never answers, in C++ where Ctrl-C cannot stop it. ``STORAGE_EMULATOR_HOST``
        is an endpoint (a local emulator). Requests give up after ``GCS_RETRY_S`` seconds."""
        import datetime
        from pathlib import Path

        from pyarrow import fs

        kwargs: dict = {"retry_time_limit": datetime.timedelta(seconds=GCS_RETRY_S)}
        adc = Path.home() / ".config" / "gcloud" / "application_default_credentials.json"
        if os.environ.get("GCS_ACCESS_TOKEN"):
            kwargs.update(access_token=os.environ["GCS_ACCESS_TOKEN"],
                          credential_token_expiration=datetime.datetime.now() + datetime.timedelta(hours=1))
        elif not (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or adc.is_file()):
            kwargs["anonymous"] = True
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            parts = urlsplit(os.environ["STORAGE_EMULATOR_HOST"])
            kwargs.update(endpoint_override=parts.netloc or parts.path, scheme=parts.scheme or "http")
        return cls(fs.GcsFileSystem(**kwargs), "gs")

    def _path(self, url: str) -> str:
        """The bucket and key (user information and query string are not part of them)."""
        parts = urlsplit(url)
        return f"{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def _entry(self, info) -> RemoteEntry:
        return RemoteEntry(self._url(info.path), int(info.size), str(info.mtime_ns))

    def list(self, url: str) -> list[RemoteEntry]:
        from pyarrow import fs

        path = self._path(url)
        if not has_magic(url):
            info = self.fs.get_file_info(path)
            if info.type == fs.FileType.File:
                return [self._entry(info)]
            if info.type != fs.FileType.Directory:
                return []
            selector, pattern = fs.FileSelector(path.rstrip("/"), recursive=True), None
        else:
            fixed = path.split("*")[0].split("?")[0].split("[")[0].rsplit("/", 1)[0]
            selector, pattern = fs.FileSelector(fixed, recursive=True, allow_not_found=True), path
        infos = [i for i in self.fs.get_file_info(selector) if i.type == fs.FileType.File]
        if pattern is not None:
            infos = [i for i in infos if _glob_match(i.path, pattern)]
        return sorted((self._entry(i) for i in infos), key=lambda e: e.url)

    def stat(self, url: str) -> RemoteEntry | None:
        from pyarrow import fs

        info = self.fs.get_file_info(self._path(url))
        return self._entry(info) if info.type == fs.FileType.File else None

    def opener(self, entry: RemoteEntry):
        """A function reading ``[start, end)`` of the file."""
        handle: list = []

        def read(start: int, end: int) -> bytes:
            if not handle:
                handle.append(self.fs.open_input_file(self._path(entry.url)))
            try:
                return handle[0].read_at(end - start, start)
            except BaseException:
                handle.clear()  # reopened by the next attempt
                raise
        return read


class HubStore:
    """``hf://`` paths through ``huggingface_hub``'s ``HfFileSystem`` (endpoint from ``HF_ENDPOINT``,
    token from ``HF_TOKEN`` or the login), every read a ranged GET of a revision-pinned URL."""

    def __init__(self):
        from huggingface_hub import HfFileSystem

        endpoint = os.environ.get("HF_ENDPOINT") or None
        self.fs = HfFileSystem(endpoint=endpoint, skip_instance_cache=True)

    def _strip(self, url: str) -> str:
        return url[len("hf://"):] if url.startswith("hf://") else url

    def _entry(self, path: str, info: dict) -> RemoteEntry:
        return RemoteEntry(f"hf://{path}", int(info["size"]), hub_version(info.get("lfs"), info.get("blob_id")))

    def _pinned(self, path: str) -> str:
        """``path`` at its revision's commit sha (``datasets/ID@SHA/...``), asked once: a push during
        the run cannot mix two versions."""
        import re

        from huggingface_hub import HfApi

        resolved = self.fs.resolve_path(path)
        if re.fullmatch(r"[0-9a-f]{40}", resolved.revision or ""):
            return path
        api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        sha = api.repo_info(resolved.repo_id, repo_type=resolved.repo_type, revision=resolved.revision).sha
        prefix = {"dataset": "datasets/", "space": "spaces/"}.get(resolved.repo_type, "")
        return f"{prefix}{resolved.repo_id}@{sha}/{resolved.path_in_repo}".rstrip("/")

    def list(self, url: str) -> list[RemoteEntry]:
        try:
            path = self._pinned(self._strip(url))
        except FileNotFoundError:
            return []
        if has_magic(path):
            infos = self.fs.glob(path, detail=True)
        else:
            try:
                info = self.fs.info(path)
            except FileNotFoundError:
                return []
            infos = {path: info} if info["type"] == "file" else self.fs.find(path, detail=True)
        return sorted((self._entry(p, i) for p, i in infos.items() if i.get("type") == "file"), key=lambda e: e.url)

    def stat(self, url: str) -> RemoteEntry | None:
        try:
            return self._entry(self._strip(url), self.fs.info(self._strip(url), refresh=True))
        except FileNotFoundError:
            return None

    def opener(self, entry: RemoteEntry):
        handle: list = []

        def read(start: int, end: int) -> bytes:
            if not handle:
                handle.append(self.fs.open(self._strip(entry.url), "rb", cache_type="none", size=entry.size))
            try:
                handle[0].seek(start)
                data = handle[0].read(end - start)
            except FileNotFoundError as exc:
                raise Gone(f"no longer there: {exc}") from None
            except BaseException:
                handle.clear()
                raise
            if len(data) > end - start:
                raise Gone(f"the server answered {len(data):,} bytes to a request for {end - start:,}")
            return data
        return read


def hub_version(lfs, blob_id) -> str:
    """A hub file's version: its LFS sha256, else its git blob id ('' when the listing gave neither)."""
    sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
    return str(sha or blob_id or "")


def _glob_match(path: str, pattern: str) -> bool:
    """A glob over object keys: ``*`` and ``?`` within one path level, ``**`` across levels."""
    if "**" in pattern:
        return fnmatch.fnmatchcase(path, pattern.replace("**/", "*").replace("**", "*"))
    return len(path.split("/")) == len(pattern.split("/")) and fnmatch.fnmatchcase(path, pattern)
