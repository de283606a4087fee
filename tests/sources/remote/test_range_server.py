"""The offline HTTP server of tests/support/range_server.py, driven by real clients: fsspec's HTTPFileSystem for
plain files, huggingface_hub's HfApi and HfFileSystem for the Hub layout.

huggingface_hub refuses every request while ``HF_HUB_OFFLINE`` is set (tests/conftest.py sets it, and the library
reads it once, at import), even with an explicit endpoint; so the Hub checks run in a subprocess started with
``hub_env(srv)``, and this process checks what the server saw.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.http import HTTPFileSystem

from tests.support.range_server import RangeServer, hub_env

SHA_MAIN = "1" * 40
SHA_PARQUET = "2" * 40
SHA_NEXT = "3" * 40


@pytest.fixture
def srv(tmp_path):
    root = tmp_path / "root"
    (root / "dir" / "sub").mkdir(parents=True)
    (root / "dir" / "a.parquet").write_bytes(bytes(range(256)) * 40)
    (root / "dir" / "b.parquet").write_bytes(b"b" * 1000)
    (root / "dir" / "notes.txt").write_text("not parquet")
    (root / "dir" / "sub" / "c.parquet").write_bytes(b"c" * 10)
    with RangeServer(root) as server:
        yield server


def _http(url, method="GET", headers=None):
    """(status, headers, body) of one request made with urllib, errors included."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers or {})) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_ranges_are_served_and_counted(srv):
    fs = HTTPFileSystem()
    url = srv.file_url("dir/a.parquet")
    data = (srv.root / "dir" / "a.parquet").read_bytes()

    assert fs.cat_file(url, 1000, 3000) == data[1000:3000]
    assert srv.bytes_served == 2000
    assert srv.bytes_by_path == {"/files/dir/a.parquet": 2000}
    (rec,) = srv.requests
    assert (rec.method, rec.range, rec.status, rec.body_bytes) == ("GET", "bytes=1000-2999", 206, 2000)

    assert fs.cat_file(url, -10) == data[-10:]
    assert fs.cat_file(url, 9000) == data[9000:]
    assert fs.cat_file(url) == data
    assert srv.bytes_served == 2000 + 10 + (len(data) - 9000) + len(data)

    info = fs.info(url)
    assert info["size"] == len(data) and info["ETag"].startswith('"') and info["Last-Modified"]
    assert srv.requests[-1].method == "HEAD" and srv.requests[-1].body_bytes == 0

    status, headers, body = _http(url, headers={"Range": f"bytes={len(data)}-"})
    assert (status, headers["Content-Range"], body) == (416, f"bytes */{len(data)}", b"")
    status, headers, _ = _http(url, headers={"Range": "bytes=10-19"})
    assert (status, headers["Content-Range"], headers["Content-Length"]) == (206, f"bytes 10-19/{len(data)}", "10")
    assert headers["Accept-Ranges"] == "bytes"
    assert _http(srv.file_url("dir/missing.parquet"))[0] == 404
    assert _http(srv.file_url("../root/dir/a.parquet"))[0] == 404


def test_directory_index_lists_for_glob(srv):
    fs = HTTPFileSystem()
    base = f"{srv.url}/files/dir"
    assert fs.glob(f"{base}/*.parquet") == [f"{base}/a.parquet", f"{base}/b.parquet"]
    assert fs.glob(f"{base}/**/*.parquet") == [f"{base}/a.parquet", f"{base}/b.parquet", f"{base}/sub/c.parquet"]
    assert srv.bytes_served == 0  # listings are not file data


def test_if_match_with_a_stale_etag_is_refused(srv):
    fs = HTTPFileSystem()
    url = srv.file_url("dir/b.parquet")
    old = fs.info(url)["ETag"]
    (srv.root / "dir" / "b.parquet").write_bytes(b"B" * 1200)
    new = fs.info(url)["ETag"]
    assert new != old

    with pytest.raises(aiohttp.ClientResponseError) as err:
        fs.cat_file(url, 0, 100, headers={"If-Match": old})
    assert err.value.status == 412
    assert _http(url, method="HEAD", headers={"If-Match": old})[0] == 412
    assert fs.cat_file(url, 0, 100, headers={"If-Match": new}) == b"B" * 100
    assert srv.bytes_served == 100


