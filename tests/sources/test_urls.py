"""URLs as lengthscan shows and writes them: no user information, no query string, no fragment."""

from __future__ import annotations

import pytest

from lengthscan.sources.urls import display_url, redact_urls

SHA = "1" * 40


@pytest.mark.parametrize("url,shown", [
    ("https://alice:pw@host/a/b.parquet?X-Amz-Signature=abc&X-Amz-Credential=AKID", "https://***@host/a/b.parquet"),
    ("http://token@host:8080/data.jsonl", "http://***@host:8080/data.jsonl"),
    ("https://host/blob.parquet?sv=2024&sig=xyz#frag", "https://host/blob.parquet"),
    ("https://host?token=1", "https://host"),
    ("http://u:p?w#d@host/x.csv", "http://***@host/x.csv"),  # "?" and "#" inside a password
    ("http://u:p@[::1]:80/x?s=1", "http://***@[::1]:80/x"),
    ("s3://bucket/key/part-0.parquet", "s3://bucket/key/part-0.parquet"),
    ("s3://AKID:SECRET@bucket/key.parquet", "s3://***@bucket/key.parquet"),
    (f"hf://datasets/org/ds@{SHA}/data/train.parquet", f"hf://datasets/org/ds@{SHA}/data/train.parquet"),
    ("data/train.jsonl", "data/train.jsonl"),
    ("/corpus/odd?name#.jsonl", "/corpus/odd?name#.jsonl"),  # a local path keeps every character
])
def test_display_url(url, shown):
    assert display_url(url) == shown
    assert display_url(shown) == shown


def test_redact_urls_in_a_library_message():
    text = ("403, message='Forbidden', url='https://alice:pw@host/x.parquet?X-Amz-Signature=abc' "
            "(URL('http://u:p@h/y.jsonl?sig=1')) then s3://bucket/k.parquet and ./local?x")
    assert redact_urls(text) == ("403, message='Forbidden', url='https://***@host/x.parquet' "
                                 "(URL('http://***@h/y.jsonl')) then s3://bucket/k.parquet and ./local?x")
    assert redact_urls("no URL here: a?b@c") == "no URL here: a?b@c"
