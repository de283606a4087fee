"""The Ray engine's source checks, before any cluster starts: a URL's secrets are not in their messages."""

from __future__ import annotations

import pytest

from lengthscan.engines.ray.session import EngineError
from lengthscan.engines.ray.sources import check_source


def test_a_refused_url_is_named_without_its_credentials_or_query():
    with pytest.raises(EngineError) as raised:
        check_source("https://alice7q:s3cr3tPW@host/x.parquet?X-Amz-Signature=SIGdeadbeef")
    message = str(raised.value)
    assert message.startswith("https://***@host/x.parquet: cannot open this object-storage location")
    assert not any(s in message for s in ("alice7q", "s3cr3tPW", "SIGdeadbeef", "Signature"))


@pytest.mark.parametrize("suffix", [".zstd", ".xz"])
def test_compressions_ray_readers_do_not_detect_are_refused_before_reading(tmp_path, suffix):
    """Ray Data's readers detect .gz, .bz2 and .zst by suffix; a .zstd or .xz file would be parsed
    as its compressed bytes: refused by name (the local engine reads both)."""
    import lzma

    import zstandard

    from lengthscan.engines.ray.sources import open_for_ray

    data = b'{"text": "hello"}\n' * 3
    path = tmp_path / f"rows.jsonl{suffix}"
    path.write_bytes(lzma.compress(data) if suffix == ".xz" else zstandard.ZstdCompressor().compress(data))
    with pytest.raises(EngineError, match=rf"rows.jsonl{suffix}: the Ray engine reads .gz, .bz2 and .zst files"):
        open_for_ray(None, str(path), None)
