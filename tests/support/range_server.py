"""A small real HTTP server for offline tests of remote sources.

It serves two layouts from the local disk, on ``127.0.0.1`` and a free port, from a daemon thread:

* plain files: every file under ``root`` at ``{url}/files/{relative path}`` (GET and HEAD, single byte ranges,
  ``ETag``/``If-Match``, ``Last-Modified``) and, for a directory, an HTML index whose links fsspec's
  ``HTTPFileSystem`` follows for ``ls``/``glob``;
* the Hugging Face Hub: what ``huggingface_hub``'s ``HfApi`` and ``HfFileSystem`` call for dataset repositories
  (repo info, tree listing, paths-info, commits and ``resolve`` downloads), reached with ``HF_ENDPOINT={url}`` or
  ``endpoint=url``. Revisions may be branch names, special refs such as ``refs/convert/parquet`` (quoted or not)
  or commit shas.

It counts the file bytes it sends (not the JSON of the API), records every request and can fail data requests on
demand, so that tests can check what a reader fetched and how it retries.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

_CHUNK = 64 * 1024
# Files the Hub would store with Git LFS: these suffixes, or anything over the Hub's 10 MB limit for plain git.
_LFS_SUFFIXES = {".parquet", ".arrow", ".bin", ".safetensors", ".pt", ".npy", ".npz", ".zip", ".gz", ".zst",
                 ".tar", ".wav", ".mp3", ".flac", ".png", ".jpg"}
_LFS_MIN_SIZE = 10 * 1024 * 1024


@dataclass
class RequestRecord:
    """One request as the server answered it. ``kind`` is ``file``, ``index``, ``resolve`` or ``api``;
    ``body_bytes`` counts file data only (0 for HEAD, indexes, API answers and failures)."""

    method: str
    path: str
    range: str | None
    status: int
    kind: str
    body_bytes: int = 0


@dataclass
class _Commit:
    folder: Path
    date: str


@dataclass
class _Repo:
    refs: dict[str, str]  # branch or special ref -> commit sha
    commits: dict[str, _Commit]  # commit sha -> its files
    card_data: dict


@dataclass
class Misbehaviour:
    """How a server gets file requests wrong (``RangeServer.misbehave``):

    * ``moved``: a ranged GET starting at a key of ``moved`` is answered 206 with as many bytes from the value on,
      its ``Content-Range`` saying so (``lie=True``: saying the range asked), as a broken cache or proxy does;
    * ``whole``: a ranged GET is answered 200 with the first ``len(range)`` bytes of the file and no
      ``Content-Range``; ``no_ranges``: with the whole file (a server without Range support);
    * ``stall``: the methods named (``"GET"``, ``"GET HEAD"``) are accepted and never answered, until
      ``clear_faults()`` or ``stop()``;
    * ``ignore_if_match``: ``If-Match`` is ignored (the file is served whatever its ETag);
    * ``bare``: GET answers carry no ``ETag`` nor ``Last-Modified`` (HEAD answers do);
    * ``weak_etag``: the ETag is weak (``W/"..."``), which ``If-Match`` never matches (RFC 9110's strong
      comparison);
    * ``head_status``: a HEAD is answered with this status and nothing else (as S3 answers 403 to a HEAD of a URL
      signed for GET);
    * ``swap_after``/``swap_to``: after that many data GETs of the path, the file is replaced by ``swap_to``
      (a new file: another size, modification time and ETag);
    * ``drip``: a GET's body is sent 16 bytes at a time, this many seconds apart (never silent for long,
      yet slower than any reader can wait for), until ``clear_faults()`` or ``stop()``.
    """

    moved: dict | None = None
    lie: bool = False
    whole: bool = False
    no_ranges: bool = False
    stall: str = ""
    ignore_if_match: bool = False
    bare: bool = False
    head_status: int | None = None
    weak_etag: bool = False
    swap_after: int | None = None
    swap_to: bytes | None = None
    drip: float = 0.0
    gets: int = 0


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class RangeServer:
    """A threaded HTTP server over ``root`` (plain files) and registered Hub dataset repositories.

    Use it as ``with RangeServer(root) as srv:`` or with ``start()``/``stop()``. Counters (``bytes_served``,
    ``bytes_by_path`` keyed by the unquoted URL path, ``requests``) are snapshots taken under a lock.
    """

    tree_page_size = 1000  # entries per page of the Hub's tree endpoint (50 with expand=True), as the Hub pages
    tree_page_size_expand = 50

    def __init__(self, root: str | os.PathLike | None = None, host: str = "127.0.0.1"):
        self.root = Path(root).resolve() if root is not None else None
        self.host = host
        self.port: int | None = None
        self._lock = threading.Lock()
        self._bytes_served = 0
        self._bytes_by_path: dict[str, int] = {}
        self._requests: list[RequestRecord] = []
        self._fail_next: list[int] = []  # one status per request still to fail
        self._fail_paths: dict[str, int] = {}
        self._misbehaviours: dict[str, Misbehaviour] = {}
        self._released = threading.Event()  # set to let stalled requests go (``clear_faults``, ``stop``)
        self._repos: dict[str, _Repo] = {}
        self._hashes: dict[tuple, tuple[str, str]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._temp_dirs: list[str] = []

    # -- life cycle --------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RangeServer is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> RangeServer:
        if self._server is not None:
            return self
        self._server = _Server((self.host, 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"range-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._released.set()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = self._thread = None
        for d in self._temp_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._temp_dirs.clear()

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def file_url(self, relative: str) -> str:
        """The URL of a file (or, with a trailing ``/``, a directory index) under ``root``."""
        return f"{self.url}/files/{quote(relative)}"

    # -- accounting --------------------------------------------------------------------------------------------

    @property
    def bytes_served(self) -> int:
        with self._lock:
            return self._bytes_served

    @property
    def bytes_by_path(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes_by_path)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._requests)

    def bytes_for(self, substring: str) -> int:
        """File bytes sent for every URL path that contains ``substring``."""
        with self._lock:
            return sum(n for p, n in self._bytes_by_path.items() if substring in p)

    def reset_counts(self) -> None:
        with self._lock:
            self._bytes_served = 0
            self._bytes_by_path.clear()
            self._requests.clear()

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._requests.append(record)

    def _count(self, record: RequestRecord, n: int) -> None:
        with self._lock:
            record.body_bytes += n
            self._bytes_served += n
            self._bytes_by_path[record.path] = self._bytes_by_path.get(record.path, 0) + n

    # -- faults ------------------------------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 503) -> None:
        """The next ``n`` data requests (GETs of file bytes) answer ``status`` with an empty body."""
        with self._lock:
            self._fail_next.extend([status] * n)

    def fail_path(self, path_substring: str, status: int = 503) -> None:
        """Every data request whose URL path contains ``path_substring`` fails until ``clear_faults()``."""
        with self._lock:
            self._fail_paths[path_substring] = status

    def misbehave(self, path_substring: str, **how) -> None:
        """Requests for file paths containing ``path_substring`` misbehave as ``Misbehaviour(**how)`` says, until
        ``clear_faults()``."""
        with self._lock:
            self._misbehaviours[path_substring] = Misbehaviour(**how)
            self._released.clear()

    def clear_faults(self) -> None:
        with self._lock:
            self._fail_next.clear()
            self._fail_paths.clear()
            self._misbehaviours.clear()
        self._released.set()

    def _misbehaviour_for(self, path: str) -> Misbehaviour | None:
        with self._lock:
            return next((m for sub, m in self._misbehaviours.items() if sub in path), None)

    def _fault_for(self, path: str) -> int | None:
        with self._lock:
            if self._fail_next:
                return self._fail_next.pop(0)
            for sub, status in self._fail_paths.items():
                if sub in path:
                    return status
        return None

    # -- Hub repositories --------------------------------------------------------------------------------------

    def add_dataset(self, repo_id: str, revisions: dict[str, tuple[str | os.PathLike, str]],
                    card_data: dict | None = None) -> None:
        """Register a dataset repo: ``revisions`` maps a revision name (``main``, ``refs/convert/parquet``) to
        (the folder holding that revision's files, its 40-hex commit sha). The first name is the default branch
        unless ``main`` is given."""
        repo = _Repo(refs={}, commits={}, card_data=dict(card_data or {}))
        for name, (folder, sha) in revisions.items():
            _check_sha(sha)
            repo.refs[name] = sha
            repo.commits.setdefault(sha, _Commit(Path(folder).resolve(), _now()))
        with self._lock:
            self._repos[repo_id] = repo

    def set_revision_sha(self, repo_id: str, revision: str, new_sha: str,
                         folder: str | os.PathLike | None = None) -> None:
        """Move (or create) ``revision`` to the commit ``new_sha``; ``folder`` holds its files unless that
        commit is already known. Other commits stay reachable by their sha."""
        _check_sha(new_sha)
        with self._lock:
            repo = self._repos[repo_id]
            if folder is not None:
                repo.commits[new_sha] = _Commit(Path(folder).resolve(), _now())
            elif new_sha not in repo.commits:
                raise ValueError(f"unknown commit {new_sha}: give the folder holding its files")
            repo.refs[revision] = new_sha

    def _resolve_revision(self, repo_id: str, revision: str | None) -> tuple[str, _Commit]:
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                raise _HubError(404, "RepoNotFound", "Repository not found")
            if revision is None:
                revision = "main" if "main" in repo.refs else next(iter(repo.refs))
            sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
            if sha is None:
                raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return sha, repo.commits[sha]

    def _known_revision(self, repo_id: str, revision: str) -> bool:
        with self._lock:
            repo = self._repos.get(repo_id)
            return repo is not None and (revision in repo.refs or revision in repo.commits)

    def _file_hashes(self, path: Path, st: os.stat_result) -> tuple[str, str]:
        """(git blob oid, sha256) of a file, cached while its size, mtime and inode stay the same."""
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            cached = self._hashes.get(key)
        if cached is None:
            blob = hashlib.sha1(f"blob {st.st_size}\0".encode())
            sha256 = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    blob.update(chunk)
                    sha256.update(chunk)
            cached = (blob.hexdigest(), sha256.hexdigest())
            with self._lock:
                self._hashes[key] = cached
        return cached


def hub_env(srv: RangeServer, hf_home: str | os.PathLike | None = None) -> dict[str, str]:
    """A copy of ``os.environ`` for a subprocess that talks to ``srv`` as its Hub: online, no telemetry, no Xet,
    and ``HF_HOME`` in ``hf_home`` (or a temporary folder removed when the server stops)."""
    env = dict(os.environ)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        env.pop(name, None)
    env["HF_ENDPOINT"] = srv.url
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from huggingface_hub import constants

    if hasattr(constants, "HF_HUB_DISABLE_XET"):
        env["HF_HUB_DISABLE_XET"] = "1"
    if hf_home is None:
        hf_home = tempfile.mkdtemp(prefix="hf-home-")
        srv._temp_dirs.append(hf_home)
    env["HF_HOME"] = str(hf_home)
    return env


# -- the HTTP side ---------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: RangeServer

    def __init__(self, *args, **kwargs):
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake the threads that wait on kept-alive connections, so that none outlives the server."""
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "RangeServer/1"
    timeout = 60  # an idle kept-alive connection closes after this
    server: _Server

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    # -- routing -----------------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        self.srv = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        self.query = parse_qs(split.query, keep_blank_values=True)
        self.url_path = unquote(split.path)
        segments = split.path.split("/")[1:]
        try:
            if segments[0] == "files" and self.command in ("GET", "HEAD"):
                self._plain(segments[1:])
            elif segments[0] == "api" and len(segments) >= 4 and segments[1] in ("datasets", "models", "spaces"):
                self._api(segments[1], f"{unquote(segments[2])}/{unquote(segments[3])}", segments[4:])
            elif (segments[0] == "datasets" and len(segments) >= 6 and segments[3] == "resolve"
                  and self.command in ("GET", "HEAD")):
                self._resolve(f"{unquote(segments[1])}/{unquote(segments[2])}", segments[4:])
            else:
                self._json(404, {"error": "Not Found"}, kind="api")
        except _HubError as e:
            headers = {"X-Error-Code": e.code} if e.code else {}
            if e.commit:
                headers["X-Repo-Commit"] = e.commit
            self._json(e.status, {"error": e.message}, kind="api", headers=headers)

    def _plain(self, segments: list[str]) -> None:
        root = self.srv.root
        target = _inside(root, "/".join(unquote(s) for s in segments)) if root is not None else None
        if target is None or not target.exists():
            self._empty(404, kind="file")
        elif target.is_dir():
            self._index(target, root)
        else:
            st = target.stat()
            etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"'
            self._send_file(target, st, etag, {}, kind="file")

    def _index(self, folder: Path, root: Path) -> None:
        base = "/files/" + "".join(quote(p) + "/" for p in folder.relative_to(root).parts)
        items = []
        for entry in sorted(folder.iterdir()):
            name = entry.name + ("/" if entry.is_dir() else "")
            items.append(f'<li><a href="{base}{quote(name)}">{html.escape(name)}</a></li>')
        title = html.escape(f"Index of {base}")
        page = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
                f"<body><h1>{title}</h1>\n<ul>\n" + "\n".join(items) + "\n</ul></body></html>\n").encode()
        self._body(200, page, "text/html; charset=utf-8", kind="index")

    # -- Hub API -----------------------------------------------------------------------------------------------

    def _api(self, repo_type: str, repo_id: str, rest: list[str]) -> None:
        if repo_type != "datasets":
            raise _HubError(404, "RepoNotFound", "Repository not found")
        action = rest[0] if rest else ""
        if action == "" and self.command == "GET":
            self._repo_info(repo_id, None)
        elif action == "revision" and len(rest) >= 2 and self.command == "GET":
            revision, _ = self._split_revision(repo_id, rest[1:])
            self._repo_info(repo_id, revision)
        elif action == "tree" and len(rest) >= 2 and self.command == "GET":
            revision, path_segments = self._split_revision(repo_id, rest[1:])
            self._tree(repo_id, revision, "/".join(unquote(s) for s in path_segments).strip("/"))
        elif action == "paths-info" and len(rest) >= 2 and self.command == "POST":
            revision, _ = self._split_revision(repo_id, rest[1:])
            self._paths_info(repo_id, revision)
        elif action == "commits" and len(rest) >= 2 and self.command == "GET":
            revision, _ = self._split_revision(repo_id, rest[1:])
            self._commits(repo_id, revision)
        else:
            self.srv._resolve_revision(repo_id, None)
            self._json(404, {"error": "Not Found"}, kind="api")

    def _split_revision(self, repo_id: str, segments: list[str]) -> tuple[str, list[str]]:
        """The revision at the head of ``segments`` (quoted as one segment, or a raw ``refs/convert/x`` or
        ``refs/pr/N`` over three) and the segments after it."""
        if segments[0] == "refs" and len(segments) >= 3:
            raw = "/".join(unquote(s) for s in segments[:3])
            if self.srv._known_revision(repo_id, raw):
                return raw, segments[3:]
        return unquote(segments[0]), segments[1:]

    def _repo_info(self, repo_id: str, revision: str | None) -> None:
        sha, commit = self.srv._resolve_revision(repo_id, revision)
        files = [p for p in sorted(commit.folder.rglob("*")) if p.is_file()]
        blobs = self.query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for p in files:
            sibling = {"rfilename": p.relative_to(commit.folder).as_posix()}
            if blobs:
                entry = self._file_entry(commit.folder, p, sha, commit, expand=False)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    sibling["lfs"] = {"size": entry["size"], "sha256": entry["lfs"]["oid"],
                                      "pointerSize": entry["lfs"]["pointerSize"]}
            siblings.append(sibling)
        with self.srv._lock:
            card_data = dict(self.srv._repos[repo_id].card_data)
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24], "id": repo_id, "author": repo_id.split("/")[0],
            "sha": sha, "lastModified": commit.date, "createdAt": commit.date, "private": False, "gated": False,
            "disabled": False, "downloads": 0, "downloadsAllTime": 0, "likes": 0, "tags": [], "cardData": card_data,
            "description": "", "citation": "", "paperswithcode_id": None, "siblings": siblings,
            "usedStorage": sum(p.stat().st_size for p in files),
        }
        expand = self.query.get("expand", []) + self.query.get("expand[]", [])
        if expand:
            info = {k: v for k, v in info.items() if k in expand or k in ("_id", "id")}
        self._json(200, info, kind="api")

    def _tree(self, repo_id: str, revision: str, path: str) -> None:
        sha, commit = self.srv._resolve_revision(repo_id, revision)
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        expand = self.query.get("expand", ["false"])[0].lower() == "true"
        folder = _inside(commit.folder, path)
        if folder is None or not folder.is_dir():
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", commit=sha)
        entries = []
        for p in _walk(folder, recursive):
            if p.is_dir():
                entries.append(self._dir_entry(commit.folder, p, sha, commit, expand))
            else:
                entries.append(self._file_entry(commit.folder, p, sha, commit, expand))
        page_size = self.srv.tree_page_size_expand if expand else self.srv.tree_page_size
        start = int(self.query.get("cursor", ["0"])[0] or 0)
        page = entries[start:start + page_size]
        headers = {}
        if start + page_size < len(entries):
            params = {k: v[0] for k, v in self.query.items()}
            params["cursor"] = str(start + page_size)
            headers["Link"] = f'<{self.srv.url}{urlsplit(self.path).path}?{urlencode(params)}>; rel="next"'
        self._json(200, page, kind="api", headers=headers)

    def _paths_info(self, repo_id: str, revision: str) -> None:
        sha, commit = self.srv._resolve_revision(repo_id, revision)
        if self.headers.get("Content-Type", "").startswith("application/json"):
            form = json.loads(self.body or b"{}")
            paths, expand = form.get("paths", []), bool(form.get("expand"))
        else:
            form = parse_qs(self.body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[0].lower() == "true"
        out = []
        for path in [paths] if isinstance(paths, str) else paths:
            p = _inside(commit.folder, path.strip("/"))
            if p is None or p == commit.folder or not p.exists():
                continue
            out.append(self._dir_entry(commit.folder, p, sha, commit, expand) if p.is_dir()
                       else self._file_entry(commit.folder, p, sha, commit, expand))
        self._json(200, out, kind="api")

    def _commits(self, repo_id: str, revision: str) -> None:
        sha, commit = self.srv._resolve_revision(repo_id, revision)
        item = {"id": sha, "authors": [{"user": "range-server"}], "date": commit.date, "title": f"Commit {sha[:7]}",
                "message": ""}
        self._json(200, [item], kind="api")

    def _file_entry(self, top: Path, p: Path, sha: str, commit: _Commit, expand: bool) -> dict:
        st = p.stat()
        blob_oid, sha256 = self.srv._file_hashes(p, st)
        entry = {"type": "file", "oid": blob_oid, "size": st.st_size, "path": p.relative_to(top).as_posix()}
        if _is_lfs(p, st.st_size):
            pointer = _lfs_pointer(sha256, st.st_size)
            entry["oid"] = hashlib.sha1(f"blob {len(pointer)}\0".encode() + pointer).hexdigest()
            entry["lfs"] = {"oid": sha256, "size": st.st_size, "pointerSize": len(pointer)}
        if expand:
            entry["lastCommit"] = {"id": sha, "title": f"Commit {sha[:7]}", "date": commit.date}
        return entry

    def _dir_entry(self, top: Path, p: Path, sha: str, commit: _Commit, expand: bool) -> dict:
        rel = p.relative_to(top).as_posix()
        entry = {"type": "directory", "oid": hashlib.sha1(f"{sha}:{rel}".encode()).hexdigest(), "size": 0,
                 "path": rel}
        if expand:
            entry["lastCommit"] = {"id": sha, "title": f"Commit {sha[:7]}", "date": commit.date}
        return entry

    def _resolve(self, repo_id: str, segments: list[str]) -> None:
        revision, path_segments = self._split_revision(repo_id, segments)
        sha, commit = self.srv._resolve_revision(repo_id, revision)
        path = "/".join(unquote(s) for s in path_segments)
        target = _inside(commit.folder, path)
        if target is None or not target.is_file():
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", commit=sha)
        st = target.stat()
        blob_oid, sha256 = self.srv._file_hashes(target, st)
        headers = {"X-Repo-Commit": sha}
        if _is_lfs(target, st.st_size):
            etag = f'"{sha256}"'
            headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(st.st_size)})
        else:
            etag = f'"{blob_oid}"'
        self._send_file(target, st, etag, headers, kind="resolve")

    # -- responses ---------------------------------------------------------------------------------------------

    def _send_file(self, target: Path, st: os.stat_result, etag: str, headers: dict, kind: str) -> None:
        size = st.st_size
        record = RequestRecord(self.command, self.url_path, self.headers.get("Range"), 200, kind)
        if self.command == "GET" and (fault := self.srv._fault_for(self.url_path)) is not None:
            record.status = fault
            self._head_and_record(record, fault, {**headers, "Content-Length": "0"})
            return
        bad = self.srv._misbehaviour_for(self.url_path) or Misbehaviour()
        if self.command == "HEAD" and bad.head_status is not None:
            record.status = bad.head_status
            self._head_and_record(record, bad.head_status, {"Content-Length": "0"})
            return
        if self.command in bad.stall.split():
            self.srv._record(record)
            self.srv._released.wait()
            self.close_connection = True
            return
        headers = {**headers, "ETag": etag, "Last-Modified": formatdate(st.st_mtime, usegmt=True),
                   "Accept-Ranges": "bytes"}
        if bad.weak_etag:
            headers["ETag"] = etag = f"W/{etag}"
        if bad.bare and self.command == "GET":
            del headers["ETag"], headers["Last-Modified"]
        if_match = None if bad.ignore_if_match else self.headers.get("If-Match")
        if if_match is not None and not _etag_matches(if_match, etag):
            record.status = 412
            self._head_and_record(record, 412, {**headers, "Content-Length": "0"})
            return
        byte_range = _parse_range(self.headers.get("Range"), size)
        if byte_range == "unsatisfiable":
            record.status = 416
            self._head_and_record(record, 416, {**headers, "Content-Range": f"bytes */{size}", "Content-Length": "0"})
            return
        if byte_range is None or bad.no_ranges:
            start, end, status = 0, size, 200
        elif bad.whole:
            start, end, status = 0, byte_range[1] - byte_range[0], 200
        else:
            (start, end), status = byte_range, 206
            asked = f"bytes {start}-{end - 1}/{size}"
            if bad.moved and start in bad.moved:
                start, end = bad.moved[start], min(bad.moved[start] + end - start, size)
            headers["Content-Range"] = asked if bad.lie else f"bytes {start}-{end - 1}/{size}"
        record.status = status
        headers.update({"Content-Type": "application/octet-stream", "Content-Length": str(end - start)})
        self._head_and_record(record, status, headers)
        if self.command == "HEAD":
            return
        with open(target, "rb") as fh:
            fh.seek(start)
            left = end - start
            while left > 0:
                chunk = fh.read(min(16 if bad.drip else _CHUNK, left))
                if bad.drip and self.srv._released.wait(bad.drip):
                    self.close_connection = True
                    return
                if not chunk:
                    break  # the file shrank under us: the client sees a short body
                # counted before it is written, so that a client never sees bytes the counters do not have yet
                self.srv._count(record, len(chunk))
                try:
                    self.wfile.write(chunk)
                except OSError:
                    self.srv._count(record, -len(chunk))
                    self.close_connection = True
                    return
                left -= len(chunk)
        if left:
            self.close_connection = True
        if bad.swap_after is not None and self.command == "GET":
            bad.gets += 1
            if bad.gets == bad.swap_after:
                swapped = target.with_name(target.name + ".swap")
                swapped.write_bytes(bad.swap_to)
                os.replace(swapped, target)

    def _head_and_record(self, record: RequestRecord, status: int, headers: dict) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.srv._record(record)
        self.end_headers()

    def _empty(self, status: int, kind: str) -> None:
        self._body(status, b"", "text/plain", kind)

    def _json(self, status: int, payload, kind: str, headers: dict | None = None) -> None:
        self._body(status, json.dumps(payload).encode(), "application/json; charset=utf-8", kind, headers)

    def _body(self, status: int, body: bytes, content_type: str, kind: str, headers: dict | None = None) -> None:
        record = RequestRecord(self.command, self.url_path, self.headers.get("Range"), status, kind)
        self._head_and_record(record, status, {**(headers or {}), "Content-Type": content_type,
                                               "Content-Length": str(len(body))})
        if self.command != "HEAD" and body:
            self.wfile.write(body)


