"""Output directories: staged beside ``--out``, published with one rename; ``report.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

#: Files an audit writes; a directory holding only these may be replaced by a new audit.
AUDIT_FILES = {"lengths.parquet", "report.json", "report.html"}


class OutputError(ValueError):
    """The output directory cannot be written (exit code 2)."""


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside ``final`` (same file system, so rename is atomic)."""
    final = final.resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        if _is_stale(stale):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def check_writable(final: Path, *, overwrite: bool, ours: set[str] = AUDIT_FILES) -> None:
    """Refuse early to replace a directory holding files we did not write, unless ``overwrite``."""
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


def publish(tmp: Path, final: Path) -> None:
    """Move ``tmp`` into place as ``final``; an existing ``final`` is swapped out, then removed."""
    final = final.resolve()
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


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
