"""What a block sample can say: percentile intervals from a stratified cluster bootstrap over the
blocks drawn, the design effect and the effective sample size.

Rows of one block (a Parquet row group) are alike when the data is sorted or grouped (by source,
by length, by date): then m rows of a block say less than m rows drawn one by one, and intervals
computed as if rows were drawn independently are too narrow. The blocks were drawn stratified by
file, so the bootstrap resamples blocks within strata: each file's blocks, a file with a single
block drawn pooled with the next files in order until the stratum holds two or more (collapsed
strata, the usual remedy; it errs on the wide side). It is Rao and Wu's rescaling bootstrap: from
a stratum of n_h blocks, n_h - 1 are drawn with replacement and each weighs n_h / (n_h - 1), so
the replicates' spread is unbiased for the stratified design's variance. ``REPLICATES`` times
(fewer for millions of rows), each nearest-rank percentile of the reweighted rows is recomputed;
the interval runs from the 2.5th to the 97.5th percentile of those. The design effect is the
bootstrap variance of the mean over the variance a row sample of the same size would have
(s^2 / n); the effective sample size is n over it (at most n): the number of independently drawn
rows the block sample is worth. An upper end the sample cannot bound (the order-statistic interval
of a row sample of n_eff rows reaches past the largest value seen) stays None, as for row samples.
"""

from __future__ import annotations

import math

import numpy as np

from lengthscan.stats.histograms import PERCENTILES, Z95, pkey

#: Bootstrap replicates: 400, fewer (at least 100) past ``WORK`` rows x replicates, so that a block
#: sample of millions of rows costs seconds, not minutes (tokenizing them costs far more).
REPLICATES = 400
MIN_REPLICATES = 100
WORK = 100_000_000
#: Fewer blocks than this bound nothing: the intervals are left open (from the smallest value seen).
MIN_BLOCKS = 10
#: A design effect above this is a finding: the blocks differ more than rows do.
DEFF_FINDING = 2.0


def block_summary(values: np.ndarray, blocks: np.ndarray, n_blocks: int, seed: int, scale: int = 1,
                  strata: np.ndarray | None = None) -> dict:
    """``values`` (integer units, rows with a length), the drawn block (0..n_blocks-1) of each and
    each block's stratum (its file; None: one stratum): the percentile intervals, design effect and
    effective sample size (see the module)."""
    n = int(values.size)
    out = {"blocks": int(np.unique(blocks).size) if n else 0, "rows": n}
    if n < 2 or n_blocks < 2:
        return {**out, "design_effect": None, "effective_rows": n, "intervals": None}
    if out["blocks"] < MIN_BLOCKS:  # a bootstrap over a handful of blocks is confidently wrong: no bound
        low = _conv(int(values.min()), scale)
        return {**out, "design_effect": None, "effective_rows": None, "too_few_blocks": True,
                "intervals": {pkey(q): (low, None) for q in PERCENTILES}}
    order = np.argsort(values, kind="stable")
    v, b = values[order], blocks[order]
    block_sum = np.bincount(blocks, weights=values.astype(np.float64), minlength=n_blocks)
    block_n = np.bincount(blocks, minlength=n_blocks).astype(np.float64)
    resample = _RaoWu(collapsed_strata(np.zeros(n_blocks, np.int64) if strata is None else np.asarray(strata)))
    rng = np.random.default_rng([seed, 0x5EED])
    replicates = int(min(REPLICATES, max(MIN_REPLICATES, WORK // n)))
    reps = np.empty((replicates, len(PERCENTILES)))
    means = np.empty(replicates)
    for r in range(replicates):
        w = resample.draw(rng)
        cum = np.cumsum(w[b])
        total = float(cum[-1]) if cum.size else 0.0
        if total <= 0:  # every block drawn holds no length: this replicate says nothing
            reps[r], means[r] = np.nan, np.nan
            continue
        targets = [total * q / 100.0 for q in PERCENTILES]  # nearest rank on the weights
        at = np.minimum(np.searchsorted(cum, np.asarray(targets) * (1 - 1e-12), side="left"), v.size - 1)
        reps[r] = v[at]
        means[r] = (w * block_sum).sum() / (w * block_n).sum()
    ok = ~np.isnan(means)
    var_rows = float(values.var(ddof=1)) / n
    var_boot = float(np.var(means[ok], ddof=1)) if ok.sum() > 1 else 0.0
    deff = var_boot / var_rows if var_rows > 0 else (1.0 if var_boot == 0 else math.inf)
    effective = n if deff <= 1 else max(1, int(n / deff))
    intervals = {}
    for j, q in enumerate(PERCENTILES):
        lo, hi = np.quantile(reps[ok, j], [0.025, 0.975], method="inverted_cdf")
        p = q / 100.0
        reach = effective * p + Z95 * math.sqrt(effective * p * (1 - p))
        upper = None if math.ceil(reach) + 1 > effective else int(hi)
        intervals[pkey(q)] = (_conv(int(lo), scale), _conv(upper, scale))
    return {**out, "design_effect": round(deff, 3), "effective_rows": effective, "intervals": intervals}


def collapsed_strata(strata: np.ndarray) -> list[np.ndarray]:
    """The blocks (their positions) of each stratum, in stratum order, a stratum of one block pooled
    with the next ones until it holds two or more (the last, if alone, joins the one before)."""
    groups: list[list[int]] = []
    current: list[int] = []
    for label in np.unique(strata):
        current.extend(np.flatnonzero(strata == label).tolist())
        if len(current) >= 2:
            groups.append(current)
            current = []
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return [np.asarray(g, np.int64) for g in groups]


class _RaoWu:
    """Replicate block weights: n_h - 1 of a stratum's n_h blocks drawn with replacement, each draw
    weighing n_h / (n_h - 1) (every stratum at once)."""

    def __init__(self, groups: list[np.ndarray]):
        self.members = np.concatenate(groups)
        sizes = np.array([g.size for g in groups])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.start = np.repeat(starts, sizes - 1)  # one entry per draw
        self.size = np.repeat(sizes, sizes - 1)
        self.weight = np.repeat(sizes / (sizes - 1), sizes - 1)
        self.blocks = int(sizes.sum())

    def draw(self, rng) -> np.ndarray:
        picks = self.members[self.start + (rng.random(self.start.size) * self.size).astype(np.int64)]
        return np.bincount(picks, weights=self.weight, minlength=self.blocks)


def _conv(v, scale: int):
    return v if scale == 1 or v is None else v / scale
