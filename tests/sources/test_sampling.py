"""Samples are defined by row positions and a seed, never the first N rows."""

from __future__ import annotations

import numpy as np
import pytest

from lengthscan.sources.sampling import DEFAULT_SAMPLE_ROWS, FULL_UP_TO, SampleError, parse_sample, plan_sample


def test_sample_is_the_sorted_default_rng_choice():
    plan = plan_sample(10_000, sample="600", seed=7)
    expected = np.sort(np.random.default_rng(7).choice(10_000, 600, replace=False))
    assert np.array_equal(plan.indices, expected)
    assert np.array_equal(plan_sample(10_000, sample=600, seed=7).indices, expected)


def test_sample_is_spread_over_the_rows():
    idx = plan_sample(100_000, sample=600, seed=7).indices
    assert idx.min() < 1_000 and idx.max() > 99_000
    assert len(np.unique(idx)) == 600
    counts, _ = np.histogram(idx, bins=10, range=(0, 100_000))
    assert counts.min() > 30


def test_fraction_and_percent():
    assert plan_sample(1000, sample="0.01").size == 10
    assert plan_sample(1000, sample="5%").size == 50
    assert parse_sample("0.5") == 0.5 and parse_sample("3") == 3


@pytest.mark.parametrize("bad", ["0", "-3", "1.5x", "abc", "0.0", "2.5"])
def test_bad_sample_values(bad):
    with pytest.raises(SampleError):
        parse_sample(bad)


def test_default_is_full_when_small_and_sampled_when_large():
    small = plan_sample(FULL_UP_TO)
    assert small.full and "default" in small.reason
    large = plan_sample(FULL_UP_TO + 1)
    assert not large.full and large.size == DEFAULT_SAMPLE_ROWS and "--full" in large.reason


def test_full_and_oversized_samples_measure_everything():
    assert plan_sample(50, full=True).full
    assert plan_sample(50, sample=600).full
    with pytest.raises(SampleError):
        plan_sample(50, full=True, sample=10)
