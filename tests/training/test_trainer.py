"""lengthscan.training.trainer against the real transformers collators, TrainingArguments and Trainer.

The collator tests run without torch (``return_tensors="np"``); the Trainer tests need torch and
accelerate (the Trainer's own requirement) and skip saying so when either is missing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

import lengthscan
from lengthscan.training.trainer import (
    LengthCappedCollator,
    add_length_column,
    length_grouped_sampler,
    trainer_length_kwargs,
)

IN_CAP, OUT_CAP = 24, 8


@pytest.fixture(scope="module")
def tok(bpe_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bpe_dir))


@pytest.fixture(scope="module")
def features(tok, corpus_rows) -> list[dict]:
    """Real docstring -> summary pairs, tokenized: long and short inputs and targets, plus ``length``."""
    rows = [r for r in corpus_rows if r["text"] and r["summary"]]
    rows = sorted(rows[:200], key=lambda r: len(r["text"]))
    pick = rows[:3] + rows[-5:]  # short rows (padded) and rows far past both caps
    out = []
    for r in pick:
        enc = tok(r["text"])
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "labels": tok(text_target=r["text"][:400] + r["summary"])["input_ids"],
                    "length": len(enc["input_ids"])})
    assert max(len(f["input_ids"]) for f in out) > 3 * IN_CAP and min(len(f["input_ids"]) for f in out) < IN_CAP
    assert max(len(f["labels"]) for f in out) > OUT_CAP
    return out


def _check_capped_seq2seq(batch, features, tok):
    ids, mask, labels = (np.asarray(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
    assert "length" not in batch
    assert ids.shape[1] <= IN_CAP and labels.shape[1] <= OUT_CAP
    for i, f in enumerate(features):
        n_in, n_out = min(len(f["input_ids"]), IN_CAP), min(len(f["labels"]), OUT_CAP)
        assert mask[i].sum() == n_in
        assert ids[i, n_in - 1] == tok.eos_token_id  # the EOS survives the cut (right padding)
        assert list(labels[i, :n_out - 1]) == list(f["labels"][:n_out - 1])
        assert labels[i, n_out - 1] == tok.eos_token_id
        assert (labels[i, n_out:] == -100).all()  # the collator's label padding is untouched


def test_seq2seq_collator_caps_inputs_and_labels_keeps_eos_drops_length(tok, features):
    from transformers import DataCollatorForSeq2Seq

    plain = DataCollatorForSeq2Seq(tok, return_tensors="np")
    before = [dict(f) for f in features]
    batch = LengthCappedCollator(plain, max_input_tokens=IN_CAP, max_target_tokens=OUT_CAP)(features)
    _check_capped_seq2seq(batch, features, tok)
    assert features == before  # the caller's rows are not modified
    # what the cap prevents: the plain collator pads to the longest row and passes `length` on
    raw = plain([dict(f) for f in features])
    assert raw["input_ids"].shape[1] > 3 * IN_CAP and list(raw["length"]) == [f["length"] for f in features]


def test_collator_on_numpy_formatted_rows(tok, features):
    from transformers import DataCollatorForSeq2Seq

    rows = Dataset.from_list(features).with_format("numpy")
    batch = LengthCappedCollator(DataCollatorForSeq2Seq(tok, return_tensors="np"), max_input_tokens=IN_CAP,
                                 max_target_tokens=OUT_CAP)([rows[i] for i in range(len(rows))])
    _check_capped_seq2seq(batch, features, tok)


def test_padding_collator_cuts_every_input_key_and_leaves_scalar_labels(tok, features):
    from transformers import DataCollatorWithPadding

    rows = [{"input_ids": f["input_ids"], "attention_mask": f["attention_mask"],
             "token_type_ids": [0] + [1] * (len(f["input_ids"]) - 1), "label": i % 2, "length": 7}
            for i, f in enumerate(features)]
    collator = LengthCappedCollator(DataCollatorWithPadding(tok, return_tensors="np"), max_input_tokens=IN_CAP,
                                    keep_eos_input=False)
    batch = collator(rows)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == (len(rows), IN_CAP)
    assert list(batch["labels"]) == [r["label"] for r in rows]
    long = next(i for i, f in enumerate(features) if len(f["input_ids"]) > IN_CAP)
    assert list(batch["input_ids"][long]) == features[long]["input_ids"][:IN_CAP]  # a plain cut, no EOS


# DataCollatorForSeq2Seq itself warns when labels arrive as tensors (it pads them as numpy arrays)
@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays")
def test_torch_tensors_in_and_out(tok, features):
    torch = pytest.importorskip("torch", reason="torch not installed: the tensor variant of the collator test")
    from transformers import DataCollatorForSeq2Seq

    rows = Dataset.from_list(features).with_format("torch")
    batch = LengthCappedCollator(DataCollatorForSeq2Seq(tok), max_input_tokens=IN_CAP,
                                 max_target_tokens=OUT_CAP)([rows[i] for i in range(len(rows))])
    assert isinstance(batch["input_ids"], torch.Tensor) and isinstance(batch["labels"], torch.Tensor)
    _check_capped_seq2seq({k: v.numpy() for k, v in batch.items()}, features, tok)


def test_collator_refuses_padding_past_its_cap(tok):
    from transformers import DataCollatorForSeq2Seq

    with pytest.raises(ValueError, match="pad_to_multiple_of=8"):
        LengthCappedCollator(DataCollatorForSeq2Seq(tok, pad_to_multiple_of=8), max_input_tokens=20)
    with pytest.raises(ValueError, match="max_length=64"):
        LengthCappedCollator(DataCollatorForSeq2Seq(tok, padding="max_length", max_length=64), max_target_tokens=32)
    with pytest.raises(ValueError, match="positive integer"):
        LengthCappedCollator(DataCollatorForSeq2Seq(tok), max_input_tokens=0)
    LengthCappedCollator(DataCollatorForSeq2Seq(tok, pad_to_multiple_of=8), max_input_tokens=24)


def test_add_length_column_from_lengthscan_columns(corpus_rows, bpe_dir):
    ds = lengthscan.add_lengths(Dataset.from_list(corpus_rows[:40]), tokenizer=str(bpe_dir), input="text",
                                target="summary")
    with pytest.raises(ValueError, match=r"row 5 has no usable length in input_tokens"):
        add_length_column(ds)  # row 5 has no text: the sampler could not place it
    ds = ds.select([i for i in range(len(ds)) if ds[i]["input_tokens"] is not None and ds[i]["target_tokens"]])
    out = add_length_column(ds)
    assert out["length"] == ds["input_tokens"] and out.features["length"].dtype == "int64"
    with pytest.raises(ValueError, match="already has a 'length' column; pass overwrite=True"):
        add_length_column(out, from_column="target_tokens")
    again = add_length_column(out, from_column="target_tokens", overwrite=True)
    assert again["length"] == ds["target_tokens"] and again.column_names.count("length") == 1
    split = add_length_column(DatasetDict({"train": ds}), from_column="target_tokens")
    assert split["train"]["length"] == ds["target_tokens"]


def test_add_length_column_from_given_lengths():
    ds = Dataset.from_dict({"input_ids": [[1, 2], [3], [4, 5, 6]]})
    assert add_length_column(ds, lengths=np.array([9, 8, 7]))["length"] == [9, 8, 7]
    assert add_length_column(ds, lengths=[1.0, 2.0, 3.0], column="n")["n"] == [1, 2, 3]
    for bad, match in (([1, 2], "2 lengths for 3 rows"), ([1, -2, 3], "row 1"), ([1, 2.5, 3], "row 1"),
                       ([1, 2, None], "row 2")):
        with pytest.raises(ValueError, match=match):
            add_length_column(ds, lengths=bad)
    with pytest.raises(ValueError, match="no 'input_tokens' column"):
        add_length_column(ds)
    with pytest.raises(ValueError, match="not both"):
        add_length_column(ds, lengths=[1, 2, 3], from_column="x")


def test_trainer_length_kwargs_follow_the_signature():
    import inspect

    from transformers import TrainingArguments

    kwargs = trainer_length_kwargs("n_tokens")
    assert kwargs == {"train_sampling_strategy": "group_by_length", "length_column_name": "n_tokens",
                      "remove_unused_columns": False}
    assert set(kwargs) <= set(inspect.signature(TrainingArguments).parameters)

    @dataclasses.dataclass
    class Args4x:  # how transformers 4.x spelled it
        output_dir: str = "x"
        group_by_length: bool = False
        length_column_name: str = "length"
        remove_unused_columns: bool = True

    assert trainer_length_kwargs(args_class=Args4x) == {"group_by_length": True, "length_column_name": "length",
                                                         "remove_unused_columns": False}
    with pytest.raises(RuntimeError, match="neither"):
        trainer_length_kwargs(args_class=dataclasses.make_dataclass("Bare", [("output_dir", str)]))


# -- the real Trainer: torch and accelerate required ---------------------------------------------------------

@pytest.fixture
def trainer_parts(tok, features, tmp_path):
    """A tiny random BART (no download), a dataset whose `length` is deliberately not len(input_ids)."""
    pytest.importorskip("torch", reason="torch not installed: the Trainer tests need it")
    pytest.importorskip("accelerate", reason="accelerate not installed: transformers' Trainer requires it")
    from transformers import BartConfig, BartForConditionalGeneration, TrainingArguments

    config = BartConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
                        max_position_embeddings=IN_CAP + 8, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        decoder_start_token_id=tok.eos_token_id)
    model = BartForConditionalGeneration(config)
    seen = []  # what the model's forward receives, key by key and shape by shape
    model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append({k: tuple(v.shape) for k, v in kw.items() if hasattr(v, "shape")}),
        with_kwargs=True)
    ds = Dataset.from_list(features)
    ds = add_length_column(ds, lengths=[1000 - 7 * i for i in range(len(ds))], overwrite=True)
    assert ds["length"] != [len(x) for x in ds["input_ids"]]

    def args(**kwargs):
        return TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, report_to=[],
                                 use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                 **kwargs)

    return model, ds, args, seen


def _train_sampler(trainer):
    loader = trainer.get_train_dataloader()  # the one train() builds: columns removed, sampler chosen
    return getattr(loader.batch_sampler, "sampler", None) or loader.sampler


def test_trainer_uses_our_length_column_and_never_passes_it_to_the_model(tok, trainer_parts):
    from transformers import DataCollatorForSeq2Seq, Trainer
    from transformers.trainer_pt_utils import LengthGroupedSampler

    model, ds, args, seen = trainer_parts
    collator = LengthCappedCollator(DataCollatorForSeq2Seq(tok, model=model), max_input_tokens=IN_CAP,
                                    max_target_tokens=OUT_CAP)
    trainer = Trainer(model=model, args=args(**trainer_length_kwargs()), train_dataset=ds, data_collator=collator,
                      processing_class=tok)
    sampler = _train_sampler(trainer)
    assert isinstance(sampler, LengthGroupedSampler)
    assert list(sampler.lengths) == ds["length"]  # our column, not a rescan of input_ids
    trainer.train()  # rows far past max_position_embeddings train: the collator cut them
    assert seen and all("length" not in call for call in seen)
    assert max(call["input_ids"][1] for call in seen) <= IN_CAP
    assert max(call["labels"][1] for call in seen) <= OUT_CAP


def test_default_remove_unused_columns_drops_length_and_rescans_input_ids(tok, trainer_parts):
    from transformers import DataCollatorForSeq2Seq, Trainer

    model, ds, args, _ = trainer_parts
    trainer = Trainer(model=model, args=args(train_sampling_strategy="group_by_length"), train_dataset=ds,
                      data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok)
    sampler = _train_sampler(trainer)
    assert list(sampler.lengths) == [len(x) for x in ds["input_ids"]] != ds["length"]


def test_without_the_wrapper_the_model_silently_receives_length(tok, trainer_parts):
    from transformers import DataCollatorForSeq2Seq, Trainer

    model, ds, args, seen = trainer_parts
    ds = ds.select(range(3))  # the short rows: this model's positions cannot take the long ones uncut
    trainer = Trainer(model=model, args=args(**trainer_length_kwargs()), train_dataset=ds,
                      data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok)
    trainer.train()
    assert seen and all(call["length"] == call["input_ids"][:1] for call in seen)  # forward(**kwargs) took it


def test_length_grouped_sampler_reads_the_column_once(tok, trainer_parts):
    from transformers import DataCollatorForSeq2Seq, Trainer

    model, ds, args, _ = trainer_parts

    class ListLengthTrainer(Trainer):  # the recipe of docs/trainer.md
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            return length_grouped_sampler(dataset, self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                          column=self.args.length_column_name)

    collator = LengthCappedCollator(DataCollatorForSeq2Seq(tok, model=model), max_input_tokens=IN_CAP)
    trainer = ListLengthTrainer(model=model, args=args(**trainer_length_kwargs()), train_dataset=ds,
                                data_collator=collator, processing_class=tok)
    sampler = _train_sampler(trainer)
    assert type(sampler.lengths) is list and sampler.lengths == ds["length"]
    assert sorted(sampler) == list(range(len(ds)))
