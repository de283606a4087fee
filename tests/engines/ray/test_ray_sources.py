"""The Ray engine's source checks, before any cluster starts (a URL's secrets are not in their
messages), and the compressed files Ray Data's readers could not read, read by the actors with the
local engine's readers."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import lengthscan
from lengthscan.engines.ray.session import EngineError
from lengthscan.engines.ray.sources import check_source

pytestmark = pytest.mark.ray  # a local Ray cluster (conftest.cluster)


def test_a_refused_url_is_named_without_its_credentials_or_query():
    with pytest.raises(EngineError) as raised:  # a scheme neither the local engine nor pyarrow reads
        check_source("ftp://alice7q:s3cr3tPW@host/x.parquet?X-Amz-Signature=SIGdeadbeef")
    message = str(raised.value)
    assert message.startswith("ftp://***@host/x.parquet: cannot open this object-storage location")
    assert not any(s in message for s in ("alice7q", "s3cr3tPW", "SIGdeadbeef", "Signature"))


def test_http_and_hub_sources_pass_the_check():
    """http(s):// and hf:// files and hub ids are opened as the local engine opens them (no refusal)."""
    for spec in ("https://alice7q:s3cr3tPW@host/x.parquet", "hf://datasets/org/name/train.parquet", "org/name"):
        check_source(spec)


@pytest.mark.parametrize("suffix", [".zstd", ".xz"])
def test_compressions_ray_readers_did_not_detect_are_read_as_locally(cluster, tmp_path, suffix, bpe_dir):
    """Ray Data's readers detected .gz, .bz2 and .zst by suffix (a .zstd or .xz file was refused); the
    actors read with the local engine's readers, which read both."""
    import lzma

    import zstandard

    from lengthscan import audit_ray

    data = "".join(f'{{"text": "hello number {i} " }}\n' for i in range(50)).encode()
    path = tmp_path / f"rows.jsonl{suffix}"
    path.write_bytes(lzma.compress(data) if suffix == ".xz" else zstandard.ZstdCompressor().compress(data))
    kw = dict(tokenizer=str(bpe_dir), input="text", full=True, cache=False)
    local = lengthscan.audit(str(path), out=tmp_path / "local", **kw)
    ray = audit_ray(str(path), out=tmp_path / "ray", num_blocks=3, **kw)
    assert ray.splits[0].sample.rows_measured == local.splits[0].sample.rows_measured == 50
    assert [s.to_dict() for s in ray.splits] == [s.to_dict() for s in local.splits]
    lengths = [pq.read_table(tmp_path / side / "lengths.parquet").to_pylist() for side in ("local", "ray")]
    assert lengths[1] == lengths[0]
