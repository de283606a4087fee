"""``train_sampling_strategy="batch_rebalance"``: the numpy port against the real ``BatchRebalanceSampler``
as the installed Trainer builds it (its DataLoader's batches of row indices, and an actual
``Trainer.train()`` epoch for ``lengthscan memory --sampler batch_rebalance``), and its invariants
with torch hidden."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from lengthscan.cli.main import main
from lengthscan.memory import MemoryOptions, Shape, estimate, load_config
from lengthscan.training.batches import Batches, random_batches
from lengthscan.training.rebalance import TRAINER_REBALANCE_SEED, most_rows, rebalance_available, rebalance_batches
from tests.factories import write_jsonl


def _distributions(n: int, seed: int) -> dict[str, np.ndarray]:
    """Lengths that take the sampler's different paths: many ties, a long tail, a few rows far
    longer than the rest (a group shrinks to one row and is frozen), floats, all equal."""
    rng = np.random.default_rng(seed)
    spiky = rng.integers(1, 4, n)
    spiky[rng.choice(n, max(n // 40, 1), replace=False)] = 3000
    tail = np.round(rng.lognormal(4.0, 0.9, n)).astype(np.int64) + 1
    tail[rng.choice(n, max(n // 200, 1), replace=False)] *= 20
    return {"ties": rng.integers(1, 6, n), "long_tail": tail, "spiky": spiky,
            "floats": np.round(rng.random(n) * 30, 3), "equal": np.full(n, 7)}


def _need_trainer():
    """Skip, with the reason, where the real Trainer's batch_rebalance cannot run here."""
    pytest.importorskip("torch", reason="torch not installed: the port is compared with the real Trainer when it is")
    pytest.importorskip("accelerate", reason="accelerate not installed: transformers' Trainer requires it")
    if not rebalance_available():
        pytest.skip("the installed transformers has no BatchRebalanceSampler "
                    "(train_sampling_strategy='batch_rebalance')")


@pytest.fixture(scope="module")
def tiny_llama():
    pytest.importorskip("torch", reason="torch not installed: the port is compared with the real Trainer when it is")
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                        max_position_embeddings=64))


def _loader_batches(trainer) -> list[list[int]]:
    """Row indices of every batch ``trainer.get_train_dataloader()`` yields."""
    return [b["idx"].tolist() for b in trainer.get_train_dataloader()]


def _collate_idx(features):
    import torch

    return {"idx": torch.tensor([f["idx"] for f in features])}


# -- the real Trainer: the port is exact --------------------------------------------------------------------

@pytest.mark.slow
def test_port_is_the_trainers_dataloader(tmp_path, tiny_llama):
    _need_trainer()
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    cases = 0
    sizes_seen: set[int] = set()
    for n in (5, 203, 640):
        for name, lengths in _distributions(n, seed=n).items():
            ds = Dataset.from_dict({"length": lengths.tolist(), "idx": list(range(n))})
            for bs, ga in ((1, 1), (4, 1), (3, 2), (8, 4), (2, 7)):
                for seed, drop_last in ((11, False), (42, True)):
                    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=bs,
                                             gradient_accumulation_steps=ga, seed=seed, use_cpu=True,
                                             train_sampling_strategy="batch_rebalance", report_to=[],
                                             remove_unused_columns=False, dataloader_drop_last=drop_last,
                                             disable_tqdm=True)
                    trainer = Trainer(model=tiny_llama, args=args, train_dataset=ds, data_collator=_collate_idx)
                    real = _loader_batches(trainer)
                    # args.seed does not reach the sampler: the Trainer leaves its seed at 42
                    got = rebalance_batches(lengths, bs, grad_accum=ga, drop_last=drop_last)
                    assert [b.tolist() for b in got.indices] == real, (n, name, bs, ga, seed, drop_last)
                    assert got.sizes.tolist() == [len(b) for b in real] and len(got) == len(real)
                    sizes_seen.update(got.sizes.tolist())
                    cases += 1
    assert cases == 3 * 5 * 5 * 2
    assert len(sizes_seen) > 10  # variable batch sizes really happened, or the comparison says little


