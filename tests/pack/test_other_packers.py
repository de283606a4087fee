"""axolotl's multipack and LLaMA-Factory's greedy knapsack: each simulation against that code's own
behaviour transcribed as a plain reference (axolotl 067b021 ``pack_group``, LLaMA-Factory ff6d4d1
``greedy_knapsack`` with ``length2indexes``), on random lengths, and hand-worked cases."""

from __future__ import annotations

import bisect
import json
from collections import defaultdict

import numpy as np
import pytest

from lengthscan.cli.main import main
from lengthscan.pack.others import multipack_steps, pack_knapsack, pack_multipack


def _axolotl_pack_group(sizes, capacity, bin_size):
    """axolotl's pack_group as written: first bin with room and < bin_size rows, in the given order."""
    remaining, assigned = [], []
    for i, size in enumerate(sizes):
        for b in range(len(remaining)):
            if remaining[b] >= size and len(assigned[b]) < bin_size:
                remaining[b] -= size
                assigned[b].append(i)
                break
        else:
            remaining.append(capacity - size)
            assigned.append([i])
    return assigned


def _llamafactory(lengths, cutoff, batch=1000):
    """LLaMA-Factory's packing per preprocessing batch: (rows, lengths) of each pack. With packing
    its DataArguments lower cutoff_len by one, and infer_seqlen cuts each example to that."""
    packs, cutoff = [], cutoff - 1
    for start in range(0, len(lengths), batch):
        kept, index_of = [], defaultdict(list)
        for row in range(start, min(start + batch, len(lengths))):
            n = min(int(lengths[row]), cutoff)
            index_of[n].append(row)
            kept.append(n)
        numbers = sorted(kept)
        while numbers:
            knapsack, room = [], cutoff
            while True:
                i = bisect.bisect(numbers, room)
                if i == 0:
                    break
                room -= numbers[i - 1]
                knapsack.append(numbers.pop(i - 1))
            packs.append(([index_of[n].pop() for n in knapsack], knapsack))
    return packs


@pytest.mark.parametrize("seed", range(6))
def test_multipack_is_axolotls_first_fit(seed):
    rng = np.random.default_rng(seed)
    n, length, micro = int(rng.integers(50, 2500)), int(rng.integers(8, 400)), int(rng.integers(1, 4))
    lengths = rng.integers(0, 500, n)
    order = rng.permutation(n)
    packs = pack_multipack(lengths, length, order=order, micro_batch_size=micro, group_size=600, bin_rows=7)
    kept = [int(r) for r in order if 2 <= lengths[r] <= length]  # axolotl's min_sample_len is 2
    expected = []
    for g in range(0, len(kept), 600):
        group = kept[g:g + 600]
        expected += [[group[i] for i in b] for b in _axolotl_pack_group([lengths[r] for r in group], micro * length, 7)]
    o = packs.offsets
    assert [packs.rows[o[p]:o[p + 1]].tolist() for p in range(packs.count)] == expected
    assert packs.lost.tolist() == [int(x) if x > length or x == 1 else 0 for x in lengths]


def test_multipack_by_hand():
    # order 0..4, capacity 10, at most 2 rows a bin: 6 | 5 -> new | 4 fits bin 0 (6+4) | 3 fits bin 1 | 2 -> new
    packs = pack_multipack([6, 5, 4, 3, 2], 10, bin_rows=2)
    assert packs.offsets.tolist() == [0, 2, 4, 5] and packs.rows.tolist() == [0, 2, 1, 3, 4]
    steps = multipack_steps(packs, 10)
    assert steps["batches"] == 3 and steps["sample_packing_eff_est"] == 0.67  # 20 / 30, rounded up
    assert multipack_steps(packs, 10, grad_accum=2)["steps_per_epoch"] == 1  # 3 bins // 2, as axolotl floors


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_is_llamafactorys(seed):
    rng = np.random.default_rng(100 + seed)
    lengths = rng.integers(1, 300, int(rng.integers(10, 3000)))
    cutoff = int(rng.integers(50, 400))
    packs = pack_knapsack(lengths, cutoff)
    assert packs.lost.tolist() == [max(int(n) - (cutoff - 1), 0) for n in lengths]
    o = packs.offsets
    mine = [(packs.rows[o[p]:o[p + 1]].tolist(), packs.seq_lengths[o[p]:o[p + 1]].tolist())
            for p in range(packs.count)]
    assert mine == _llamafactory(lengths, cutoff)


@pytest.mark.parametrize("strategy", ["multipack", "knapsack"])
def test_the_audit_packs_with_them(tmp_path, bpe_dir, corpus_jsonl, strategy):
    out = tmp_path / "o"
    assert main(["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--packing",
                 strategy, "--max-length", "64", "--batch-size", "2", "--out", str(out), "--quiet"]) == 0
    split = json.loads((out / "report.json").read_text())["packing"]["splits"][0]
    assert split["strategy"] == strategy and split["packs"] > 0
    assert split["tokens_in_packs"] + split["tokens_lost"] == split["tokens"]
    if strategy == "multipack":
        assert split["multipack"]["sample_packing_eff_est"] >= split["efficiency"]
