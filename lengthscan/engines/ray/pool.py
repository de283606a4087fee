"""Actor pools and block pieces: how the Ray engine spreads blocks over its actors."""

from __future__ import annotations

import numpy as np

from lengthscan.sources.scan import Batch


def table_batches(table, rows: np.ndarray, batch_rows: int):
    """``Batch``es of ``batch_rows`` rows of an Arrow table whose rows are ``rows``."""
    import pyarrow as pa

    for k in range(0, table.num_rows, batch_rows):
        part = table.slice(k, batch_rows).combine_chunks()
        rb = part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], schema=part.schema)
        yield Batch(rows[k:k + batch_rows], rb)


def block_refs(ray, ds):
    """(block reference, rows) of a Ray dataset, in order, without fetching the blocks."""
    for bundle in ds.iter_internal_ref_bundles():
        for ref, meta in zip(bundle.block_refs, bundle.metadata):
            n = meta.num_rows if meta.num_rows is not None else ray.get(ray.remote(count_rows).remote(ref))
            yield ref, n


#: At most this many actors share one block (each fetches the whole block from the object store).
MAX_PIECES = 8


def block_pieces(n: int, actors: int, batch_rows: int) -> list[tuple[int, int]]:
    """Ranges of a block's ``n`` rows (or sampled rows) for different actors: one block is split
    over up to ``MAX_PIECES`` actors, in pieces of at least ``batch_rows`` rows, since Ray Data reads
    a Parquet file as one block per ~128 MiB whatever ``override_num_blocks`` asks, which would
    leave all but one actor idle on a single-file corpus. Pieces are contiguous and in row order."""
    k = max(1, min(actors, MAX_PIECES, n // max(1, batch_rows)))
    return [(n * i // k, n * (i + 1) // k) for i in range(k)] if n else []


def count_rows(block) -> int:
    """A block's rows (a Ray task, when the block's metadata does not say)."""
    return block.num_rows


def pool_size(ray) -> int:
    """Actors a pool has: the cluster's CPUs less a quarter (at least one) left for the read tasks."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, cpus - max(1, cpus // 4))


def start_actors(ray, cls, *args) -> list:
    """A pool of ``cls`` actors (``pool_size``), each restarted by Ray when its process dies and its
    unfinished calls retried (every call is a pure function of its block). Each holds a CPU; on a
    cluster of fewer than two CPUs the one actor holds none, else Ray Data's read tasks would wait
    forever for the CPU it holds."""
    cpus = 1 if ray.cluster_resources().get("CPU", 1) >= 2 else 0
    actor_cls = ray.remote(num_cpus=cpus, max_restarts=-1, max_task_retries=-1)(cls)
    return [actor_cls.remote(*args) for _ in range(pool_size(ray))]
