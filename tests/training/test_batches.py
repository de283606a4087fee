"""Batches and padding: the numpy port against the real transformers samplers, collators and Trainer
(torch required), and the report's invariants with torch hidden (numpy's permutation stands in)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from lengthscan.training.batches import (
    TRAINER_DRAWS_BEFORE_GROUPING,
    exact_permutation,
    grouped_batches,
    padded_shape,
    permutation,
    random_batches,
    simulate,
)


def _long_tailed(n: int, seed: int = 0) -> np.ndarray:
    """Token lengths like real text: log-normal body, a few rows far out, many ties."""
    rng = np.random.default_rng(seed)
    lengths = np.round(rng.lognormal(4.0, 0.9, n)).astype(np.int64) + 1
    lengths[rng.choice(n, max(n // 500, 1), replace=False)] *= 20
    return lengths


@pytest.fixture
def no_torch(monkeypatch):
    """``import torch`` fails, as in an install without it: the numpy fallback runs."""
    monkeypatch.setitem(sys.modules, "torch", None)


# -- the real transformers and torch: the port is exact -------------------------------------------------------

def test_grouped_batches_are_the_length_grouped_sampler_order():
    torch = pytest.importorskip("torch", reason="torch not installed: the port is compared with the real sampler")
    from transformers.trainer_pt_utils import LengthGroupedSampler

    rng = np.random.default_rng(1)
    cases = 0
    for n in (1, 3, 31, 200, 1000, 4097):
        for group in (1, 4, 16, 64):
            for seed in (0, 7):
                # ties, a long tail, floats
                for lengths in (rng.integers(1, 12, n), _long_tailed(n, seed), rng.random(n) * 30):
                    sampler = LengthGroupedSampler(group, lengths=lengths.tolist(),
                                                   generator=torch.Generator().manual_seed(seed))
                    got = grouped_batches(lengths, group, seed=seed)
                    assert got.order.tolist() == list(sampler), (n, group, seed)
                    cases += 1
    # gradient accumulation: the sampler groups per device x accumulation, batches stay per device
    lengths = _long_tailed(999)
    sampler = LengthGroupedSampler(8 * 4, lengths=lengths.tolist(), generator=torch.Generator().manual_seed(3))
    got = grouped_batches(lengths, 8, grad_accum=4, seed=3)
    assert got.order.tolist() == list(sampler) and got.group_size == 32 and len(got[0]) == 8
    assert cases == 6 * 4 * 2 * 3


def test_explicit_mega_batch_mult_matches_the_function():
    torch = pytest.importorskip("torch", reason="torch not installed: the port is compared with the real function")
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = _long_tailed(500)
    for mult in (1, 3, 50):
        expected = get_length_grouped_indices(lengths.tolist(), 8, mega_batch_mult=mult,
                                              generator=torch.Generator().manual_seed(5))
        assert grouped_batches(lengths, 8, seed=5, mega_batch_mult=mult).order.tolist() == expected


def test_random_batches_are_the_dataloader_batches():
    torch = pytest.importorskip("torch", reason="torch not installed: the port is compared with the real DataLoader")
    from torch.utils.data import DataLoader, RandomSampler

    for n in (1, 10, 333):
        for bs in (1, 8, 32):
            for drop_last in (False, True):
                sampler = RandomSampler(range(n), generator=torch.Generator().manual_seed(n + bs))
                loader = DataLoader(range(n), batch_size=bs, sampler=sampler, drop_last=drop_last)
                got = random_batches(n, bs, seed=n + bs, drop_last=drop_last)
                assert [b.tolist() for b in got.indices] == [b.tolist() for b in loader]
    assert exact_permutation()


def test_padded_shapes_and_shares_are_the_real_collators(bpe_dir, corpus_rows):
    torch = pytest.importorskip("torch", reason="torch not installed: the real collators return tensors")
    from torch.utils.data import DataLoader, RandomSampler
    from transformers import (
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        DataCollatorWithPadding,
    )
    from transformers.trainer_pt_utils import LengthGroupedSampler

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    pairs = [r for r in corpus_rows if r["text"] and r["summary"]][:400]
    features = [dict(tok(r["text"], text_target=r["summary"])) for r in pairs]
    inputs = np.asarray([len(f["input_ids"]) for f in features])
    targets = np.asarray([len(f["labels"]) for f in features])
    assert inputs.max() > 4 * np.median(inputs)  # a real spread of lengths, or the test says little
    for bs, multiple, seed in ((4, None, 0), (8, 8, 1), (16, 8, 2)):
        collator = DataCollatorForSeq2Seq(tok, pad_to_multiple_of=multiple)
        report = simulate(inputs, targets, batch_sizes=(bs,), seed=seed, pad_to_multiple_of=multiple,
                          as_trainer=False)["by_batch_size"][0]
        samplers = {"random": RandomSampler(features, generator=torch.Generator().manual_seed(seed)),
                    "group_by_length": LengthGroupedSampler(bs, lengths=inputs.tolist(),
                                                            generator=torch.Generator().manual_seed(seed))}
        ours = {"random": random_batches(len(features), bs, seed=seed), "group_by_length": grouped_batches(
            inputs, bs, seed=seed)}
        for name, sampler in samplers.items():
            real = list(DataLoader(features, batch_size=bs, sampler=sampler, collate_fn=collator))
            mine = ours[name]
            assert [tuple(b["input_ids"].shape) for b in real] == [
                (len(i), padded_shape(inputs[i], multiple)) for i in mine.indices]
            assert [tuple(b["labels"].shape) for b in real] == [
                (len(i), padded_shape(targets[i], multiple)) for i in mine.indices]
            summary = report["strategies"][name]
            pad_in = sum(int((b["attention_mask"] == 0).sum()) for b in real)
            pad_tg = sum(int((b["labels"] == -100).sum()) for b in real)
            total_in, total_tg = sum(b["input_ids"].numel() for b in real), sum(b["labels"].numel() for b in real)
            assert summary["input_padding_share"] == round(pad_in / total_in, 6)
            assert summary["target_padding_share"] == round(pad_tg / total_tg, 6)
            assert summary["padding_share"] == round((pad_in + pad_tg) / (total_in + total_tg), 6)
            assert summary["largest_batch"]["input"] == max(b["input_ids"].numel() for b in real)
            assert summary["largest_batch"]["target"] == max(b["labels"].numel() for b in real)
        # DataCollatorWithPadding pads inputs exactly as DataCollatorForSeq2Seq does
        plain = DataCollatorWithPadding(tok, pad_to_multiple_of=multiple)
        batch = ours["random"][0]
        no_labels = [{k: v for k, v in features[i].items() if k != "labels"} for i in batch]
        assert plain(no_labels)["input_ids"].shape[1] == padded_shape(inputs[batch], multiple)


def test_simulate_reproduces_trainer_train_epoch_zero(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed: the real Trainer needs it")
    pytest.importorskip("accelerate", reason="accelerate not installed: transformers' Trainer requires it")
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    seen: list[list[int]] = []

    class Tiny(torch.nn.Module):  # records the rows of every batch forward receives
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def forward(self, x=None, idx=None):
            seen.append(idx.tolist())
            return {"loss": self.w(x).sum()}

    lengths = _long_tailed(300, seed=4)
    ds = Dataset.from_dict({"x": [[1.0]] * len(lengths), "idx": list(range(len(lengths))), "length": lengths})

    def collate(features):
        return {"x": torch.tensor([f["x"] for f in features]), "idx": torch.tensor([f["idx"] for f in features])}

    for strategy in ("random", "group_by_length"):
        seen.clear()
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                 seed=11, num_train_epochs=1, train_sampling_strategy=strategy, report_to=[],
                                 use_cpu=True, remove_unused_columns=False, save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True)
        Trainer(model=Tiny(), args=args, train_dataset=ds, data_collator=collate).train()
        if strategy == "random":
            expected = random_batches(len(lengths), 4, seed=11)
        else:
            expected = grouped_batches(lengths, 4, grad_accum=2, seed=11, draws_before=TRAINER_DRAWS_BEFORE_GROUPING)
        assert seen == [b.tolist() for b in expected.indices], strategy


# -- without torch: numpy's permutation, the same invariants ------------------------------------------------

def test_without_torch_the_permutation_is_still_torchs(no_torch):
    """torch's randperm reproduced in numpy: the same orders with torch hidden (and never imported)."""
    assert exact_permutation()
    expected = [36, 4, 27]  # torch.randperm(50, generator=torch.Generator().manual_seed(3))[:3]
    assert permutation(50, 3)[:3].tolist() == expected
    assert sorted(permutation(50, 3).tolist()) == list(range(50))
    report = simulate(_long_tailed(100), batch_sizes=(8,))
    assert report["exact_permutation"] is True
    json.dumps(report)  # plain Python values only: it goes into report.json as is


