"""Fixtures of the Ray engine tests: a real two-node cluster on one machine, and the corpus as
Parquet shards and as a ``save_to_disk`` DatasetDict.

The cluster is session-wide: one ``ray.init`` per pytest process (each xdist worker has its own),
started by the first test that asks for it and shut down at the end of the session. The S3 tests'
credentials are in its environment from the start, so that its worker processes inherit them, as a
real cluster's nodes have their own.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lengthscan
from tests.support.reference import proven_first

RAY_REASON = 'the Ray engine tests need Ray: pip install "lengthscan[ray]"'
#: Credentials for moto's S3 server (``test_ray_clean.s3_corpus``).
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def cluster():
    ray = pytest.importorskip("ray", reason=RAY_REASON)
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        c.add_node(num_cpus=2)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        # one pool of actors for the whole session (as a notebook's series of runs would keep it):
        # each run finds them started (test_ray_pool.py checks what keeping them changes)
        with lengthscan.keep_ray_actors():
            yield c
    finally:
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module", autouse=True)
def _count_only_proven_first(bpe_dir):
    """The local and the Ray reports of a module's comparisons alike, whatever ran before
    (``tests.support.reference.proven_first``)."""
    proven_first(bpe_dir)


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory, corpus_rows):
    """The corpus as three Parquet shards of unequal size, several row groups each."""
    folder = tmp_path_factory.mktemp("shards")
    cuts = [0, 700, 1900, len(corpus_rows)]
    for i in range(3):
        table = pa.Table.from_pylist(corpus_rows[cuts[i]:cuts[i + 1]],
                                     schema=pa.schema([("text", pa.string()), ("summary", pa.string())]))
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=300)
    return str(folder / "part-*.parquet")


@pytest.fixture(scope="module")
def disk_dict(tmp_path_factory, corpus_rows):
    from datasets import Dataset, DatasetDict

    path = tmp_path_factory.mktemp("disk") / "dd"
    DatasetDict({"train": Dataset.from_list(corpus_rows[:1800]),
                 "validation": Dataset.from_list(corpus_rows[1800:])}).save_to_disk(str(path))
    return str(path)
