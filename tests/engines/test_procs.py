"""Worker processes that run pickled calls (``engines/procs.py``): real processes, real pipes.

Every wait has a timeout: a worker that dies must fail its jobs, never leave the parent waiting."""

from __future__ import annotations

import math
import operator
import os
import pickle
import time

import pytest

from lengthscan.engines.procs import WorkerDied, Workers

WAIT = 60  # seconds: far more than any of these jobs takes


def test_answers_come_back_to_their_jobs_across_workers():
    with Workers(2) as pool:
        futures = [pool.submit(operator.mul, k, k + 1) for k in range(40)]
        assert [f.result(timeout=WAIT) for f in futures] == [k * (k + 1) for k in range(40)]
        big = "é" * 3_000_000  # larger than a pipe's buffer, both ways
        assert pool.submit(operator.add, big, "!").result(timeout=WAIT) == big + "!"


def test_a_jobs_exception_is_raised_by_its_future_and_the_worker_goes_on():
    with Workers(1) as pool:
        bad = pool.submit(math.sqrt, -1)
        good = pool.submit(math.factorial, 5)
        with pytest.raises(ValueError, match="math domain error"):
            bad.result(timeout=WAIT)
        assert good.result(timeout=WAIT) == 120


def test_a_job_that_does_not_pickle_fails_alone():
    with Workers(1) as pool:
        lost = pool.submit(lambda: 1)
        kept = pool.submit(operator.neg, 3)
        with pytest.raises((pickle.PicklingError, AttributeError)):
            lost.result(timeout=WAIT)
        assert kept.result(timeout=WAIT) == -3


def test_what_a_job_prints_does_not_break_the_answers(capfd):
    with Workers(1) as pool:
        assert pool.submit(print, "a line a job printed").result(timeout=WAIT) is None
        assert pool.submit(operator.add, 1, 2).result(timeout=WAIT) == 3
    assert "a line a job printed" in capfd.readouterr().err


def test_a_worker_that_dies_fails_its_jobs_with_its_exit_status():
    """``os._exit`` stands for the kernel's OOM killer: the job and the jobs queued behind it fail
    at once (``multiprocessing.Pool`` would wait for them for ever), and so does a job given later,
    each with the exit status."""
    started = time.monotonic()
    with Workers(1) as pool:
        dead = pool.submit(os._exit, 7)
        behind = pool.submit(operator.add, 1, 1)
        with pytest.raises(WorkerDied, match="exit status 7"):
            dead.result(timeout=WAIT)
        with pytest.raises(WorkerDied, match="exit status 7"):
            behind.result(timeout=WAIT)
        with pytest.raises(WorkerDied, match="exit status 7"):  # a job given later is told why
            pool.submit(operator.add, 2, 2).result(timeout=WAIT)
    assert time.monotonic() - started < WAIT


def test_leaving_the_block_stops_the_workers():
    with Workers(2) as pool:
        pool.submit(operator.add, 1, 1).result(timeout=WAIT)
        procs = [w.proc for w in pool._workers]  # noqa: SLF001 - the processes themselves
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError), Workers(1) as pool:  # an error: the workers are killed, not waited for
        pool.submit(time.sleep, 30)
        procs = [w.proc for w in pool._workers]  # noqa: SLF001
        raise RuntimeError("stop")
    assert all(p.poll() is not None for p in procs)


def test_an_exception_that_does_not_unpickle_arrives_as_its_text():
    from tests.support.workers import raise_picky

    with Workers(1) as pool:
        with pytest.raises(RuntimeError, match="Picky: picky failure"):
            pool.submit(raise_picky).result(timeout=WAIT)
        assert pool.submit(operator.add, 2, 3).result(timeout=WAIT) == 5
