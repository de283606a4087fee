"""Rows of a Parquet row group read by their pages (the page index), and the page blocks a block sample
draws from a huge row group: the same rows and values as pyarrow reading the whole file, locally and
over HTTP, for every page layout pyarrow writes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan import audit
from lengthscan.sources.parquet_pages import SPLIT_OVER, local_page_index, page_blocks
from lengthscan.sources.thrift import decode, encode
from tests.support.range_server import RangeServer


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz     .,"))
    return ["".join(rng.choice(letters, size=int(rng.lognormal(6, 1)) + 1)) for _ in range(n)]


@pytest.mark.parametrize("options", [dict(compression="zstd"), dict(compression="snappy", data_page_version="2.0"),
                                     dict(compression=None, use_dictionary=["n"]),
                                     dict(compression="gzip", data_page_size=4096)])
def test_rows_read_by_page_equal_pyarrows(tmp_path, options):
    texts = _texts(4000)
    table = pa.table({"text": texts, "n": pa.array(range(4000), pa.int32()), "nested": [[1, 2]] * 4000,
                      "maybe": [None if i % 7 else f"x{i}" for i in range(4000)]})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, write_page_index=True, row_group_size=2500, **options)
    raw = path.read_bytes()
    footer = raw[-8 - int.from_bytes(raw[-8:-4], "little"):-8]
    assert encode(decode(footer)[0]) == footer  # the footer decodes and encodes back byte for byte
    index = local_page_index(str(path))
    assert index.can_read(0, ["text", "n", "maybe"]) and not index.can_read(0, ["nested"])
    rng = np.random.default_rng(1)
    for group, size, start in ((0, 2500, 0), (1, 1500, 2500)):
        rows = np.sort(rng.choice(size, 37, replace=False))
        got = index.read(group, ["maybe", "text", "n"], rows, pq.read_schema(path))
        assert got.column("text").to_pylist() == [texts[start + r] for r in rows]
        assert got.column("n").to_pylist() == (rows + start).tolist()
        assert got.column("maybe").to_pylist() == table.column("maybe").take(rows + start).to_pylist()
        assert got.schema == pa.schema([table.schema.field(c) for c in ("maybe", "text", "n")])


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    """Two files of one row group each (pyarrow's default layout for a few hundred thousand rows),
    with a page index, each text column past ``SPLIT_OVER``."""
    folder = tmp_path_factory.mktemp("huge")
    for f in range(2):
        texts = _texts(13000, seed=f)
        pq.write_table(pa.table({"text": texts, "summary": [t[:40] for t in texts]}), folder / f"part-{f}.parquet",
                       row_group_size=1 << 20, write_page_index=True, compression="snappy")
        assert pq.ParquetFile(folder / f"part-{f}.parquet").metadata.row_group(0).column(0).total_compressed_size \
            >= SPLIT_OVER
    return folder


@pytest.mark.slow
def test_huge_row_groups_are_split_into_page_blocks(huge):
    path = str(huge / "part-0.parquet")
    meta = pq.read_metadata(path)
    blocks = page_blocks(meta, lambda: local_page_index(path), (13000,), ["text"])
    assert len(blocks) >= 4 and sum(blocks) == 13000  # runs of pages of at least 1 MiB
    assert page_blocks(meta, lambda: local_page_index(path), (13000,), []) == [13000]
    assert page_blocks(meta, lambda: local_page_index(path), (13000,), ["summary"]) == [13000]  # a small column


@pytest.mark.slow
def test_a_block_sample_of_huge_row_groups_reads_a_few_pages_and_equals_the_local_audit(tmp_path, huge, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", sample="10%", sample_unit="block", seed=5,
              cache=False)
    with RangeServer(huge) as srv:
        remote = audit(f"{srv.url}/files/*.parquet", out=tmp_path / "remote", **kw)
        served = srv.bytes_served
    local = audit(str(huge / "*.parquet"), out=tmp_path / "local", **kw)
    one, other = (pq.read_table(tmp_path / d / "lengths.parquet").drop_columns(["source_file"]) for d in
                  ("remote", "local"))
    assert one.equals(other) and one.num_rows >= 2600
    assert remote.splits[0].sample.blocks_total == local.splits[0].sample.blocks_total > 2
    report = json.loads((tmp_path / "remote" / "report.json").read_text())["source"]
    assert report["bytes_read"] == served < 0.35 * report["bytes_total"]  # the drawn pages, not the whole files
