"""Plain HTTP(S) files: listed through fsspec's ``HTTPFileSystem`` (a folder's or glob's index page),
asked with a ``HEAD`` (or a GET of one byte), read with one ranged ``GET`` a read on fsspec's aiohttp session.

Every answer is checked (``network.check_answer``): the range, status and length asked, and the
ETag, modification time and size the file had when listed; ``If-Match`` is sent too, but a server
may ignore it. Connections and reads time out (``network.timeouts``); a ``HEAD`` that times out or
meets a server error is retried as a read is. No URL is put in a message but as
``urls.display_url`` shows it.
"""

from __future__ import annotations

import time

from lengthscan.sources.remote import network
from lengthscan.sources.remote.network import Changed, Gone, RemoteEntry, has_magic, timeouts
from lengthscan.sources.source import first_line
from lengthscan.sources.urls import display_url

#: The bytes a folder's or glob's index page is given time for (``network.answer_deadline``).
LISTING_BYTES = 8 << 20
#: Statuses that retrying cannot change: the file is not there, or not for us.
_REFUSED = (401, 403, 404, 410)


class HttpStore:
    """Plain HTTP(S) through fsspec's ``HTTPFileSystem``'s session: a ranged GET per read, no block cache."""

    def __init__(self):
        import aiohttp
        import fsspec

        connect, read = timeouts()
        # fsspec's own requests (index pages of folders and globs) end within a deadline too
        timeout = aiohttp.ClientTimeout(total=network.answer_deadline(LISTING_BYTES), connect=connect,
                                        sock_connect=connect, sock_read=read)
        self.fs = fsspec.filesystem("http", skip_instance_cache=True, client_kwargs={"timeout": timeout})
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=read)

    async def _request(self, method: str, url: str, headers: dict, most: int):
        """``_answer`` within ``network.answer_deadline`` of the bytes asked: ``SlowAnswer`` after it."""
        import asyncio

        deadline = network.answer_deadline(max(most, 0))
        try:
            return await asyncio.wait_for(self._answer(method, url, headers, most), deadline)
        except asyncio.TimeoutError as exc:
            if type(exc) is not asyncio.TimeoutError:  # aiohttp's own: no connection, or silence
                raise
            raise network.SlowAnswer(f"no whole answer within {deadline:g} s") from None

    async def _answer(self, method: str, url: str, headers: dict, most: int):
        session = await self.fs.set_session()
        async with session.request(method, self.fs.encode_url(url), headers=headers, allow_redirects=True,
                                   timeout=self._timeout) as r:
            length = r.headers.get("Content-Length", "")
            if r.status < 300 and length.isdigit() and int(length) <= most:
                return r.status, r.headers, await r.read()
            chunks, got = [], 0
            while r.status < 300 and got <= most and (chunk := await r.content.read(most + 1 - got)):
                chunks.append(chunk)
                got += len(chunk)
            return r.status, r.headers, b"".join(chunks)

    def request(self, method: str, url: str, headers: dict, *, most: int = -1):
        """(status, headers, body) of one request: of a successful answer's body, ``most`` bytes and one
        more at most (a server that sends the whole file for a range is not read whole)."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, self._request, method, url, headers, most)

    def _asked(self, method: str, url: str, headers: dict):
        """(status, headers) of a request without its body, retried on a timeout or a server error;
        ``Gone`` naming the URL when it cannot be asked."""
        wait, timeouts = network.BACKOFF, 0
        for attempt in range(network.RETRIES + 1):
            try:
                status, answer, _ = self.request(method, url, headers)
                if status < 500 and status != 429:
                    return status, answer
                problem = f"HTTP {status}"
            except Exception as exc:
                if not network.is_timeout(exc):
                    raise Gone(f"{display_url(url)}: cannot be read ({type(exc).__name__}: {first_line(exc)})") \
                        from None
                problem = network.timeout_text(exc)
                timeouts += 1
            if attempt == network.RETRIES or timeouts > network.TIMEOUT_RETRIES:
                raise Gone(f"{display_url(url)}: cannot be read: the request failed {attempt + 1} times "
                           f"({problem})")
            time.sleep(wait)
            wait = min(wait * 2, network.BACKOFF_MAX)
        raise AssertionError("unreachable")

    def _head(self, url: str) -> RemoteEntry | None:
        """The file's size and version from a HEAD, else from a GET of its first byte (a server
        without HEAD, a URL signed for GET only, an answer without the size); None when it is not
        there (404, 410); ``Gone`` naming it when it cannot be asked."""
        identity = {"Accept-Encoding": "identity"}
        status, headers = self._asked("HEAD", url, identity)
        encoded = headers.get("Content-Encoding", "identity") not in ("identity", "")
        size = headers.get("Content-Length") if status < 300 and not encoded else None
        if size is None and status not in (404, 410):
            status, headers = self._asked("GET", url, {**identity, "Range": "bytes=0-0"})
            total = headers.get("Content-Range", "").rpartition("/")[2]
            encoded = headers.get("Content-Encoding", "identity") not in ("identity", "")
            size = total if status == 206 and total.isdigit() else \
                headers.get("Content-Length") if status == 200 and not encoded else None
        if status in (404, 410):
            return None
        if status >= 300:
            raise Gone(f"{display_url(url)}: cannot be read (HTTP {status})")
        return self._entry(url, size, headers)

    def _entry(self, url: str, size, headers) -> RemoteEntry:
        if size is None:
            raise Gone(f"{display_url(url)}: the server does not say the file's size (no Content-Length): it "
                       "cannot be read by range")
        version = headers.get("ETag") or headers.get("Last-Modified") or ""
        return RemoteEntry(url, int(size), str(version))

    def list(self, url: str) -> list[RemoteEntry]:
        if has_magic(url):
            urls = sorted(self.fs.glob(url))
        elif url.endswith("/"):
            urls = sorted(u for u in self.fs.find(url) if not u.endswith("/"))
        else:
            urls = [url]
        out = []
        for u in urls:
            entry = self._head(u)
            if entry is None:
                raise Gone(f"{display_url(u)}: cannot be read (404, not found)")
            out.append(entry)
        return out

    def stat(self, url: str) -> RemoteEntry | None:
        return self._head(url)

    def opener(self, entry: RemoteEntry):
        """A function reading ``[start, end)`` of the file: exactly those bytes of the file listed
        (``network.check_answer``), else ``Changed``, ``Gone`` or ``WrongAnswer``; any other error
        (a timeout, a server error) is the caller's to retry."""
        # If-Match compares strongly: a weak ETag would never match (412); it is compared in each answer instead
        if_match = {"If-Match": entry.version} if entry.version.startswith('"') else {}

        def read(start: int, end: int) -> bytes:
            status, headers, body = self.request("GET", entry.url, {**if_match, "Range": f"bytes={start}-{end - 1}",
                                                                    "Accept-Encoding": "identity"}, most=end - start)
            if status == 412:
                raise Changed("its ETag changed (412 Precondition Failed)")
            if status == 416:
                raise Changed("the range is past its end (416): it is shorter than when it was listed")
            if status in _REFUSED:
                raise Gone(f"HTTP {status}" + (", no longer there" if status in (404, 410) else ""))
            if status >= 300:
                raise OSError(f"HTTP {status}")  # a server error: retried
            network.check_answer(entry, start, end, status, headers, body)
            return body
        return read