def test_fail_next_then_success(srv):
    fs = HTTPFileSystem()
    url = srv.file_url("dir/a.parquet")
    srv.fail_next(2)
    for _ in range(2):
        with pytest.raises(aiohttp.ClientResponseError) as err:
            fs.cat_file(url, 0, 10)
        assert err.value.status == 503
    assert fs.cat_file(url, 0, 10) == bytes(range(10))
    assert [(r.status, r.body_bytes) for r in srv.requests] == [(503, 0), (503, 0), (206, 10)]
    assert srv.bytes_served == 10

    srv.fail_path("b.parquet", status=500)
    with pytest.raises(aiohttp.ClientResponseError):
        fs.cat_file(srv.file_url("dir/b.parquet"))
    assert fs.info(srv.file_url("dir/b.parquet"))["size"] == 1000  # HEAD is not a data request
    srv.clear_faults()
    assert fs.cat_file(srv.file_url("dir/b.parquet")) == b"b" * 1000
    srv.reset_counts()
    assert (srv.bytes_served, srv.bytes_by_path, srv.requests) == (0, {}, [])


def _run_hub(srv, tmp_path, script: str, *args) -> dict:
    """Run ``script`` in a fresh interpreter that talks to ``srv`` as its Hub; its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, "-c", script, srv.url, *args], env=hub_env(srv, tmp_path / "hf-home"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def hub_repo(tmp_path, srv):
    """``me/ds``: ``main`` holds a README and a JSON lines file, ``refs/convert/parquet`` two Parquet files
    of four row groups each."""
    main = tmp_path / "main"
    (main / "data").mkdir(parents=True)
    (main / "README.md").write_text("# ds\n")
    (main / "data" / "train.jsonl").write_text('{"text": "a"}\n' * 50)
    converted = tmp_path / "converted" / "default" / "train"
    converted.mkdir(parents=True)
    for shard in range(2):
        n = 40_000
        table = pa.table({"i": pa.array(range(shard * n, (shard + 1) * n), pa.int64()),
                          "text": [f"row {i}" for i in range(n)]})
        pq.write_table(table, converted / f"000{shard}.parquet", row_group_size=n // 4)
    srv.add_dataset("me/ds", {"main": (main, SHA_MAIN), "refs/convert/parquet": (tmp_path / "converted", SHA_PARQUET)})
    return tmp_path


_HUB_READS = r"""
import hashlib, json, sys
import pyarrow.parquet as pq
from huggingface_hub import HfApi, HfFileSystem

url, sha, local = sys.argv[1], sys.argv[2], sys.argv[3]
api = HfApi(endpoint=url)
fs = HfFileSystem(endpoint=url)
out = {
    "main_sha": api.dataset_info("me/ds").sha,
    "parquet_sha": api.dataset_info("me/ds", revision="refs/convert/parquet").sha,
    "siblings": sorted(s.rfilename for s in api.dataset_info("me/ds").siblings),
    "tree": sorted(f.path for f in api.list_repo_tree("me/ds", repo_type="dataset", recursive=True,
                                                       revision="refs/convert/parquet")),
    "glob": fs.glob(f"datasets/me/ds@{sha}/**/*.parquet"),
    "glob_ref": fs.glob("datasets/me/ds@refs%2Fconvert%2Fparquet/**/*.parquet"),
}
first, second = (f"datasets/me/ds@{sha}/default/train/000{k}.parquet" for k in (0, 1))
out["size"] = fs.info(first)["size"]
with fs.open(first, "rb", cache_type="none") as f:
    f.seek(1000)
    out["range_md5"] = hashlib.md5(f.read(500)).hexdigest()
with fs.open(second, "rb", cache_type="none") as f:
    remote = pq.ParquetFile(f)
    expected = pq.ParquetFile(f"{local}/default/train/0001.parquet").read_row_group(2)
    out["row_groups"] = remote.metadata.num_row_groups
    out["row_group_equal"] = remote.read_row_group(2).equals(expected)
