"""The worker actors kept between runs inside ``lengthscan.keep_ray_actors()`` (the session's
cluster fixture opens that block): a run that ended well leaves them for the next run, a run that
failed kills them, and leaving the block kills the kept ones."""

from __future__ import annotations

import pytest

import lengthscan
from lengthscan import audit_ray

ray = pytest.importorskip("ray")

from lengthscan.engines.ray.pool import keep_pool, keeping, kept_pool, release_actors  # noqa: E402
from lengthscan.engines.ray.worker import Worker  # noqa: E402

pytestmark = pytest.mark.ray  # a local Ray cluster (conftest.cluster)


def _alive(actors) -> bool:
    try:
        ray.get([a.forget.remote() for a in actors], timeout=60)
        return True
    except ray.exceptions.RayActorError:
        return False


def test_a_run_that_ended_well_leaves_its_actors_for_the_next(cluster, corpus_jsonl, bpe_dir):
    assert keeping()
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", full=True)
    first = audit_ray(str(corpus_jsonl), **kw)
    pool = kept_pool(ray, Worker)
    assert pool is not None and len(pool) == int(ray.cluster_resources()["CPU"])
    keep_pool(ray, Worker, pool)
    second = audit_ray(str(corpus_jsonl), **kw)
    again = kept_pool(ray, Worker)
    assert again is pool and _alive(pool.actors)  # the same actors served the second run
    keep_pool(ray, Worker, again)
    assert second.splits[0].fields == first.splits[0].fields


def test_a_failed_run_kills_its_actors_and_leaving_the_block_kills_the_kept(cluster, tmp_path, corpus_jsonl,
                                                                               bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", full=True)
    audit_ray(str(corpus_jsonl), **kw)
    kept = kept_pool(ray, Worker)
    assert kept is not None
    keep_pool(ray, Worker, kept)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n' * 3000 + '{"text": 7}\n')  # a number where text is: exit 2, in an actor
    from lengthscan.measure.columns import ColumnError

    with pytest.raises(ColumnError, match="row 3000 of .*bad.jsonl has int value '7'"):
        audit_ray(str(bad), **kw)
    assert kept_pool(ray, Worker) is None and not _alive(kept.actors)  # the failed run's actors are gone
    with lengthscan.keep_ray_actors():  # a block inside the session's: leaving it keeps the outer block's
        audit_ray(str(corpus_jsonl), **kw)
    inner = kept_pool(ray, Worker)
    assert inner is not None
    keep_pool(ray, Worker, inner)
    release_actors()  # what leaving the outermost block does
    assert kept_pool(ray, Worker) is None and not _alive(inner.actors)
