"""Waiting for a proof another thread is making (``prefetch.py``), or not."""

from __future__ import annotations

import threading
from typing import Callable


def acquire(lock: threading.Lock, making: Callable[[], bool], cached_only: bool) -> bool:
    """``lock`` taken: waited for, unless ``cached_only`` and the thread holding it is making a
    proof (``making()``: seconds of work, not a read of the cache), which is False."""
    if not cached_only:
        return lock.acquire()
    while not lock.acquire(timeout=0.02):
        if making():
            return False
    return True
