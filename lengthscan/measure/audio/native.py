"""Native libraries' chatter kept off the terminal: libmpg123 (inside libsndfile) writes "Note:
Illegal Audio-MPEG-Header ..." and "Warning: Xing stream size off ..." straight to file
descriptor 2 for damaged MP3s. What matters of those files is already a per-row reason or note;
the lines themselves would break the one-line error model and the progress bar.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: int | None = None


@contextmanager
def native_stderr_quiet():
    """Point file descriptor 2 at /dev/null while native decoders run (nested and threaded uses
    share one redirection; Python's own ``sys.stderr`` writes meanwhile are lost too, so keep the
    block to library calls)."""
    global _DEPTH, _SAVED
    with _LOCK:
        if _DEPTH == 0:
            try:
                _SAVED = os.dup(2)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                os.close(devnull)
            except OSError:
                _SAVED = None
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _SAVED is not None:
                os.dup2(_SAVED, 2)
                os.close(_SAVED)
                _SAVED = None