def test_trainer_infers_lengths_from_input_ids(tmp_path, tiny_llama):
    """Without a ``length`` column the Trainer measures ``len(input_ids)``, as the audit does."""
    _need_trainer()
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    lengths = _distributions(97, seed=5)["long_tail"] % 60 + 1
    ds = Dataset.from_dict({"input_ids": [[1] * int(k) for k in lengths], "idx": list(range(97))})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=3,
                             train_sampling_strategy="batch_rebalance", use_cpu=True, report_to=[],
                             remove_unused_columns=False, disable_tqdm=True)
    real = _loader_batches(Trainer(model=tiny_llama, args=args, train_dataset=ds, data_collator=_collate_idx))
    assert [b.tolist() for b in rebalance_batches(lengths, 4, grad_accum=3).indices] == real


def test_port_is_the_sampler_for_other_seeds_and_tiny_tails():
    """The sampler itself, for seeds (later epochs use 42 + epoch) and tails padded with repeated rows."""
    pytest.importorskip("torch", reason="torch not installed: the port is compared with the real sampler when it is")
    if not rebalance_available():
        pytest.skip("the installed transformers has no BatchRebalanceSampler")
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    cases = 0
    for n in (1, 2, 3, 9, 50, 301):
        for name, lengths in _distributions(n, seed=n + 1).items():
            for bs, ga in ((1, 2), (2, 5), (5, 3), (16, 2)):
                for seed in (0, 7, 43):
                    for drop_last in (False, True):
                        sampler = BatchRebalanceSampler(lengths.tolist(), effective_batch_size=bs * ga, dp_size=1,
                                                        grad_accum=ga, seed=seed, rank=0, drop_last=drop_last)
                        got = rebalance_batches(lengths, bs, grad_accum=ga, seed=seed, drop_last=drop_last)
                        assert [b.tolist() for b in got.indices] == [list(b) for b in sampler], (
                            n, name, bs, ga, seed, drop_last)
                        cases += 1
    assert cases == 6 * 5 * 4 * 3 * 2


# -- without torch: the same invariants ------------------------------------------------------------------

def test_invariants_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # ``import torch`` fails: the port never needs it
    lengths = _distributions(1003, seed=2)["spiky"]
    b = rebalance_batches(lengths, 8, grad_accum=4)
    assert isinstance(b, Batches) and b.strategy == "batch_rebalance" and (b.batch_size, b.group_size) == (8, 32)
    # every row once (1003 = 31 x 32 + 11: the tail has at least 4 rows, so nothing repeats)
    assert sorted(b.order.tolist()) == list(range(1003))
    assert len(b) == 32 * 4 and b.sizes.sum() == 1003 and len(b.indices) == len(b)
    assert (b.sizes[:124].reshape(31, 4).sum(axis=1) == 32).all()  # each optimizer step holds 32 rows
    assert b.sizes.max() > 8 and b.sizes.min() == 1  # long rows alone, short rows many to a batch
    assert b.sizes.max() <= most_rows(1003, 8, 4) == 29
    for i, rows in enumerate(b.indices):
        assert (np.diff(lengths[rows]) <= 0).all()  # longest first
        assert np.array_equal(rows, b[i]) and b.padded_lengths(lengths)[i] == lengths[rows].max()
    assert np.array_equal(b[-1], b[len(b) - 1]) and b.padded_lengths(lengths, 8)[0] % 8 == 0
    with pytest.raises(IndexError):
        b[len(b)]
    # one group per step: each batch is the random order's batch (seed 42), sorted longest first
    plain = rebalance_batches(lengths, 8)
    for mine, rnd in zip(plain.indices, random_batches(1003, 8, seed=TRAINER_REBALANCE_SEED).indices):
        assert mine.tolist() == sorted(rnd.tolist(), key=lambda r: -lengths[r])
    # a tail shorter than the accumulation steps repeats the epoch's first rows; drop_last drops it
    tiny = rebalance_batches([5, 1], 1, grad_accum=3)
    assert tiny.sizes.tolist() == [1, 1, 1] and sorted(set(tiny.order.tolist())) == [0, 1]
    assert len(rebalance_batches([5, 1], 1, grad_accum=3, drop_last=True)) == 0
    assert rebalance_batches([], 4).indices == [] and most_rows(2, 1, 3) == 1
    with pytest.raises(ValueError, match="grad_accum"):
        rebalance_batches([1, 2], 2, grad_accum=0)


