"""What every remote store shares: a listed file, the errors that end a read, the timeouts, and the
check that an answer holds exactly the bytes asked of the file listed.

Timeouts: a connection must be made within ``CONNECT_TIMEOUT_S`` seconds and a server that stops
sending (before its answer or within it) is given up after ``READ_TIMEOUT_S`` seconds of silence;
``LENGTHSCAN_HTTP_TIMEOUT`` (seconds) sets both. A server that trickles (never silent that long,
but slower than ``MIN_BYTES_PER_TIMEOUT`` per read timeout) is given up too (``answer_deadline``).
A request that times out is retried
(``TIMEOUT_RETRIES`` times, with backoff; other failures ``RETRIES`` times), then the run stops with
exit 2 naming the URL.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from lengthscan.sources.source import SourceError
from lengthscan.sources.urls import display_url

#: Seconds to make a connection, and of silence from a server before a request is given up.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 15.0
#: Seconds for both, overriding the defaults (tests and slow links).
TIMEOUT_VAR = "LENGTHSCAN_HTTP_TIMEOUT"
#: Attempts after the first for one request that failed (a server error, a dropped connection).
RETRIES = 4
#: Of those, the attempts after a timeout (a server that stalls is given up within about
#: ``(TIMEOUT_RETRIES + 1) * READ_TIMEOUT_S`` seconds, not retried for minutes).
TIMEOUT_RETRIES = 2
#: Seconds before the first retry (doubled at each, at most ``BACKOFF_MAX``).
BACKOFF = 0.25
BACKOFF_MAX = 4.0


#: The slowest answer waited for: at least this many bytes per read timeout on average (a server
#: that sends a byte now and then, never silent for a whole read timeout, is given up all the same).
MIN_BYTES_PER_TIMEOUT = 1 << 20


class SlowAnswer(OSError):
    """An answer that came slower than ``MIN_BYTES_PER_TIMEOUT`` per read timeout (a trickle): a
    timeout (``is_timeout``), but no ``TimeoutError``, which fsspec's ``sync`` would replace by its own."""


def answer_deadline(size: int) -> float:
    """Seconds a request for ``size`` bytes may take in all: a connection, a read timeout, and one
    more for each ``MIN_BYTES_PER_TIMEOUT`` bytes (a listing or a ``HEAD``: ``size`` 0, the first two)."""
    connect, read = timeouts()
    return connect + read * (1 + max(0, size) / MIN_BYTES_PER_TIMEOUT)


class Changed(OSError):
    """The file is not the one listed: another ETag, size or revision (rewritten during the run)."""


class Gone(OSError):
    """The file is no longer there (404), or access is refused (403): retrying cannot help."""


class WrongAnswer(Gone):
    """The server answered other bytes than those asked (another range, the whole file, fewer bytes)."""


@dataclass(frozen=True)
class RemoteEntry:
    """A listed file: its URL (as read: it may hold credentials or a signed query, never shown), size and
    version (ETag, modification time or the hub's blob id)."""

    url: str
    size: int
    version: str

    @property
    def name(self) -> str:
        """The file's URL as shown and written (``urls.display_url``): the name of its rows and messages."""
        return display_url(self.url)


def has_magic(url: str) -> bool:
    return any(ch in urlsplit(url).path for ch in "*?[")


def timeouts() -> tuple[float, float]:
    """(connect, read) timeouts in seconds: the defaults, or ``LENGTHSCAN_HTTP_TIMEOUT`` for both."""
    given = os.environ.get(TIMEOUT_VAR, "").strip()
    if not given:
        return CONNECT_TIMEOUT_S, READ_TIMEOUT_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise SourceError(f"{TIMEOUT_VAR}={given!r}: give the seconds to wait for a server (a number over 0)")
    return seconds, seconds


def is_timeout(exc: BaseException) -> bool:
    """``exc`` (or what caused it) is a connection or read that timed out."""
    while exc is not None:
        if isinstance(exc, (TimeoutError, SlowAnswer)) or "timeout" in type(exc).__name__.lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def timeout_text(exc: BaseException | None = None) -> str:
    """What timed out, for a message: the connection or the answer, and how to wait longer."""
    connect, read = timeouts()
    if isinstance(exc, SlowAnswer):
        what = f"the answer came slower than {MIN_BYTES_PER_TIMEOUT >> 20} MiB per {read:g} s"
    elif "connect" in type(exc).__name__.lower():
        what = f"no connection within {connect:g} s"
    else:
        what = f"no answer within {read:g} s"
    return f"{what}; {TIMEOUT_VAR} sets the seconds to wait"


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def check_answer(entry: RemoteEntry, start: int, end: int, status: int, headers, body: bytes) -> None:
    """An answer to a request for bytes ``[start, end)`` of ``entry`` holds those bytes of that file:
    ``Changed`` when its ETag, modification time or size (``Content-Range``'s total) is not the
    listed one (a server that ignores ``If-Match``), ``WrongAnswer`` when it is another range (206
    with another ``Content-Range``, or none), the whole file (200) or another length."""
    _check_version(entry, headers)
    asked = end - start
    if status == 206:
        found = _CONTENT_RANGE.match(headers.get("Content-Range") or "")
        if found is None:
            raise WrongAnswer(f"the server answered 206 without a valid Content-Range "
                              f"({headers.get('Content-Range')!r})")
        first, last, total = int(found.group(1)), int(found.group(2)), found.group(3)
        if total != "*" and int(total) != entry.size:
            raise Changed(f"its size is now {int(total):,} bytes (Content-Range), {entry.size:,} when listed")
        if (first, last) != (start, end - 1):
            raise WrongAnswer(f"the server sent bytes {first}-{last} instead (its Content-Range): another part of "
                              "the file than the one asked")
    elif status == 200:
        if not (start == 0 and len(body) == asked == entry.size):
            sent = headers.get("Content-Length")
            sent = f"{int(sent):,} bytes" if sent and sent.isdigit() else "a body"
            raise WrongAnswer(f"the server answered 200 with {sent} (not a byte range) to a request for {asked:,}: "
                              "it does not serve byte ranges (a server with Range support is needed)")
    else:
        raise WrongAnswer(f"the server answered HTTP {status} to a byte-range request")
    if len(body) != asked:
        raise WrongAnswer(f"{'more' if len(body) > asked else f'{len(body):,}'} bytes came back of the {asked:,} "
                          f"asked (Content-Range {headers.get('Content-Range')!r})")


def _check_version(entry: RemoteEntry, headers) -> None:
    """The answer's ETag (or, where the listing had none, its Last-Modified) is the listed one."""
    if not entry.version:
        return
    if entry.version.startswith(('"', 'W/"')):
        now = headers.get("ETag")
        if now and now.removeprefix("W/") != entry.version.removeprefix("W/"):
            raise Changed(f"its ETag is now {now}, {entry.version} when listed")
    else:
        now = headers.get("Last-Modified")
        if now and not headers.get("ETag") and now != entry.version:
            raise Changed(f"its Last-Modified is now {now}, {entry.version} when listed")
