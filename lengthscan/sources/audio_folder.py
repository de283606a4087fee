"""Audio folders: one row per audio file, with the transcript of a sidecar file beside it."""

from __future__ import annotations

import json
import os

from lengthscan.sources.cache_dir import file_stamp
from lengthscan.sources.source import (
    TRANSCRIPT_SUFFIXES,
    Part,
    Source,
    SourceError,
    SplitSource,
    digest,
    first_line,
    quiet_datasets,
)


def _transcript(path: str) -> str:
    """A sidecar transcript's text: a regular file of UTF-8 text no longer than a row may be (a
    ``SourceError`` naming it otherwise: a FIFO or a broken link is not skipped as if absent)."""
    from lengthscan.sources.streams import MAX_ROW_ENV, max_row_bytes, open_regular

    cap = max_row_bytes()
    try:
        with open_regular(path) as fh:
            data = fh.read(min(os.fstat(fh.fileno()).st_size, cap) + 1)
    except FileNotFoundError:
        raise SourceError(f"{path}: cannot read the transcript: a symbolic link that leads nowhere") from None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the transcript: {first_line(exc)}") from None
    if len(data) > cap:
        raise SourceError(f"{path}: cannot read the transcript: longer than {cap:,} bytes, the longest row "
                          f"lengthscan reads (raise {MAX_ROW_ENV} if it is real)")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: cannot read the transcript: not UTF-8 text (byte {exc.start + 1:,}: "
                          f"{data[exc.start:exc.start + 1]!r})") from None


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
        sidecar = next((stem + s for s in TRANSCRIPT_SUFFIXES if os.path.lexists(stem + s)), None)
        text = None if sidecar is None else _transcript(sidecar)
        texts.append(text)
        for f in (path, sidecar) if sidecar else (path,):
            stamp.append(file_stamp(f))
    ds = Dataset.from_dict({"audio": paths, "text": texts})
    fingerprint = digest(json.dumps(["audiofolder", stamp]))[:16]
    return Source(spec, "audiofolder", (SplitSource("train", (Part(0, None, dataset=ds),), fingerprint),), False)
