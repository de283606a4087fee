"""Statistics are exact (numpy's nearest rank) and merge into exactly the union's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthscan.measure.records import FieldSpec
from lengthscan.stats.histograms import (
    PERCENTILES,
    Histogram,
    JointHistogram,
    binned,
    log_bins,
    merge_histograms,
    merge_joint,
    percentile_interval,
    percentiles,
    proportion_interval,
    summarize,
)
from lengthscan.stats.tally import pair_from_lengths, stats_from_lengths

lengths = st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=400)


@given(lengths)
@settings(max_examples=200, deadline=None)
def test_percentiles_equal_numpy_inverted_cdf(values):
    hist = Histogram.of(values)
    got = percentiles(hist)
    for q in PERCENTILES:
        assert got[f"p{q:g}"] == int(np.percentile(values, q, method="inverted_cdf"))


@given(lengths)
@settings(max_examples=100, deadline=None)
def test_summary_is_exact(values):
    s = summarize(Histogram.of(values))
    assert s.count == len(values)
    assert s.min == min(values) and s.max == max(values)
    assert s.mean == sum(values) / len(values)


@given(lengths, st.data())
@settings(max_examples=200, deadline=None)
def test_merge_of_shards_equals_whole(values, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=5)))
    shards = np.split(np.asarray(values), cuts)
    merged = merge_histograms([Histogram.of(s) for s in shards])
    assert merged == Histogram.of(values)
    assert percentiles(merged) == percentiles(Histogram.of(values))


@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 10**5)), min_size=1, max_size=200), st.data())
@settings(max_examples=100, deadline=None)
def test_field_and_pair_stats_merge_exactly(pairs, data):
    x = np.asarray([p[0] for p in pairs])
    y = np.asarray([p[1] for p in pairs])
    flags = np.zeros(len(x), np.int8)
    cut = data.draw(st.integers(0, len(x)))
    spec = FieldSpec("input", "text")
    whole = stats_from_lengths(spec, x, flags)
    parts = stats_from_lengths(spec, x[:cut], flags[:cut]).merge(stats_from_lengths(spec, x[cut:], flags[cut:]))
    assert parts == whole
    xs, ys = spec, FieldSpec("target", "summary")
    pw = pair_from_lengths(xs, ys, x, y)
    pp = pair_from_lengths(xs, ys, x[:cut], y[:cut]).merge(pair_from_lengths(xs, ys, x[cut:], y[cut:]))
    assert pp == pw
    assert merge_joint([JointHistogram.of(x[:cut], y[:cut]), JointHistogram.of(x[cut:], y[cut:])]) == \
        JointHistogram.of(x, y)


def test_ratio_stats_are_target_over_input():
    x = np.asarray([10, 20, 40, 0])
    y = np.asarray([5, 5, 40, 3])
    pair = pair_from_lengths(FieldSpec("input", "a"), FieldSpec("target", "b"), x, y)
    d = pair.to_dict()
    assert d["rows"] == 3  # the row with no input tokens has no ratio
    assert d["ratio"]["min"] == 0.25 and d["ratio"]["max"] == 1.0


@given(st.integers(0, 10**7))
def test_log_bins_cover_every_value(v):
    edges = log_bins(v)
    assert edges[0] == 0 and edges[-1] > v
    assert np.all(np.diff(edges) > 0)
    assert binned(Histogram.of([v]), edges).sum() == 1


def test_percentile_interval_brackets_truth_usually():
    rng = np.random.default_rng(1)
    population = np.rint(rng.lognormal(4, 1, 200_000)).astype(np.int64)
    truth = int(np.percentile(population, 90, method="inverted_cdf"))
    hits = 0
    for seed in range(100):
        sample = np.random.default_rng(seed).choice(population, 2000, replace=False)
        lo, hi = percentile_interval(Histogram.of(sample), 90)
        hits += lo <= truth <= hi
    assert 88 <= hits <= 100  # a 95% interval


def test_percentile_interval_upper_is_open_beyond_the_sample():
    lo, hi = percentile_interval(Histogram.of(range(100)), 99.9)
    assert hi is None and lo <= 99


def test_proportion_interval():
    lo, hi = proportion_interval(0, 1000, 1_000_000)
    assert lo == 0.0 and 0 < hi < 0.01
    lo, hi = proportion_interval(50, 1000, 1_000_000)
    assert lo < 0.05 < hi
    assert proportion_interval(7, 100, 100) == (0.07, 0.07)  # a full pass is exact
