"""The evaluation loop (``lengthscan/memory/evaluation.py``): against the real ``Trainer.evaluate``, its growth,
what accumulation changes, and the CLI's flags."""

from __future__ import annotations

import json

import pytest

from lengthscan.cli.main import main
from lengthscan.memory import MemoryOptions, load_config
from lengthscan.memory.evaluation import EvalOptions, eval_shapes, evaluate_loop, report, shape_mode_batches
from tests.factories import write_jsonl

LENS = [40 + (i * 37) % 100 for i in range(12)]


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)


def _bert():
    from transformers import BertConfig

    return BertConfig(vocab_size=2000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, num_labels=3, architectures=["BertForSequenceClassification"])


@pytest.mark.slow
@pytest.mark.parametrize("make, evo", [(_llama, EvalOptions(3)), (_llama, EvalOptions(3, accumulation_steps=2)),
                                       (_llama, EvalOptions(3, prediction_loss_only=True)), (_bert, EvalOptions(3))])
def test_prediction_within_five_percent_of_trainer_evaluate(make, evo):
    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_eval_peak import eval_rows, measure_evaluate

    config = make()
    predicted = evaluate_loop(config, eval_shapes(LENS, evo.batch_size), MemoryOptions(), evo).peak_bytes
    measured = measure_evaluate(build_model(config), eval_rows(config, LENS), evo).peak_bytes
    assert abs(predicted / measured - 1) < 0.05, (predicted, measured)


def test_predictions_grow_with_the_set_and_accumulation_bounds_them():
    config, options = _llama(), MemoryOptions()
    shapes = shape_mode_batches(4, 40, 128, None)
    keep = evaluate_loop(config, shapes, options, EvalOptions(4))
    assert all(a < b for a, b in zip(keep.step_peaks, keep.step_peaks[1:]))  # every batch's logits stay
    assert all(a < b for a, b in zip(keep.held_bytes, keep.held_bytes[1:]))
    every2 = evaluate_loop(config, shapes, options, EvalOptions(4, accumulation_steps=2))
    assert every2.peak_bytes < keep.peak_bytes and max(every2.step_peaks[2:]) == max(every2.step_peaks[:4])
    argmax = evaluate_loop(config, shapes, options, EvalOptions(4, argmax_logits=True))
    loss = evaluate_loop(config, shapes, options, EvalOptions(4, prediction_loss_only=True))
    assert loss.peak_bytes <= argmax.peak_bytes < keep.peak_bytes
    budget = (keep.step_peaks[3] + keep.step_peaks[4]) // 2
    broken = evaluate_loop(config, shapes, options, EvalOptions(4), usable_bytes=budget)
    assert broken.breaking_step == 4


def test_padding_to_the_longest_so_far():
    config, options = _llama(), MemoryOptions()
    short_then_long = eval_shapes([32] * 4 + [256] * 4, 4)
    long_then_short = eval_shapes([256] * 4 + [32] * 4, 4)
    a = evaluate_loop(config, short_then_long, options, EvalOptions(4))
    b = evaluate_loop(config, long_then_short, options, EvalOptions(4))
    per_token = 2000 * 4 + 8  # fp32 logits and int64 labels
    # both held as 8 rows padded to 256 tokens, plus the last batch's own tensors (the loop's locals); losses: 48 bytes
    assert a.held_bytes[-1] - 48 == (8 * 256 + 4 * 256) * per_token
    assert b.held_bytes[-1] - 48 == (8 * 256 + 4 * 32) * per_token
    assert eval_shapes([5, 7, 7], 2)[0].padding and not eval_shapes([5, 7, 7], 2)[1].padding


def test_report_fields():
    ev = report(_llama(), shape_mode_batches(2, 10, 64, None), MemoryOptions(), EvalOptions(2), usable_bytes=10**12,
                rebatch=lambda b: shape_mode_batches(b, 10, 64, None))
    assert ev["peak_bytes"] == sum(ev["terms"].values()) and ev["fits"] is True and ev["breaking_step"] is None
    assert set(ev["alternatives"]) == {"eval_accumulation_steps=1", "argmax_logits", "prediction_loss_only",
                                       "eval_batch_size=1"}
    assert ev["cheapest"] is None  # it fits: no advice
    assert all(a["saves_bytes"] > 0 for a in ev["alternatives"].values())


