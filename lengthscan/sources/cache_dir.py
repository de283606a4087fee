"""Where lengthscan keeps what it caches between runs: ``$LENGTHSCAN_CACHE``, else ``~/.cache/lengthscan``.

At the bottom of the stages, so every stage can name its own subfolder: ``sources/`` (row-count
manifests), ``lengths/`` (the length cache), ``tokenizers/``, ``fastpath/`` and ``countbpe/`` (the
counters' proofs), ``demo/``. Cache files of derived tables carry a checksum of their content,
verified before use.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

#: What ``distrust`` is told of a file without a checksum, or whose checksum does not match.
NO_CHECKSUM, MISMATCH = "no checksum", "a checksum its content does not match"
#: The first line of a text cache file: its content's SHA-256 follows.
DIGEST_HEADER = "lengthscan-sha256:"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_cache_text(path: Path, text: str) -> None:
    """Write a cache file atomically (a temporary beside it, then renamed), its first line the
    content's checksum (``read_cache_text`` verifies it); a read-only or full cache costs time,
    never correctness, so an OSError is swallowed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(f"{DIGEST_HEADER}{text_digest(text)}\n{text}", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def write_cache_json(path: Path, data) -> None:
    """``write_cache_text`` of ``data`` as JSON."""
    write_cache_text(path, json.dumps(data))


@contextmanager
def cache_file_locked(path: Path):
    """An exclusive ``flock`` on ``path``'s lock file (``.NAME.lock`` beside it) for a read, change and
    write of ``path`` that processes make at once (a run and its prover): none loses what another
    wrote. Held for milliseconds; released with its process. Where it cannot be taken (not POSIX, a
    read-only folder, a file system without locks) the block runs unlocked: a lost write costs a
    later run time, never a wrong figure."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with its descriptor


def regular_cache_file(path: Path) -> bool:
    """``path`` is a regular file (through links) that a cache may read: False when it is missing, and
    (with a warning, a FIFO, socket, device or link to one removed) when it is something else, which
    a read would block on or never finish (a FIFO, ``/dev/zero``) or cannot read (a folder)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode):
        return True
    what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a device"
    distrust(path, f"the place of a file taken by {what}")
    return False


def read_cache_text(path: Path) -> str | None:
    """A cache file's text when its checksum verifies; None when it is missing or unreadable, and
    (with a warning, the file removed) when its content is not what was written: a cache never
    decides a result it cannot vouch for, so the caller rebuilds it."""
    if not regular_cache_file(path):
        return None
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    head, _, text = raw.partition("\n")
    if head != DIGEST_HEADER + text_digest(text):
        distrust(path, NO_CHECKSUM if not head.startswith(DIGEST_HEADER) else MISMATCH)
        return None
    return text


def read_cache_json(path: Path):
    """``read_cache_text`` parsed as JSON (None where that is None or not JSON)."""
    text = read_cache_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        distrust(path, "content that is not JSON")
        return None


def distrust(path: Path, why: str, what: str = "cache", instead: str = "rebuilt") -> None:
    """Warn that the cache file ``path`` (with ``why`` wrong) is not used, and remove it."""
    import warnings

    if why == NO_CHECKSUM:
        why += " (written by an older lengthscan, or changed since)"
    elif why == MISMATCH:
        why += " (changed since lengthscan wrote it)"
    warnings.warn(f"lengthscan: {what} not used: {path} has {why}; {instead}",
                  RuntimeWarning, stacklevel=3)
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def cache_root() -> Path:
    """The cache folder: ``$LENGTHSCAN_CACHE`` if set, else ``~/.cache/lengthscan``."""
    return Path(os.environ.get("LENGTHSCAN_CACHE") or Path.home() / ".cache" / "lengthscan")


def file_stamp(path: str) -> tuple:
    """What identifies a file's content for the caches without reading it: path, size, mtime, and
    the inode's change time and number. A rewrite that keeps size and mtime (``touch -r``, a copy
    with ``cp -p``, a tool that restores timestamps) still changes ctime, which no user call sets."""
    st = os.stat(path)
    return os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def file_stamp_or_none(path) -> tuple | None:
    """``file_stamp``, or None where the file cannot be read."""
    try:
        return file_stamp(str(path))
    except OSError:
        return None
