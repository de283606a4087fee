"""URLs as they may be shown or written: without credentials, without a query string.

A remote source's URL may carry secrets: a user and password (``https://user:password@host/...``)
or a signed query string (``?X-Amz-Signature=...``, a SAS token, an access token). The URL itself
is used to read the file and is never shown; everything a user reads or lengthscan writes (the
report's source, ``lengths.parquet``'s and the rejects' ``source_file``, the command line in the
report, error messages and warnings) holds :func:`display_url` instead: ``https://***@host/path``,
the query and fragment dropped. :func:`redact_urls` does the same to every URL inside a text (a
library's error message may quote the URL it was given).
"""

from __future__ import annotations

import re

#: A URL inside a text: a scheme, ``://``, then everything up to white space or a quote or bracket.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>(){}`]*")


def display_url(url: str) -> str:
    """``url`` without its secrets: the user information replaced by ``***`` and the query string and
    fragment dropped (``https://user:pw@host/a.parquet?sig=x`` -> ``https://***@host/a.parquet``).
    Text that is not a URL (a local path) is returned as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
        return url
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if "@" in authority:  # the user information ends at the authority's last "@" (it may hold "?" or "#")
        authority = "***@" + authority.rsplit("@", 1)[1]
    else:
        for mark in "?#":  # a query right after the host (https://host?token=...)
            authority = authority.split(mark, 1)[0]
    for mark in "?#":
        path = path.split(mark, 1)[0]
    return f"{scheme}://{authority}{path}"


def redact_urls(text: str) -> str:
    """``text`` with every URL in it made :func:`display_url`."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: display_url(m.group()), text)