print(json.dumps(out))
"""


def test_hub_api_and_filesystem(srv, hub_repo, tmp_path):
    converted = hub_repo / "converted"
    out = _run_hub(srv, tmp_path, _HUB_READS, SHA_PARQUET, str(converted))
    assert (out["main_sha"], out["parquet_sha"]) == (SHA_MAIN, SHA_PARQUET)
    assert out["siblings"] == ["README.md", "data/train.jsonl"]
    assert out["tree"] == ["default", "default/train", "default/train/0000.parquet", "default/train/0001.parquet"]
    assert out["glob"] == [f"datasets/me/ds@{SHA_PARQUET}/default/train/000{k}.parquet" for k in (0, 1)]
    assert out["glob_ref"] == [f"datasets/me/ds@refs%2Fconvert%2Fparquet/default/train/000{k}.parquet"
                               for k in (0, 1)]
    first = (converted / "default" / "train" / "0000.parquet").read_bytes()
    assert out["size"] == len(first)
    assert out["range_md5"] == hashlib.md5(first[1000:1500]).hexdigest()
    assert srv.bytes_for("0000.parquet") == 500
    (read,) = [r for r in srv.requests if r.path.endswith("0000.parquet") and r.method == "GET"]
    assert read.path == f"/datasets/me/ds/resolve/{SHA_PARQUET}/default/train/0000.parquet"
    assert (read.range, read.status, read.body_bytes) == ("bytes=1000-1499", 206, 500)

    assert out["row_groups"] == 4 and out["row_group_equal"]
    second_size = (converted / "default" / "train" / "0001.parquet").stat().st_size
    reads = [r for r in srv.requests if r.path.endswith("0001.parquet") and r.method == "GET"]
    assert all(r.status == 206 for r in reads)
    assert srv.bytes_for("0001.parquet") == sum(r.body_bytes for r in reads) < second_size / 2
    assert sum(r.body_bytes for r in srv.requests if r.kind == "api") == 0


_HUB_PINNED = r"""
import json, sys
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

url, old_sha = sys.argv[1], sys.argv[2]
api = HfApi(endpoint=url)
fs = HfFileSystem(endpoint=url)
out = {
    "main_sha": api.dataset_info("me/ds").sha,
    "old_sha": api.dataset_info("me/ds", revision=old_sha).sha,
    "pinned": fs.cat_file(f"datasets/me/ds@{old_sha}/data/train.jsonl").decode(),
    "main": fs.cat_file("datasets/me/ds/data/train.jsonl").decode(),
    "pinned_files": fs.find(f"datasets/me/ds@{old_sha}"),
}
errors = {}
for name, call in [("repo", lambda: api.dataset_info("me/missing")),
                   ("revision", lambda: api.dataset_info("me/ds", revision="nope")),
                   ("entry", lambda: hf_hub_download("me/ds", "nope.txt", repo_type="dataset"))]:
    try:
        call()
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        errors[name] = type(e).__name__
out["errors"] = errors
out["exists_bad_revision"] = fs.exists("datasets/me/ds@nope/README.md")
print(json.dumps(out))
"""


def test_hub_pinned_sha_survives_a_branch_move_and_retries(srv, hub_repo, tmp_path):
    moved = tmp_path / "moved"
    (moved / "data").mkdir(parents=True)
    (moved / "data" / "train.jsonl").write_text('{"text": "b"}\n')
    srv.set_revision_sha("me/ds", "main", SHA_NEXT, folder=moved)
    srv.fail_next(1)  # the first data request fails once: huggingface_hub retries it (after a second)

    out = _run_hub(srv, tmp_path, _HUB_PINNED, SHA_MAIN)
    assert (out["main_sha"], out["old_sha"]) == (SHA_NEXT, SHA_MAIN)
    assert out["pinned"] == '{"text": "a"}\n' * 50
    assert out["main"] == '{"text": "b"}\n'
    assert out["pinned_files"] == [f"datasets/me/ds@{SHA_MAIN}/README.md",
                                   f"datasets/me/ds@{SHA_MAIN}/data/train.jsonl"]
    assert out["errors"] == {"repo": "RepositoryNotFoundError", "revision": "RevisionNotFoundError",
                             "entry": "RemoteEntryNotFoundError"}
    assert out["exists_bad_revision"] is False

    pinned = [r for r in srv.requests if r.path == f"/datasets/me/ds/resolve/{SHA_MAIN}/data/train.jsonl"]
    assert [(r.status, r.body_bytes) for r in pinned] == [(503, 0), (200, len(out["pinned"]))]
    refused = {r.path: r.status for r in srv.requests if r.status == 404}
    assert refused.keys() >= {"/api/datasets/me/missing", "/api/datasets/me/ds/revision/nope"}