def test_numpy_permutation_equals_torch_randperm():
    torch = pytest.importorskip("torch", reason="torch not installed: compared with its randperm when it is")
    for n in (1, 2, 7, 1000, 250_000):
        for seed in (0, 3, 11):
            for draws in (0, 1):
                g = torch.Generator().manual_seed(seed)
                for _ in range(draws):
                    torch.empty((), dtype=torch.int64).random_(generator=g)
                assert np.array_equal(permutation(n, seed, draws_before=draws), torch.randperm(n, generator=g).numpy())


def test_batches_cover_every_row_once_and_longest_goes_first(no_torch):
    lengths = _long_tailed(1003)
    for b in (random_batches(1003, 16, seed=1), grouped_batches(lengths, 16, grad_accum=2, seed=1)):
        assert sorted(b.order.tolist()) == list(range(1003))
        assert len(b) == 63 and b.sizes.tolist() == [16] * 62 + [11] and len(b[-1]) == 11
        dropped = type(b)(b.strategy, b.batch_size, b.group_size, b.order[:992])
        assert len(dropped) == 62
    grouped = grouped_batches(lengths, 16, seed=1)
    assert lengths[grouped[0][0]] == lengths.max()  # an OOM shows at step 0, as transformers intends
    assert random_batches(1003, 16, drop_last=True).order.size == 992
    with pytest.raises(IndexError):
        grouped[63]


