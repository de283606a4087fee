"""``lengthscan memory``'s evaluation flags: ``Trainer.evaluate`` priced while the training state is
resident (docs/memory.md, "Evaluation")."""

from __future__ import annotations

import argparse

from lengthscan.cli.flags import named


def add_eval_flags(m: argparse.ArgumentParser) -> None:
    g = m.add_argument_group("evaluation (Trainer.evaluate while the training state is resident)")
    g.add_argument("--eval-batch-size", type=int, metavar="B", help="per_device_eval_batch_size: price the loop")
    g.add_argument("--eval-split", metavar="NAME", help="data mode: evaluate on this split of SRC (e.g. validation)")
    g.add_argument("--eval-source", type=named, metavar="PATH",
                   help="data mode: evaluate on another source, measured with the same fields and tokenizer")
    g.add_argument("--eval-rows", type=int, metavar="N", help="shape mode: rows in the evaluation set (default: one "
                                                                "batch)")
    g.add_argument("--eval-input-len", type=int, metavar="S",
                   help="shape mode: padded eval input length (default --input-len)")
    g.add_argument("--eval-target-len", type=int, metavar="T",
                   help="shape mode: padded eval target length (default --target-len)")
    g.add_argument("--eval-accumulation-steps", type=int, metavar="N", help="move predictions to the host every N")
    g.add_argument("--prediction-loss-only", action="store_true", help="keep only the loss (no compute_metrics)")
    g.add_argument("--eval-argmax", action="store_true", help="preprocess_logits_for_metrics = argmax")
    g.add_argument("--predict-with-generate", action="store_true",
                   help="Seq2SeqTrainer's predict_with_generate: price model.generate on every batch (worst case: no "
                        "row ends early)")
    g.add_argument("--generation-max-length", type=int, metavar="N",
                   help="generation_max_length (default: the model's max_length, else 20)")
    g.add_argument("--generation-num-beams", type=int, metavar="K", help="generation_num_beams (default 1)")


def eval_usage(args) -> str | None:
    """What is wrong with the evaluation flags (None: nothing)."""
    given = [flag for flag, value in (("--eval-split", args.eval_split), ("--eval-source", args.eval_source),
                                      ("--eval-accumulation-steps", args.eval_accumulation_steps),
                                      ("--eval-rows", args.eval_rows), ("--eval-input-len", args.eval_input_len),
                                      ("--eval-target-len", args.eval_target_len),
                                      ("--prediction-loss-only", args.prediction_loss_only or None),
                                      ("--eval-argmax", args.eval_argmax or None),
                                      ("--predict-with-generate", args.predict_with_generate or None),
                                      ("--generation-max-length", args.generation_max_length),
                                      ("--generation-num-beams", args.generation_num_beams)) if value is not None]
    if args.eval_batch_size is None:
        return f"{given[0]} needs --eval-batch-size B (the evaluation it changes)" if given else None
    shape_only = [f for f in ("--eval-rows", "--eval-input-len", "--eval-target-len") if f in given]
    if args.source is not None and shape_only:
        return f"{', '.join(shape_only)}: shape mode's; data mode measures the rows of --eval-split or --eval-source"
    if args.source is None and (args.eval_split is not None or args.eval_source is not None):
        return "--eval-split/--eval-source need SRC (data mode)"
    if args.eval_split is not None and args.eval_source is not None:
        return "give --eval-split (a split of SRC) or --eval-source (another source), not both"
    if args.source is not None and args.packing is not None:
        return ("--packing with --eval-batch-size: TRL packs the evaluation set too (eval_packing), which is not "
                "priced yet; price the evaluation without --packing")
    for flag, value in (("--eval-batch-size", args.eval_batch_size), ("--eval-rows", args.eval_rows),
                        ("--eval-accumulation-steps", args.eval_accumulation_steps),
                        ("--generation-max-length", args.generation_max_length),
                        ("--generation-num-beams", args.generation_num_beams)):
        if value is not None and value < 1:
            return f"{flag} must be at least 1"
    if args.prediction_loss_only and args.eval_argmax:
        return "--eval-argmax changes the logits --prediction-loss-only drops: give one of them"
    if not args.predict_with_generate and (args.generation_max_length or args.generation_num_beams):
        return "--generation-max-length/--generation-num-beams apply with --predict-with-generate: add it"
    if args.predict_with_generate and args.eval_argmax:
        return "--predict-with-generate keeps generated tokens, not logits: drop --eval-argmax"
    return None


def eval_options(args):
    from lengthscan.memory.evaluation import EvalOptions

    return EvalOptions(args.eval_batch_size, args.eval_accumulation_steps, args.prediction_loss_only, args.eval_argmax,
                       predict_with_generate=args.predict_with_generate,
                       generation_max_length=args.generation_max_length, num_beams=args.generation_num_beams or 1)


def evaluation_report(args, config, options, budget) -> dict:
    from lengthscan.memory import usable_bytes
    from lengthscan.memory.evaluation import report, shape_mode_batches
    from lengthscan.memory.families import family_of

    evo = eval_options(args)
    target = args.eval_target_len or args.target_len
    if family_of(config) in ("decoder-only", "encoder-only"):  # no separate target (see shape_warnings)
        target = None
    rows, length = args.eval_rows or evo.batch_size, args.eval_input_len or args.input_len

    def rebatch(size):
        return shape_mode_batches(size, rows, length, target)

    return report(config, rebatch(evo.batch_size), options, evo,
                  usable_bytes(budget, args.margin) if budget else None, rebatch=rebatch)