# -- helpers ---------------------------------------------------------------------------------------------------


def _parse_range(header: str | None, size: int):
    """``(start, end)`` (end exclusive) for a single ``bytes=`` range, ``"unsatisfiable"``, or None to answer
    the whole file (no header, several ranges or a malformed one, which HTTP lets a server ignore)."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, sep, last = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0 or size == 0:
                return "unsatisfiable"
            return max(size - n, 0), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start < 0 or (last and end <= start):
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size)


def _inside(top: Path, relative: str) -> Path | None:
    """``top / relative``, or None when ``relative`` climbs out of ``top`` (checked on the name, so that
    symbolic links inside ``top`` may point anywhere)."""
    parts = PurePosixPath(relative).parts
    if ".." in parts or (parts and parts[0] == "/"):
        return None
    return top.joinpath(*parts)


def _etag_matches(if_match: str, etag: str) -> bool:
    """``If-Match``'s strong comparison: a weak ETag matches nothing but ``*``."""
    tags = [t.strip() for t in if_match.split(",")]
    return "*" in tags or (etag in tags and not etag.startswith("W/"))


def _walk(folder: Path, recursive: bool):
    """The entries of ``folder``, directories first, depth first when ``recursive``."""
    children = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    for child in children:
        yield child
        if recursive and child.is_dir():
            yield from _walk(child, recursive)


def _is_lfs(path: Path, size: int) -> bool:
    return path.suffix.lower() in _LFS_SUFFIXES or size >= _LFS_MIN_SIZE


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _check_sha(sha: str) -> None:
    if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
        raise ValueError(f"a commit sha is 40 lowercase hex characters, got {sha!r}")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
