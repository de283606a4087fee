"""Fixtures of the remote-source tests: the corpus as Parquet shards, JSON Lines and CSV files in one
folder, served by the range server (``tests.support.range_server``) over HTTP on 127.0.0.1."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.csv  # noqa: F401 (pa.csv)
import pyarrow.parquet as pq
import pytest

from tests.support.range_server import RangeServer


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, corpus_rows):
    """Three Parquet shards of unequal size with row groups of 100 rows, the same rows as JSON Lines
    and as CSV."""
    folder = tmp_path_factory.mktemp("remote-corpus")
    (folder / "parquet").mkdir()
    cuts = [0, 700, 1900, len(corpus_rows)]
    schema = pa.schema([("text", pa.string()), ("summary", pa.string())])
    for i in range(3):
        table = pa.Table.from_pylist(corpus_rows[cuts[i]:cuts[i + 1]], schema=schema)
        pq.write_table(table, folder / "parquet" / f"part-{i}.parquet", row_group_size=100)
    (folder / "jsonl").mkdir()
    with open(folder / "jsonl" / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for row in corpus_rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (folder / "csv").mkdir()
    pa.csv.write_csv(pa.Table.from_pylist(corpus_rows, schema=schema), folder / "csv" / "corpus.csv")
    return folder


@pytest.fixture(scope="module")
def server(corpus_dir):
    with RangeServer(corpus_dir) as srv:
        yield srv
