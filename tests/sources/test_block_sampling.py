"""Block samples: whole row groups drawn at random, stratified by file, reproducible from the seed and
the files' row-group sizes alone; and what their statistics say (cluster bootstrap, design effect)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan import audit
from lengthscan.sources.sampling import choose_unit, draw_blocks, plan_sample
from lengthscan.stats.design import block_summary


def test_blocks_are_whole_groups_at_least_the_sample_and_in_proportion_to_the_files():
    blocks = [[1000] * 40, [1000] * 10, [500] * 20, [1000] * 30]
    n = int(0.05 * sum(map(sum, blocks)))
    design = draw_blocks(blocks, n, seed=11)
    rows = int((design.stops - design.starts).sum())
    assert rows >= n
    per_file = np.bincount(design.files, minlength=4)
    # due 2, 0.5, 1 and 1.5 blocks: the whole parts, and one systematic draw gives one of the halves
    assert per_file.tolist() in ([2, 1, 1, 1], [2, 0, 1, 2])
    # every drawn block is one of the file's groups, whole
    bounds = np.concatenate([[0], np.cumsum(np.concatenate([np.asarray(b) for b in blocks]))])
    assert set(design.starts.tolist()) <= set(bounds.tolist()) and set(design.stops.tolist()) <= set(bounds.tolist())
    assert design.blocks_total == 100 and np.all(np.diff(design.starts) > 0)


def test_the_draw_depends_on_the_seed_and_the_group_sizes_only():
    blocks = [[300] * 7, [120] * 9, [999] * 3]
    a, b = draw_blocks(blocks, 600, seed=5), draw_blocks([list(x) for x in blocks], 600, seed=5)
    assert np.array_equal(a.starts, b.starts) and np.array_equal(a.files, b.files)
    draws = {tuple(draw_blocks(blocks, 600, seed=s).starts.tolist()) for s in range(20)}
    assert len(draws) > 5  # the seed matters


def test_each_file_gets_blocks_in_proportion_over_many_draws():
    blocks = [[100] * 50, [100] * 150]  # a quarter of the rows, then three quarters
    counts = np.zeros(2)
    for seed in range(200):
        counts += np.bincount(draw_blocks(blocks, 1000, seed).files, minlength=2)
    assert counts[0] / counts.sum() == pytest.approx(0.25, abs=0.01)  # stratified: exact up to the rounding


def test_a_plan_falls_back_to_rows_without_blocks_and_says_so():
    plan = plan_sample(10_000, sample=100, unit="block", blocks=None, seed=1)
    assert plan.unit == "row" and plan.design is None and "no row groups" in plan.reason
    block = plan_sample(10_000, sample=100, unit="block", blocks=[[100] * 100], seed=1)
    assert block.unit == "block" and block.indices.size == 100 and block.design.count == 1
    every = plan_sample(1000, sample="90%", unit="block", blocks=[[500, 500]], seed=1)
    assert every.full  # the blocks cover every row


def test_the_default_unit():
    assert choose_unit(None, remote=True, has_blocks=True, local_bytes=lambda: 0)[0] == "block"
    assert choose_unit(None, remote=True, has_blocks=False, local_bytes=lambda: 0)[0] == "row"
    assert choose_unit(None, remote=False, has_blocks=True, local_bytes=lambda: 3 << 30)[0] == "block"
    assert choose_unit(None, remote=False, has_blocks=True, local_bytes=lambda: 1 << 20)[0] == "row"
    assert choose_unit("row", remote=True, has_blocks=True, local_bytes=lambda: 0) == ("row", "")


def test_sorted_blocks_have_a_large_design_effect_and_mixed_ones_about_one():
    rng = np.random.default_rng(0)
    values = rng.lognormal(5, 1, 20_000).astype(np.int64)
    blocks = np.repeat(np.arange(100), 200)
    mixed = block_summary(values, blocks, 100, seed=0)
    ordered = block_summary(np.sort(values), blocks, 100, seed=0)
    assert 0.5 < mixed["design_effect"] < 2 and mixed["effective_rows"] > 10_000
    assert ordered["design_effect"] > 20 and ordered["effective_rows"] < 1000
    lo, hi = ordered["intervals"]["p50"]
    assert hi - lo > 3 * (mixed["intervals"]["p50"][1] - mixed["intervals"]["p50"][0])
    assert block_summary(values[:5], np.zeros(5, np.int64), 1, seed=0)["intervals"] is None  # one block: no interval


def test_a_sorted_corpus_gets_the_finding_and_wider_intervals(tmp_path, bpe_dir, corpus_rows):
    texts = sorted((r["text"] for r in corpus_rows if r["text"]), key=len)
    pq.write_table(pa.table({"text": texts}), tmp_path / "sorted.parquet", row_group_size=50)
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"text": [texts[i] for i in rng.permutation(len(texts))]}), tmp_path / "mixed.parquet",
                   row_group_size=50)
    kw = dict(tokenizer=str(bpe_dir), input="text", sample="30%", sample_unit="block", seed=2, cache=False)
    ordered = audit(str(tmp_path / "sorted.parquet"), **kw).to_dict()
    mixed = audit(str(tmp_path / "mixed.parquet"), **kw).to_dict()
    o, m = ordered["splits"][0]["fields"]["input_tokens"], mixed["splits"][0]["fields"]["input_tokens"]
    assert o["design"]["design_effect"] > 5 > m["design"]["design_effect"]
    width = lambda f: f["intervals"]["p50"][1] - f["intervals"]["p50"][0]  # noqa: E731
    assert width(o) > width(m)
    from lengthscan.report.findings import findings

    assert any("blocks of the sample differ more than rows do" in line for line in findings(ordered))
    assert not any("differ more than rows" in line for line in findings(mixed))


def test_files_that_differ_are_strata_not_a_design_effect():
    """Blocks drawn stratified by file: files of very different lengths (one of long documents, one of
    short ones) do not widen the intervals, blocks within a file that differ (a sorted file) do."""
    from lengthscan.stats.design import collapsed_strata

    rng = np.random.default_rng(3)
    values, blocks, strata = [], [], []
    for f in range(12):
        for j in range(3):
            mu = 8 if f == 0 else 3 if f == 1 else 5
            values.append(rng.lognormal(mu, 1, 500).astype(np.int64))
            blocks.append(np.full(500, f * 3 + j))
            strata.append(f)
    v, b = np.concatenate(values), np.concatenate(blocks)
    stratified = block_summary(v, b, 36, seed=0, strata=np.array(strata))
    pooled = block_summary(v, b, 36, seed=0)
    assert stratified["design_effect"] < 2 < 20 < pooled["design_effect"]
    assert [g.tolist() for g in collapsed_strata(np.array([0, 1, 1, 2, 3, 3, 4]))] == [[0, 1, 2], [3, 4, 5, 6]]


def test_a_handful_of_blocks_bounds_nothing():
    values = np.arange(3000)
    summary = block_summary(values, np.repeat(np.arange(3), 1000), 3, seed=0, strata=np.arange(3))
    assert summary["too_few_blocks"] and summary["effective_rows"] is None
    assert all(v == (0, None) for v in summary["intervals"].values())