def test_availability_is_read_from_the_installed_sources(tmp_path, monkeypatch):
    import importlib.machinery

    import lengthscan.training.rebalance as rb

    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "trainer.py").write_text('strategies = ("random", "group_by_length")\n')
    (fake / "trainer_pt_utils.py").write_text("class LengthGroupedSampler: ...\n")
    spec = importlib.machinery.ModuleSpec("transformers", None, is_package=True)
    spec.submodule_search_locations = [str(fake)]
    monkeypatch.setattr(rb.importlib.util, "find_spec", lambda name: spec)
    assert rb.rebalance_available() is False
    (fake / "trainer.py").write_text('if strategy == "batch_rebalance": ...\n')
    (fake / "trainer_pt_utils.py").write_text("class BatchRebalanceSampler(Sampler): ...\n")
    assert rb.rebalance_available() is True
    monkeypatch.setattr(rb.importlib.util, "find_spec", lambda name: None)
    assert rb.rebalance_available() is False


# -- lengthscan memory --sampler batch_rebalance ------------------------------------------------------------

@pytest.fixture(scope="module")
def pairs_jsonl(tmp_path_factory, corpus_rows):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    rows = [r for r in corpus_rows if r["text"] and r["summary"]][:500]
    write_jsonl(path, rows, ensure_ascii=False)
    return path


def test_memory_finds_the_worst_batch_of_the_trainers_epoch(tmp_path, pairs_jsonl, bpe_dir, bart_dir, capsys):
    _need_trainer()
    import torch
    from datasets import Dataset
    from transformers import (
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainingArguments,
    )

    bs, ga, multiple, seed = 4, 3, 8, 7
    assert main(["memory", str(pairs_jsonl), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--target", "summary", "--batch-size", str(bs), "--grad-accum", str(ga), "--pad-to-multiple-of",
                 str(multiple), "--seed", str(seed), "--sampler", "batch_rebalance", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]

    # the epoch an actual Trainer.train() feeds its model (set_epoch(0), the DataLoader, the collator)
    seen = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids=None, attention_mask=None, labels=None, idx=None):
            padded = bool((attention_mask == 0).any())
            seen.append((idx.tolist(), Shape(input_ids.shape[0], input_ids.shape[1], labels.shape[1], padded)))
            return {"loss": (self.w * 0).sum()}

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    rows = [json.loads(line) for line in pairs_jsonl.read_text(encoding="utf-8").splitlines()]
    ds = Dataset.from_list([dict(tok(r["text"], text_target=r["summary"]), idx=i) for i, r in enumerate(rows)])
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=bs,
                             gradient_accumulation_steps=ga, seed=seed, num_train_epochs=1,
                             train_sampling_strategy="batch_rebalance", report_to=[], use_cpu=True,
                             remove_unused_columns=False, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    Trainer(model=Recorder(), args=args, train_dataset=ds,
            data_collator=DataCollatorForSeq2Seq(tok, pad_to_multiple_of=multiple)).train()

    options = MemoryOptions(gradient_accumulation_steps=ga)
    config = load_config(str(bart_dir))
    peaks = [estimate(config, shape, options).peak_bytes for _, shape in seen]
    worst = int(np.argmax(peaks))  # the first batch with the highest peak
    assert m["sampler"] == "batch_rebalance" and m["batches"] == len(seen)
    assert m["per_batch_peak_bytes"] == peaks and m["per_batch"]["exact"] == len(peaks)
    assert m["worst_batch"]["index"] == worst and m["worst_batch"]["rows"] == seen[worst][0]
    assert m["worst_batch"]["shape"] == seen[worst][1].to_dict() and m["peak_bytes"] == peaks[worst]
    sizes = {s.batch_size for _, s in seen}
    assert len(sizes) > 3 and max(sizes) > bs  # variable batch sizes, some above --batch-size
    assert len(set(peaks)) > 10  # a real spread of shapes, or the comparison says little
    # the any-shuffle bound holds for variable batch sizes: bs x ga - ga + 1 rows at the longest lengths
    assert m["any_shuffle"]["shape"]["batch_size"] == bs * ga - ga + 1 and m["any_shuffle"]["peak_bytes"] >= max(peaks)


def test_memory_without_the_sampler_is_a_usage_error(pairs_jsonl, bpe_dir, bart_dir, monkeypatch, capsys):
    from lengthscan.memory import epoch

    monkeypatch.setattr(epoch, "rebalance_available", lambda: False)
    assert main(["memory", str(pairs_jsonl), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--target", "summary", "--batch-size", "4", "--sampler", "batch_rebalance"]) == 2
    err = capsys.readouterr().err
    assert "BatchRebalanceSampler" in err and "use random or group_by_length" in err