def test_cli(tmp_path, capsys):
    _llama().save_pretrained(tmp_path / "llama")
    args = ["memory", "--model", str(tmp_path / "llama"), "--batch-size", "2", "--input-len", "128"]
    assert main([*args, "--eval-accumulation-steps", "4"]) == 2
    assert "--eval-accumulation-steps needs --eval-batch-size" in capsys.readouterr().err
    assert main([*args, "--eval-batch-size", "0"]) == 2
    assert main([*args, "--eval-batch-size", "2", "--eval-argmax", "--prediction-loss-only"]) == 2
    capsys.readouterr()
    assert main([*args, "--eval-batch-size", "4", "--eval-rows", "40", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)["memory"]["evaluation"]
    assert ev["steps"] == 10 and ev["rows"] == 40 and ev["moment"] == "concat"
    assert len(ev["per_step_peak_bytes"]) == 10 and ev["alternatives"]["eval_accumulation_steps=1"]["saves_bytes"] > 0
    budget = f"{(ev['per_step_peak_bytes'][2] + ev['per_step_peak_bytes'][3]) / 2 / 0.9:.0f}"
    assert main([*args, "--eval-batch-size", "4", "--eval-rows", "40", "--budget", budget]) == 1
    assert "breaks the budget at batch #3" in capsys.readouterr().out
    assert main([*args, "--eval-batch-size", "4", "--eval-rows", "40", "--eval-accumulation-steps", "1",
                 "--budget", budget]) == 0


# -- data mode: the evaluation of another split or source, measured as the training split is ------------------

@pytest.fixture(scope="module")
def eval_data(tmp_path_factory, corpus_rows, bpe_dir):
    """Real docstring/summary pairs the tiny BART takes (under its 256 positions): a saved DatasetDict with train
    and validation splits, and the validation rows again as a JSON Lines file (another source), plus a row
    without a summary (no length: left out)."""
    from datasets import Dataset, DatasetDict
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    rows = [r for r in corpus_rows if r["text"] and r["summary"]
            and len(tok(r["text"])["input_ids"]) < 200 and len(tok(r["summary"])["input_ids"]) < 200][:150]
    base = tmp_path_factory.mktemp("evaldata")
    DatasetDict({"train": Dataset.from_list(rows[:120]),
                 "validation": Dataset.from_list(rows[120:])}).save_to_disk(str(base / "dd"))
    other = [*rows[120:], {"text": "a text without summary", "summary": None}]
    write_jsonl(base / "val.jsonl", other)
    return base / "dd", base / "val.jsonl", rows[120:], tok


@pytest.mark.slow  # a real Trainer.evaluate over an eval split, measured
def test_data_mode_eval_split_batches_and_peak_are_the_trainers(eval_data, bpe_dir, bart_dir, tmp_path):
    """The eval batches are the Trainer's eval dataloader's (sequential, DataCollatorForSeq2Seq with the same
    pad_to_multiple_of), and the predicted peak is Trainer.evaluate's measured on CPU over those rows."""
    pytest.importorskip("accelerate", reason="accelerate not installed: transformers' Trainer requires it")
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_eval_peak import measure_evaluate
    from lengthscan.memory.data import predict_dataset
    from lengthscan.memory.data_eval import EvalData
    from lengthscan.memory.evaluation import EvalOptions

    dd, _, val, tok = eval_data
    features = [dict(tok(r["text"], text_target=r["summary"])) for r in val]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
                             remove_unused_columns=False)
    common = dict(model=str(bart_dir), tokenizer=str(bpe_dir), input="text", target="summary", batch_size=8)
    got = predict_dataset(str(dd), pad_to_multiple_of=8, evaluation=EvalData(EvalOptions(4), split="validation"),
                          **common).memory["evaluation"]
    loader = Trainer(model=build_model(load_config(str(bart_dir))), args=args, eval_dataset=Dataset.from_list(features),
                     data_collator=DataCollatorForSeq2Seq(tok, pad_to_multiple_of=8)).get_eval_dataloader()
    want = [(b["input_ids"].shape[0], b["input_ids"].shape[1], b["labels"].shape[1]) for b in loader]
    assert got["steps"] == len(want) and got["rows"] == len(val) and got["split"] == "validation"
    peak = want[got["peak_step"]]
    assert (got["peak_batch"]["shape"]["batch_size"], got["peak_batch"]["shape"]["input_len"],
            got["peak_batch"]["shape"]["target_len"]) == peak
    assert got["peak_batch"]["rows"] == list(range(4 * got["peak_step"], 4 * got["peak_step"] + peak[0]))
    assert got["source"] is None and got["left_out"] == 0 and got["sides"] == {"input_len": "input_tokens",
                                                                                 "target_len": "target_tokens"}

    for evo in (EvalOptions(4), EvalOptions(4, accumulation_steps=3), EvalOptions(4, argmax_logits=True),
                EvalOptions(4, prediction_loss_only=True)):
        ev = predict_dataset(str(dd), evaluation=EvalData(evo, split="validation"), **common).memory["evaluation"]
        rows = [{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features]
        measured = measure_evaluate(build_model(load_config(str(bart_dir))), rows, evo).peak_bytes
        assert abs(ev["peak_bytes"] / measured - 1) < 0.005, (evo, ev["peak_bytes"], measured)


def test_data_mode_eval_source_cli_budget_report_and_html(eval_data, bpe_dir, bart_dir, tmp_path, capsys):
    dd, val_jsonl, val, _ = eval_data
    base = ["memory", str(dd), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
            "--target", "summary", "--batch-size", "4"]
    assert main([*base, "--json", "--eval-batch-size", "4", "--eval-source", str(val_jsonl)]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]
    ev = m["evaluation"]
    assert ev["source"] == str(val_jsonl) and ev["split"] == "train" and ev["mode"] == "data"
    assert ev["rows"] == len(val) and ev["source_rows"] == len(val) + 1 and ev["left_out"] == 1
    assert ev["steps"] == -(-len(val) // 4) and len(ev["per_step_peak_bytes"]) == ev["steps"]
    assert ev["peak_bytes"] == sum(ev["terms"].values()) and ev["fits"] is None and ev["breaking_step"] is None
    assert set(ev["alternatives"]) == {"eval_accumulation_steps=1", "argmax_logits", "prediction_loss_only",
                                       "eval_batch_size=2"}
    # half the batch: the same rows in batches of 2, in order (its peak is the smaller one)
    assert ev["alternatives"]["eval_batch_size=2"]["saves_bytes"] > 0
    # the same rows as a split of SRC: the same batches, the same peaks
    assert main([*base, "--json", "--eval-batch-size", "4", "--eval-split", "validation"]) == 0
    same = json.loads(capsys.readouterr().out)["memory"]["evaluation"]
    assert same["per_step_peak_bytes"] == ev["per_step_peak_bytes"] and same["source"] is None

    # a budget the training fits and the evaluation breaks (its predictions grow): exit 1 for the evaluation
    assert ev["peak_bytes"] > m["peak_bytes"]
    usable = (m["peak_bytes"] + ev["peak_bytes"]) // 2
    budget = str(int(usable / 0.9) + 1)
    out = tmp_path / "rep"
    flags = ["--eval-batch-size", "4", "--eval-split", "validation", "--budget", budget]
    assert main([*base, *flags, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    first = next(k for k, p in enumerate(ev["per_step_peak_bytes"]) if p > int(budget) * 0.9)
    assert "the worst batch fits" in text and f"breaks the budget at batch #{first}" in text
    data = json.loads((out / "report.json").read_text())["memory"]
    assert data["fits"] is True and data["evaluation"]["fits"] is False
    assert data["evaluation"]["breaking_step"] == first
    assert data["evaluation"]["breaking_batch"]["rows"] == list(range(4 * first, min(4 * first + 4, len(val))))
    html = (out / "report.html").read_text(encoding="utf-8")
    section = html[html.index('id="memory-evaluation"'):]
    assert "Trainer.evaluate" in section[:2000] and f"batch #{first}" in section[:2000]
    assert "eval_accumulation_steps=1" in section[:4000]
    alt = data["evaluation"]["alternatives"]["eval_accumulation_steps=1"]
    assert main([*base, *flags, "--eval-accumulation-steps", "1"]) == (0 if alt["fits"] else 1)
    capsys.readouterr()
    cheapest = data["evaluation"]["cheapest"]  # the first alternative that fits, named where the user reads it
    assert cheapest == next(n for n, a in data["evaluation"]["alternatives"].items() if a["fits"])
    assert f"cheapest change that fits: {cheapest}" in text and f"<code>{cheapest}</code>" in section[:4000]
    half = data["evaluation"]["alternatives"]["eval_batch_size=2"]
    assert main([*base, "--eval-batch-size", "2", "--eval-split", "validation", "--budget", budget]) == \
        (0 if half["fits"] else 1)
    capsys.readouterr()


def test_data_mode_eval_usage_errors(eval_data, bpe_dir, bart_dir, capsys):
    dd, val_jsonl, _, _ = eval_data
    base = ["memory", str(dd), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
            "--target", "summary", "--batch-size", "4"]
    cases = [(["--eval-batch-size", "4", "--eval-split", "dev"], "it has train, validation"),
             (["--eval-batch-size", "4", "--eval-split", "validation", "--eval-source", str(val_jsonl)], "not both"),
             (["--eval-split", "validation"], "--eval-split needs --eval-batch-size"),
             (["--eval-batch-size", "4"], "give --eval-split NAME (SRC has train, validation)"),
             (["--eval-batch-size", "4", "--eval-split", "validation", "--eval-rows", "8"], "shape mode's"),
             (["--eval-batch-size", "4", "--eval-split", "validation", "--packing", "bfd", "--max-length", "64"],
              "eval_packing")]
    for flags, message in cases:
        assert main([*base, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["memory", "--model", str(bart_dir), "--batch-size", "2", "--input-len", "8", "--target-len", "8",
                 "--eval-batch-size", "2", "--eval-split", "validation"]) == 2
    assert "need SRC" in capsys.readouterr().err


def _bart_gen(vocab=8000):
    from transformers import BartConfig

    return BartConfig(vocab_size=vocab, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256)


def _t5_gen(vocab=8000):
    from transformers import T5Config

    return T5Config(decoder_start_token_id=0, vocab_size=vocab, d_model=128, d_kv=32, d_ff=256, num_layers=2,
                    num_heads=4)


GEN_INPUTS, GEN_TARGETS = [64, 60, 50, 40, 64, 30, 20, 10], [4, 5, 6, 7, 8, 4, 5, 6]


@pytest.mark.slow
@pytest.mark.parametrize("make, max_length, beams, precision, dtype", [
    (_bart_gen, 200, 8, "fp32", "fp32"),  # the beams' cache reorder sets the peak
    (_bart_gen, 100, 4, "bf16", "fp32"),  # autocast's weight copies and the head's fp32 sum
    (_t5_gen, 200, 8, "bf16", "bf16"),  # accelerate's fp32 copies of the logits and the encoder output
    (_t5_gen, 256, 1, "fp32", "fp32"),  # greedy: the logits of two steps and a forced EOS
], ids=["bart-beams8-fp32", "bart-beams4-autocast", "t5-beams8-bf16", "t5-greedy"])
def test_generation_within_five_percent_of_seq2seq_trainer_evaluate(make, max_length, beams, precision, dtype):
    """``predict_with_generate`` priced against ``Seq2SeqTrainer.evaluate`` measured on CPU, every row generating to
    ``generation_max_length`` (the EOS logit pushed down, the worst case the model prices)."""
    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_eval_peak import eval_rows, measure_evaluate

    config, options = make(), MemoryOptions(precision=precision, torch_dtype=dtype)
    evo = EvalOptions(4, predict_with_generate=True, generation_max_length=max_length, num_beams=beams)
    est = evaluate_loop(config, eval_shapes(GEN_INPUTS, 4, targets=GEN_TARGETS), options, evo)
    measured = measure_evaluate(build_model(config, options), eval_rows(config, GEN_INPUTS, GEN_TARGETS,
                                                                        head="seq2seq"),
                                EvalOptions(4), options, generation={"max_length": max_length, "num_beams": beams})
    assert est.moment.startswith("generate") or max_length < 200
    assert abs(est.peak_bytes / measured.peak_bytes - 1) < 0.05, (est.peak_bytes, measured.peak_bytes, est.moment)


def test_generation_prices_the_cache_and_refuses_what_it_cannot(capsys, tmp_path):
    config = _bart_gen()
    shapes = shape_mode_batches(4, 8, 64, 8)
    short = evaluate_loop(config, shapes, MemoryOptions(), EvalOptions(4, predict_with_generate=True,
                                                                       generation_max_length=50, num_beams=4))
    long = evaluate_loop(config, shapes, MemoryOptions(), EvalOptions(4, predict_with_generate=True,
                                                                      generation_max_length=400, num_beams=4))
    assert long.peak_bytes > short.peak_bytes and long.moment.startswith("generate")
    # the self-attention cache: 2 x layers x (batch x beams) x (max_length - 1) x d_model, fp32
    assert long.terms["self_attention_cache"] == 2 * 2 * 16 * 399 * 128 * 4
    ev = report(config, shapes, MemoryOptions(), EvalOptions(4, predict_with_generate=True, num_beams=4),
                rebatch=lambda b: shape_mode_batches(b, 8, 64, 8))
    assert "argmax_logits" not in ev["alternatives"] and ev["alternatives"]["eval_batch_size=2"]["saves_bytes"] > 0
    assert "no row ends early" in ev["generation"] and ev["cheapest"] is None  # no budget, no advice
    usable = ev["alternatives"]["eval_batch_size=2"]["peak_bytes"]
    tight = report(config, shapes, MemoryOptions(), EvalOptions(4, predict_with_generate=True, num_beams=4), usable,
                   rebatch=lambda b: shape_mode_batches(b, 8, 64, 8))
    names = list(tight["alternatives"])
    assert tight["fits"] is False and tight["cheapest"] in names
    assert tight["alternatives"][tight["cheapest"]]["peak_bytes"] <= usable
    assert all(tight["alternatives"][n]["peak_bytes"] > usable for n in names[:names.index(tight["cheapest"])])
    _llama().save_pretrained(tmp_path / "llama")
    assert main(["memory", "--model", str(tmp_path / "llama"), "--batch-size", "2", "--input-len", "8",
                 "--eval-batch-size", "2", "--predict-with-generate"]) == 2
    assert "encoder-decoder" in capsys.readouterr().err
    config.save_pretrained(tmp_path / "bart")
    base = ["memory", "--model", str(tmp_path / "bart"), "--batch-size", "2", "--input-len", "8", "--target-len", "8",
            "--eval-batch-size", "2"]
    assert main([*base, "--generation-num-beams", "4"]) == 2
    assert "--predict-with-generate" in capsys.readouterr().err
    assert main([*base, "--predict-with-generate", "--eval-argmax"]) == 2
    assert "--eval-argmax" in capsys.readouterr().err
    assert main([*base, "--predict-with-generate", "--generation-num-beams", "4", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)["memory"]["evaluation"]
    assert ev["options"]["num_beams"] == 4 and ev["options"]["predict_with_generate"] and "eval_batch_size=1" in \
        ev["alternatives"]