def test_padded_shape_rounds_like_the_collators():
    assert padded_shape([3, 17, 9]) == 17
    assert padded_shape([3, 17, 9], 8) == 24
    assert padded_shape([16], 8) == 16 and padded_shape([0], 8) == 0
    assert padded_shape([1.5, 2.25]) == 2.25


def test_a_hand_counted_example(no_torch):
    # 4 rows, batches of 2: whatever the order, the padded positions are counted from the batches
    report = simulate([2, 4, 6, 8], [1, 1, 1, 3], batch_sizes=(2,), rows=[10, 11, 12, 13])
    entry = report["by_batch_size"][0]
    order = grouped_batches(np.asarray([2, 4, 6, 8]), 2).order.tolist()
    assert order[0] == 3  # the longest row leads
    grouped = entry["strategies"]["group_by_length"]
    assert grouped["largest_batch"]["input"] == 16 and 13 in grouped["largest_batch"]["input_rows"]
    assert entry["worst_case"] == {"input": 16, "target": 6, "input_row": 13, "target_row": 13}
    lengths = np.asarray([2, 4, 6, 8])
    padded = sum(2 * lengths[b].max() for b in grouped_batches(lengths, 2).indices)
    assert grouped["input_padding_share"] == round(1 - 20 / padded, 6)


def test_report_invariants_on_long_tailed_data(no_torch):
    inputs, targets = _long_tailed(20000, 1), _long_tailed(20000, 2) // 4 + 1
    rows = np.arange(20000) * 3 + 7  # row ids that are not positions
    report = simulate(inputs, targets, rows=rows, pad_to_multiple_of=8, grad_accum=2)
    assert report["simulated_rows"] == 20000 and report["left_out"] == 0
    assert [e["batch_size"] for e in report["by_batch_size"]] == [8, 16, 32]
    by_row = dict(zip(rows.tolist(), zip(inputs.tolist(), targets.tolist())))
    for entry in report["by_batch_size"]:
        bs, worst = entry["batch_size"], entry["worst_case"]
        assert entry["effective_batch_size"] == 2 * bs
        assert by_row[worst["input_row"]][0] == inputs.max() and by_row[worst["target_row"]][1] == targets.max()
        assert worst["input"] == bs * padded_shape([inputs.max()], 8)
        strategies = entry["strategies"]
        for name, s in strategies.items():
            for key in ("padding_share", "input_padding_share", "target_padding_share"):
                assert 0 <= s[key] < 1, (name, key)
            largest = s["largest_batch"]
            assert largest["input"] <= worst["input"] and largest["target"] <= worst["target"]
            assert s["median_batch"]["input"] <= largest["input"]
            # the reported rows are that batch: their padded size is the one reported
            for side, k in (("input", 0), ("target", 1)):
                held = [by_row[r][k] for r in largest[f"{side}_rows"]]
                assert len(held) * padded_shape(held, 8) == largest[side]
        assert strategies["group_by_length"]["padding_share"] < strategies["random"]["padding_share"]
        # grouping puts the longest input in the first, full batch: the input worst case happens
        assert strategies["group_by_length"]["largest_batch"]["input"] == worst["input"]


def test_rows_without_length_are_left_out_and_audio_in_seconds(no_torch):
    report = simulate([5, -1, 7, 3, 9], [2, 2, -1, 4, 1], batch_sizes=(2,), rows=[100, 101, 102, 103, 104])
    assert (report["rows"], report["simulated_rows"], report["left_out"]) == (5, 3, 2)
    every_row = {r for s in report["by_batch_size"][0]["strategies"].values()
                 for b in [s["largest_batch"]["input_rows"]] for r in b}
    assert every_row <= {100, 103, 104}

    seconds = np.asarray([1.5, float("nan"), 30.0, 2.25, 4.0])
    report = simulate(seconds, None, batch_sizes=(2,), unit="seconds")
    entry = report["by_batch_size"][0]
    assert report["left_out"] == 1 and entry["worst_case"]["input"] == 60.0 and entry["worst_case"]["input_row"] == 2
    assert entry["worst_case"]["target"] is None
    grouped = entry["strategies"]["group_by_length"]
    assert grouped["largest_batch"]["input"] == 60.0 and grouped["target_padding_share"] is None
    assert simulate(seconds, [3, 4, 5, 6, 7], batch_sizes=(2,), unit="seconds")["by_batch_size"][0][
        "strategies"]["random"]["padding_share"] is None  # seconds and tokens do not add up
    with pytest.raises(ValueError, match="seconds"):
        simulate(seconds, unit="seconds", pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="batch_size"):
        random_batches(10, 0)
