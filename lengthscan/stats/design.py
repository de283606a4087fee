"""What a block sample can say: percentile intervals from a cluster bootstrap over the blocks drawn,
the design effect and the effective sample size.

Rows of one block (a Parquet row group) are alike when the data is sorted or grouped (by source,
by length, by date): then m rows of a block say less than m rows drawn one by one, and intervals
computed as if rows were drawn independently are too narrow. The bootstrap resamples whole blocks
with replacement (``REPLICATES`` times, fewer for millions of rows; the blocks' strata, their
files, are pooled, which errs on the wide side), recomputes each nearest-rank percentile of the
resampled rows and takes the 2.5th and 97.5th percentiles of those. The design effect is the
bootstrap variance of the mean over the variance a row sample of the same size would have
(s^2 / n); the effective sample size is n over it (at most n): the number of independently drawn
rows the block sample is worth. An upper end the sample cannot bound (the order-statistic interval
of a row sample of n_eff rows reaches past the largest value seen) stays None, as for row samples.
"""

from __future__ import annotations

import math

import numpy as np

from lengthscan.stats.histograms import PERCENTILES, Z95, nearest_rank_index, pkey

#: Bootstrap replicates: 400, fewer (at least 100) past ``WORK`` rows x replicates, so that a block
#: sample of millions of rows costs seconds, not minutes (tokenizing them costs far more).
REPLICATES = 400
MIN_REPLICATES = 100
WORK = 100_000_000
#: A design effect above this is a finding: the blocks differ more than rows do.
DEFF_FINDING = 2.0


def block_summary(values: np.ndarray, blocks: np.ndarray, n_blocks: int, seed: int, scale: int = 1) -> dict:
    """``values`` (integer units, rows with a length) and the drawn block (0..n_blocks-1) of each:
    the percentile intervals, design effect and effective sample size (see the module)."""
    n = int(values.size)
    out = {"blocks": int(np.unique(blocks).size) if n else 0, "rows": n}
    if n < 2 or n_blocks < 2:
        return {**out, "design_effect": None, "effective_rows": n, "intervals": None}
    order = np.argsort(values, kind="stable")
    v, b = values[order], blocks[order]
    block_sum = np.bincount(blocks, weights=values.astype(np.float64), minlength=n_blocks)
    block_n = np.bincount(blocks, minlength=n_blocks).astype(np.float64)
    rng = np.random.default_rng([seed, 0x5EED])
    replicates = int(min(REPLICATES, max(MIN_REPLICATES, WORK // n)))
    reps = np.empty((replicates, len(PERCENTILES)))
    means = np.empty(replicates)
    for r in range(replicates):
        w = np.bincount(rng.integers(0, n_blocks, n_blocks), minlength=n_blocks)
        cum = np.cumsum(w[b])
        total = int(cum[-1]) if cum.size else 0
        if total == 0:  # every block drawn holds no length: this replicate says nothing
            reps[r], means[r] = np.nan, np.nan
            continue
        ranks = [nearest_rank_index(total, q) + 1 for q in PERCENTILES]
        reps[r] = v[np.searchsorted(cum, ranks, side="left")]
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


def _conv(v, scale: int):
    return v if scale == 1 or v is None else v / scale
