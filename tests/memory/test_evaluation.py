"""The evaluation loop (``lengthscan/memory/evaluation.py``): against the real ``Trainer.evaluate``, its growth,
what accumulation changes, and the CLI's flags."""

from __future__ import annotations

import json

import pytest

from lengthscan.cli.main import main
from lengthscan.memory import MemoryOptions
from lengthscan.memory.evaluation import EvalOptions, eval_shapes, evaluate_loop, report, shape_mode_batches

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
    ev = report(_llama(), shape_mode_batches(2, 10, 64, None), MemoryOptions(), EvalOptions(2), usable_bytes=10**12)
    assert ev["peak_bytes"] == sum(ev["terms"].values()) and ev["fits"] is True and ev["breaking_step"] is None
    assert set(ev["alternatives"]) == {"eval_accumulation_steps=1", "argmax_logits", "prediction_loss_only"}
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
