"""Output directories: staged beside ``--out``, published with one rename; ``report.json``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock (the rename that publishes stays atomic)
    fcntl = None

#: Files an audit writes; a directory holding only these may be replaced by a new audit.
AUDIT_FILES = {"lengths.parquet", "report.json", "report.html", "packs.parquet"}


class OutputError(ValueError):
    """The output directory cannot be written (exit code 2)."""


@dataclass
class OutLock:
    """One writer per ``--out``: an exclusive, non-blocking ``flock`` on ``.NAME.lock`` beside it,
    holding the owner's pid for the message a second run prints. Removed on release; a run that
    opened the file just before its removal sees that the path names another file now, and tries
    again. A killed run's lock dies with its process."""

    path: Path
    fd: int | None

    @classmethod
    def acquire(cls, final: Path) -> "OutLock":
        path = final.parent / f".{final.name}.lock"
        if fcntl is None:
            return cls(path, None)
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(f"--out {final}: cannot write beside it: {_why(exc)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                who = f" (pid {owner})" if owner.isdigit() else ""
                raise OutputError(f"--out {final}: another lengthscan run{who} is writing it now; wait for it to "
                                  "finish, or choose another --out") from None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                return cls(path, fd)
            os.close(fd)  # released and removed by its owner meanwhile: lock the new file
        raise OutputError(f"--out {final}: could not lock {path}")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


#: staging directory -> the lock on its ``--out``, held from staging to publishing (or discarding)
_HELD: dict[Path, OutLock] = {}


def staging_dir(final: Path, *, recheck=None) -> Path:
    """A fresh temporary directory beside ``final`` (same file system, so rename is atomic), made
    under a lock on ``final`` that :func:`publish` or :func:`discard` releases: of two runs writing
    one ``--out`` at once, the second is refused (:class:`OutputError`). ``recheck`` (a callable)
    runs under the lock, to repeat the checks on ``final`` that another run may have changed."""
    final = final.resolve()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {final}: cannot create its parent folder: {_why(exc)}") from None
    lock = OutLock.acquire(final)  # OutputError if held; OSError if the folder refuses a file
    try:
        if recheck is not None:
            recheck()
        # under the lock, every staging (or swapped-out) folder of this --out is a dead run's: a live
        # run holds the lock while it has one (a pid check would miss a killed run's zombie)
        for pattern in (f".{final.name}.tmp-*", f".{final.name}.old-*"):
            for stale in final.parent.glob(pattern):
                if lock.fd is not None or _is_stale(stale):  # without locks (not POSIX): dead pids only
                    shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
        except OSError as exc:
            raise OutputError(f"--out {final}: cannot create a staging folder beside it: {_why(exc)}") from None
    except BaseException:
        lock.release()
        raise
    _HELD[tmp] = lock
    return tmp


def discard(staging: Path) -> None:
    """Remove an unpublished staging directory and release its ``--out``'s lock."""
    shutil.rmtree(staging, ignore_errors=True)
    lock = _HELD.pop(staging, None)
    if lock is not None:
        lock.release()


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system with the staging suffix added; choose a shorter --out"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a path component is a file, not a folder"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"{exc.strerror.lower()} (choose a writable --out)"
    return exc.strerror or str(exc)


def check_out_path(out, flag: str = "--out") -> None:
    """Refuse an output path that cannot be published over safely: an empty name (the working
    directory), a symbolic link (publishing would follow or replace it, broken or not) and a mount
    point (a rename cannot replace it)."""
    if not str(out).strip():
        raise OutputError(f"{flag} is empty: name the folder to write")
    path = Path(out).expanduser()
    if path.is_symlink():
        raise OutputError(f"{flag} {out}: a symbolic link; name the real folder (a link is never followed "
                          "nor replaced)")
    if path.is_dir() and os.path.ismount(path):
        raise OutputError(f"{flag} {out}: a mount point, which cannot be replaced; choose a folder inside it")


def check_writable(final: Path, *, overwrite: bool, ours: set[str] = AUDIT_FILES) -> None:
    """Refuse early to replace a directory holding files we did not write, unless ``overwrite``."""
    check_out_path(final)
    if final.exists() and not final.is_dir():
        raise OutputError(f"{final}: exists and is not a directory")
    if final.is_dir() and not overwrite:
        foreign = sorted(p.name for p in final.iterdir() if p.name not in ours)
        if foreign:
            raise OutputError(f"{final}: exists and holds other files ({', '.join(foreign[:5])}); "
                              "choose another --out or pass --overwrite")


def check_apart(out: Path, sources) -> None:
    """Refuse an ``--out`` that is, contains, or lies inside a path the source is read from (the
    files, and the folder a source was named by), ``--overwrite`` or not: replacing it would delete
    the data being read, and outputs inside a source folder would be read as data next time."""
    final = Path(out).resolve()
    for source in sources:
        if not source:
            continue
        path = Path(source).resolve()
        if final == path or path.is_relative_to(final) or (path.is_dir() and final.is_relative_to(path)):
            where = "is" if final == path else "contains" if path.is_relative_to(final) else "lies inside"
            raise OutputError(f"--out {out} {where} the source path {source}: choose an --out outside the source "
                              f"(it is never written over, even with --overwrite)")


#: The folders published by this process, for a Ctrl-C after publishing to say so.
PUBLISHED: list[Path] = []


def publish(tmp: Path, final: Path) -> None:
    """Move ``tmp`` into place as ``final``; an existing ``final`` is swapped out, then removed.
    Ctrl-C and SIGTERM wait until both renames are done: between them ``final`` would be missing."""
    final = final.resolve()
    blocked = _block_signals()
    try:
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            PUBLISHED.append(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
            PUBLISHED.append(final)
    finally:
        lock = _HELD.pop(tmp, None)
        if lock is not None:
            lock.release()
        _unblock_signals(blocked)


def _block_signals():
    import signal
    import threading

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _unblock_signals(previous) -> None:
    import signal

    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a signal that came meanwhile is delivered now


def _is_stale(path: Path) -> bool:
    """A temporary directory whose creating process is gone."""
    try:
        pid = int(path.name.split("tmp-")[1].split("-")[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def write_report(staging: Path, data: dict, *, redact: bool = False) -> None:
    """``report.json`` and ``report.html`` of ``data`` (a result's ``to_dict()``) into ``staging``."""
    from lengthscan.report.html import write_html

    write_json(staging / "report.json", data)
    write_html(staging / "report.html", data, redact=redact)
