"""The C heap of this process, where the C library is glibc: pages freed by the Rust and C code
lengthscan calls (a ``tokenizer.json`` parsed, a batch's encodings) handed back to the system.

glibc keeps freed memory for later allocations. Loading a 200k-vocabulary ``tokenizer.json``
parses about 200 MiB of JSON values that are freed once the tokenizer is built (about 60 MiB):
kept, they count in the process's memory for the whole run, in every process that loads it.
Elsewhere (another C library, not Linux) these calls do nothing.
"""

from __future__ import annotations

from functools import lru_cache


def trim() -> None:
    """Hand the heap's free pages back to the system (``malloc_trim(0)``)."""
    _call("malloc_trim", 0)


def one_arena_per_core_pair() -> None:
    """At most two malloc arenas (``mallopt(M_ARENA_MAX, 2)``): a worker's threads share the heap
    rather than each keeping one of its own."""
    _call("mallopt", -8, 2)


def _call(name: str, *args: int) -> None:
    fn = getattr(_libc(), name, None)
    if fn is not None:
        fn(*args)


@lru_cache(maxsize=1)
def _libc():
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")  # glibc's soname; another C library: nothing to call
    except OSError:
        return None
