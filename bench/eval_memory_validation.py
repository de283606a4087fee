"""Validate the evaluation loop's predicted peak against the real ``Trainer.evaluate`` measured on CPU.

Each case trains one step with a ``transformers.Trainer`` (the optimizer state then exists, gradients
None), then measures ``evaluate()`` over an evaluation set of varying lengths in dataset order
(``lengthscan/memory/cpu_eval_peak.py``). Prints the table and writes ``bench/eval_memory_results.md``.

    python bench/eval_memory_validation.py [--quick]

Then ``Seq2SeqTrainer.evaluate`` with ``predict_with_generate`` (BART and T5, greedy and beams, fp32,
bf16 autocast and bf16 weights), every row generating to ``generation_max_length`` (the EOS logit
pushed down: the worst case the model prices).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

MIB = 1024 ** 2


def configs():
    from transformers import BartConfig, BertConfig, LlamaConfig, T5Config

    llama = LlamaConfig(vocab_size=4000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    bart = BartConfig(vocab_size=4000, d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512)
    bert = BertConfig(vocab_size=4000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=512, num_labels=3, architectures=["BertForSequenceClassification"])
    t5 = T5Config(decoder_start_token_id=0, vocab_size=4000, d_model=256, d_kv=64, d_ff=512, num_layers=2,
                  num_heads=4)
    lens = [64 + (i * 37) % 192 for i in range(24)]
    targets = [16 + (i * 13) % 48 for i in range(24)]
    return [("llama 2x256 gqa", llama, lens, None), ("bart 2+2x256", bart, lens, targets),
            ("t5 2+2x256", t5, lens, targets),
            ("bert 2x256 cls", bert, lens, None)]


def variants():
    from lengthscan.memory.evaluation import EvalOptions

    return [("keep logits", EvalOptions(4)), ("eval_accumulation_steps=2", EvalOptions(4, accumulation_steps=2)),
            ("prediction_loss_only", EvalOptions(4, prediction_loss_only=True)),
            ("argmax logits", EvalOptions(4, argmax_logits=True))]


def run(quick: bool = False) -> list[dict]:
    from lengthscan.memory import MemoryOptions
    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_eval_peak import eval_rows, measure_evaluate
    from lengthscan.memory.evaluation import eval_shapes, evaluate_loop

    out = []
    precisions = ("fp32",) if quick else ("fp32", "bf16")
    for name, config, lens, targets in configs():
        for precision in precisions:
            options = MemoryOptions(precision=precision)
            for label, evo in variants():
                shapes = eval_shapes(lens, evo.batch_size, targets=targets)
                start = time.time()
                pred = evaluate_loop(config, shapes, options, evo)
                meas = measure_evaluate(build_model(config, options), eval_rows(config, lens, targets), evo, options)
                row = {"case": name, "precision": precision, "variant": label, "batches": len(shapes),
                       "predicted": pred.peak_bytes, "measured": meas.peak_bytes,
                       "error": pred.peak_bytes / meas.peak_bytes - 1, "moment": pred.moment, "step": pred.peak_step,
                       "seconds": time.time() - start}
                out.append(row)
                print(f"{name:16} {precision:5} {label:26} pred {row['predicted'] / MIB:8.1f} MiB  meas "
                      f"{row['measured'] / MIB:8.1f} MiB  {100 * row['error']:+5.1f}%  {row['moment']} #{row['step']}",
                      flush=True)
    return out


def generation_cases():
    from transformers import BartConfig, T5Config

    bart = BartConfig(vocab_size=8000, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256)
    t5 = T5Config(decoder_start_token_id=0, vocab_size=8000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4)
    long = ([300, 280, 260, 240, 220, 200, 180, 160], [30, 40, 20, 50, 30, 40, 20, 10])
    short = ([64, 60, 50, 40, 64, 30, 20, 10], [4, 5, 6, 7, 8, 4, 5, 6])
    out = []
    for name, config in (("bart 2+2x128", bart), ("t5 2+2x128", t5)):
        for lens, (max_length, beams) in ((long, (60, 4)), (short, (200, 8)), (short, (256, 1)), (short, (100, 4))):
            for precision, dtype in (("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")):
                out.append((name, config, lens, max_length, beams, precision, dtype))
    return out


def run_generation(quick: bool = False) -> list[dict]:
    from lengthscan.memory import MemoryOptions
    from lengthscan.memory.build import build_model
    from lengthscan.memory.cpu_eval_peak import eval_rows, measure_evaluate
    from lengthscan.memory.evaluation import EvalOptions, eval_shapes, evaluate_loop

    out = []
    for name, config, (lens, targets), max_length, beams, precision, dtype in generation_cases():
        if quick and (precision, dtype) != ("fp32", "fp32"):
            continue
        options = MemoryOptions(precision=precision, torch_dtype=dtype)
        evo = EvalOptions(4, predict_with_generate=True, generation_max_length=max_length, num_beams=beams)
        shapes = eval_shapes(lens, 4, targets=targets)
        start = time.time()
        pred = evaluate_loop(config, shapes, options, evo)
        meas = measure_evaluate(build_model(config, options), eval_rows(config, lens, targets, head="seq2seq"),
                                EvalOptions(4), options, generation={"max_length": max_length, "num_beams": beams})
        row = {"case": name, "precision": precision + ("" if dtype == "fp32" else f", {dtype} weights"),
               "variant": f"generate {max_length} x {beams} beam{'s' if beams > 1 else ''} (inputs {max(lens)})",
               "batches": len(shapes), "predicted": pred.peak_bytes, "measured": meas.peak_bytes,
               "error": pred.peak_bytes / meas.peak_bytes - 1, "moment": pred.moment, "step": pred.peak_step,
               "seconds": time.time() - start}
        out.append(row)
        print(f"{name:16} {row['precision']:18} {row['variant']:34} pred {row['predicted'] / MIB:8.1f} MiB  meas "
              f"{row['measured'] / MIB:8.1f} MiB  {100 * row['error']:+5.1f}%  {row['moment']} #{row['step']}",
              flush=True)
    return out


def table(rows: list[dict]) -> str:
    import torch
    import transformers

    lines = [f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.machine()}; "
             "24 rows (64-255 tokens; BART and T5 targets 16-63) in batches of 4, dataset order. "
             "Error = predicted / measured - 1.", "",
             "| case | precision | variant | predicted MiB | measured MiB | error % | peak at |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['precision']} | {r['variant']} | {r['predicted'] / MIB:,.1f} | "
                     f"{r['measured'] / MIB:,.1f} | {100 * r['error']:+.1f} | {r['moment']} #{r['step']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fp32 only")
    args = parser.parse_args()
    rows = run(args.quick)
    generation = run_generation(args.quick)
    text = table(rows) + "\n## predict_with_generate (Seq2SeqTrainer)\n\n" + table(generation).split("\n", 2)[2]
    rows += generation
    Path(__file__).with_name("eval_memory_results.md").write_text("# Evaluation loop: predicted vs measured\n\n" + text)
    print(text)
    worst = max(abs(r["error"]) for r in rows)
    print(f"largest error {100 * worst:.1f}% (goal 5%)")


if __name__ == "__main__":
    main()
