"""Where a conversation's videos are, and their ``VideoInfo`` read from their containers' headers.

A video is given as a path (relative paths resolve against the data file's folder, as images do),
as bytes, as the ``{"bytes", "path"}`` dict of a ``datasets`` value, or as a list of frame images
(processors stack the frames of such a list: the video's frames are the list's, its size the
first frame's, every frame the same size). A bad video never raises: it comes back as a
``VideoProblem`` naming it and what is wrong (a missing file, a FIFO or folder refused unread, an
unreadable container, frames of different sizes).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lengthscan.measure.images.reader import ImageError
from lengthscan.measure.images.refs import Seen, describe, image_sizes, local_path
from lengthscan.measure.video.headers import video_info, video_info_from
from lengthscan.measure.video.info import VideoInfo

#: Files whose headers are read at once.
READ_THREADS = 8
#: ``VideoInfo.container`` of a list of frame images
FRAMES = "frames"


@dataclass(frozen=True)
class VideoProblem:
    """A video that has no ``VideoInfo``: ``flag`` (missing_file, unreadable) and the reason."""

    flag: str
    reason: str


def video_infos(refs: list, base_dir: str | None) -> list:
    """Per reference: a ``VideoInfo`` or a ``VideoProblem`` (each file read once)."""
    keys = [r if isinstance(r, str) else k for k, r in enumerate(refs)]
    first: dict = {}
    for k, key in enumerate(keys):
        first.setdefault(key, k)
    todo = sorted(set(first.values()))
    if len(todo) < 4:
        found = [_info(refs[k], base_dir) for k in todo]
    else:
        with ThreadPoolExecutor(min(READ_THREADS, len(todo))) as pool:
            found = list(pool.map(lambda k: _info(refs[k], base_dir), todo))
    by_first = dict(zip(todo, found))
    return [by_first[first[key]] for key in keys]


def _info(ref, base_dir: str | None):
    if isinstance(ref, (list, tuple)):
        return _frames(list(ref), base_dir)
    label = describe(ref)
    if isinstance(ref, dict):
        ref = ref.get("bytes") if ref.get("bytes") is not None else ref.get("path")
    if ref is None:
        return VideoProblem("missing_file", "a video is missing (null)")
    try:
        if isinstance(ref, (bytes, bytearray, memoryview)):
            return video_info(bytes(ref))
        if not isinstance(ref, (str, os.PathLike)):
            return VideoProblem("unreadable", f"video {label!r}: a {type(ref).__name__}, not a path, bytes or a "
                                              "list of frames")
        path = os.fspath(ref)
        scheme, sep, _ = path.partition("://")
        if sep and scheme.isalnum() and len(scheme) > 1:
            return VideoProblem("unreadable", f"video {label!r}: a URL; lengthscan reads local video files and bytes "
                                              "(download the videos first)")
        return video_info_from(local_path(path, base_dir))
    except FileNotFoundError:
        return VideoProblem("missing_file", f"video {label!r}: no such file")
    except (IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        return VideoProblem("missing_file", f"video {label!r}: {exc.strerror}")
    except ImageError as exc:  # VideoError, CutShort, OverBudget, not a regular file
        return VideoProblem("unreadable", f"video {label!r}: {exc}")
    except OSError as exc:
        return VideoProblem("unreadable", f"video {label!r}: {exc.strerror or exc}")
    except ValueError as exc:  # a path holding a NUL character
        return VideoProblem("missing_file", f"video {label!r}: {exc}")


def _frames(refs: list, base_dir: str | None):
    """A list of frame images as a video: its frames, and their one size."""
    if not refs:
        return VideoProblem("unreadable", "a video given as an empty list of frames")
    seen = image_sizes(refs, base_dir)
    sizes = set()
    for k, s in enumerate(seen):
        if not isinstance(s, Seen):
            return VideoProblem(s.flag, f"frame {k + 1} of {len(refs)}: {s.reason}")
        sizes.add((s.width, s.height))
    if len(sizes) > 1:
        return VideoProblem("unreadable", f"a video of {len(refs)} frames of {len(sizes)} sizes (the processor stacks "
                                          "frames of one size)")
    width, height = sizes.pop()
    return VideoInfo(0.0, len(refs), None, width, height, 0, FRAMES)
