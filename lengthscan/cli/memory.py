"""``lengthscan memory``: its flags and its two modes (shape mode: one batch shape; data mode: the
worst batch of a simulated epoch over a dataset's real lengths). The model is in ``memory/``."""

from __future__ import annotations

import argparse
import sys

from lengthscan.cli.common import EXIT_GATE, EXIT_OK, EXIT_USAGE, ProgressBars, say
from lengthscan.cli.flags import add_flags, add_source_argument, named
from lengthscan.cli.memory_eval import add_eval_flags, eval_options, eval_usage, evaluation_report
from lengthscan.cli.memory_run import add_run_shape_flags, allocator_of, objective_of


def add_memory_parser(sub) -> None:
    m = sub.add_parser("memory", help="predict the peak training memory of a dataset's worst batch, or of one shape",
                       description="Data mode (SRC given): every row measured as the audit does, the Trainer's epoch "
                                   "simulated, every batch's peak predicted: the worst batch, the bound for any "
                                   "shuffle, and with --budget the limits that fit. "
                                   "Shape mode: the predicted peak memory of one training step of --model for "
                                   "one padded batch (weights, gradients, optimizer state, activations, logits), "
                                   "from its config alone: no weights, no GPU. See docs/memory.md.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  lengthscan memory --model ./llama-config --batch-size 8 --input-len 4096 --precision bf16
  lengthscan memory train.jsonl --model ./bart-base --input document --target summary --batch-size 16 \\
      --budget 24GiB --out memory-report
  lengthscan memory chats.jsonl --model ./qwen --messages messages --batch-size 4 --budget 80GB

exit codes: 0 ok (fits), 1 the worst batch (or the evaluation) does not fit --budget, 2 bad usage or input,
  3 an internal error (its traceback written to a file)""")
    m.add_argument("--model", type=named, required=True, metavar="CFG",
                   help="model directory, hub name or config .json")
    m.add_argument("--batch-size", type=int, required=True, metavar="B", help="rows in the batch")
    m.add_argument("--input-len", type=int, metavar="S",
                   help="padded input length: tokens, audio samples (Wav2Vec2-like) or mel frames (Whisper)")
    m.add_argument("--target-len", type=int, metavar="T", help="padded label length of an encoder-decoder")
    m.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or bf16/fp16 mixed precision (default fp32)")
    m.add_argument("--optimizer", choices=_optimizer_choices(), default="adamw_torch_fused", metavar="OPTIM",
                   help="TrainingArguments.optim: adamw_torch_fused (default), adamw_torch, adamw_bnb_8bit "
                        "(adamw_8bit), paged_adamw_8bit, paged_adamw_32bit, adafactor, sgd")
    m.add_argument("--attention", choices=("eager", "sdpa", "flash"), default="sdpa",
                   help="attention implementation (default sdpa)")
    m.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    m.add_argument("--freeze-feature-encoder", action="store_true", help="a frozen conv feature encoder (speech)")
    m.add_argument("--grad-accum", type=int, default=1, metavar="K", help="gradient accumulation steps")
    m.add_argument("--budget", metavar="SIZE", help="device memory, e.g. 24GiB: exit 1 when the peak (data mode: "
                                                    "the worst batch's; with --packing, the packed one's) does "
                                                    "not fit with --margin")
    m.add_argument("--json", action="store_true", help="print the prediction as JSON to stdout")
    _add_run_flags(m)
    add_run_shape_flags(m)
    _add_memory_data_flags(m)
    add_eval_flags(m)


def _optimizer_choices() -> tuple:
    from lengthscan.memory.optimizers import ALIASES, OPTIMIZERS

    return (*OPTIMIZERS, *ALIASES)


def _add_run_flags(m: argparse.ArgumentParser) -> None:
    """The run launched: weights' dtype, adapters (peft), a quantized base (bitsandbytes)."""
    g = m.add_argument_group("the run launched (weights, adapters, quantization)")
    g.add_argument("--torch-dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="the dtype the model is loaded in (from_pretrained(dtype=...)), kept by the Trainer: bf16 "
                        "weights have bf16 gradients and optimizer state, no fp32 master copy (default fp32)")
    g.add_argument("--adapter-config", metavar="PATH",
                   help="a peft adapter_config.json (or the folder LoraConfig.save_pretrained wrote): LoRA or DoRA; "
                        "only the adapters (and modules_to_save) train")
    g.add_argument("--lora-r", type=int, metavar="R", help="shortcut for a LoRA adapter of rank R (no file)")
    g.add_argument("--lora-targets", metavar="NAMES", help="with --lora-r: comma-separated module names, or "
                                                           "all-linear (default)")
    g.add_argument("--lora-alpha", type=float, metavar="A", help="with --lora-r: lora_alpha (default 2R)")
    g.add_argument("--lora-dropout", type=float, default=0.0, metavar="P", help="with --lora-r: lora_dropout")
    g.add_argument("--dora", action="store_true", help="with --lora-r: use_dora")
    g.add_argument("--quantization-config", metavar="FILE",
                   help="a BitsAndBytesConfig as JSON (to_dict()), or a model config.json holding "
                        "quantization_config: a 4-bit (QLoRA) or LLM.int8 base; needs an adapter")
    g.add_argument("--no-prepare-kbit", dest="prepare_kbit", action="store_false",
                   help="the quantized model is not passed through peft's prepare_model_for_kbit_training (which "
                        "casts its other weights to fp32)")


def _options(args):
    from lengthscan.memory import MemoryOptions
    from lengthscan.memory.adapters import lora_from_flags, read_adapter_config
    from lengthscan.memory.quant import read_quantization_config

    adapter = None
    if args.adapter_config and args.lora_r is not None:
        raise ValueError("give --adapter-config or --lora-r, not both (the file is the contract)")
    if args.adapter_config:
        adapter = read_adapter_config(args.adapter_config)
    elif args.lora_r is not None:
        adapter = lora_from_flags(args.lora_r, args.lora_targets, args.lora_alpha, args.lora_dropout, args.dora)
    elif args.lora_targets or args.lora_alpha is not None or args.dora or args.lora_dropout:
        raise ValueError("--lora-targets, --lora-alpha, --lora-dropout and --dora need --lora-r (or give "
                         "--adapter-config)")
    quantization = read_quantization_config(args.quantization_config) if args.quantization_config else None
    from lengthscan.memory.parallel import Parallel

    parallel = Parallel(args.devices, args.strategy, args.fsdp_version, args.offload)
    if parallel.sharded and args.eval_batch_size is not None:
        raise ValueError(f"--eval-batch-size under --strategy {parallel.strategy} is not priced yet (the "
                         "evaluation's gathers): price the evaluation with --strategy ddp, or drop one of them")
    return MemoryOptions(objective=objective_of(args), parallel=parallel,
                         precision=args.precision, optimizer=args.optimizer,
                         attention=args.attention,
                         gradient_checkpointing=args.gradient_checkpointing,
                         freeze_feature_encoder=args.freeze_feature_encoder,
                         gradient_accumulation_steps=args.grad_accum, torch_dtype=args.torch_dtype,
                         adapter=adapter, quantization=quantization, prepare_kbit=args.prepare_kbit)


def run_memory(args, command: str) -> int:
    if (problem := eval_usage(args)) is not None:
        say(f"lengthscan: error: {problem}")
        return EXIT_USAGE
    return _memory_data(args, command) if args.source is not None else _memory(args)


def parse_size(text: str) -> int:
    """``24GiB``, ``80GB``, ``512MiB`` or plain bytes -> bytes."""
    import re

    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?)B?\s*", text or "", re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read the size {text!r}: write e.g. 24GiB, 80GB or 512MiB")
    power = " KMGT".index(m.group(2).upper() or " ")
    try:
        size = int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    except (ValueError, OverflowError):
        raise ValueError(f"cannot read the size {text!r}: write e.g. 24GiB, 80GB or 512MiB") from None
    if size < 1:
        raise ValueError(f"--budget {text}: a device holds at least a byte; write e.g. 24GiB")
    return size


def _memory(args) -> int:
    import json
    from dataclasses import replace

    from lengthscan.memory import Shape, estimate, load_config, shape_warnings, usable_bytes
    from lengthscan.report.fmt import size

    data_only = [flag for flag, value in (("--input", args.input), ("--audio", args.audio), ("--target", args.target),
                                          ("--messages", args.messages), ("--prompt", args.prompt),
                                          ("--completion", args.completion), ("--out", args.out),
                                          ("--chosen", args.chosen), ("--rejected", args.rejected),
                                          ("--rl", args.rl), ("--pair-max-length", args.pair_max_length),
                                          ("--pair-trainer", args.pair_trainer),
                                          ("--export-worst-batch", args.export_worst_batch))
                 if value is not None]
    if data_only:
        say(f"lengthscan: error: {', '.join(data_only)} need SRC (data mode)")
        return EXIT_USAGE
    try:
        options = _options(args)
        budget = parse_size(args.budget) if args.budget else None
        usable_bytes(budget or 0, args.margin)  # checks the margin
        config = load_config(args.model)
        shape = Shape(args.batch_size, args.input_len, args.target_len)
        if options.objective.completion_len and args.input_len is not None:  # grpo: the prompt, then the completion
            shape = Shape(args.batch_size, args.input_len + options.objective.completion_len, args.target_len)
        warnings = shape_warnings(config, shape)
        if ignored_target := any(w.startswith("--target-len") and "ignored" in w for w in warnings):
            shape = replace(shape, target_len=None)
        est = estimate(config, shape, options)
        allocator = allocator_of(args, budget)
    except ValueError as exc:
        say(f"lengthscan: error: {_as_flags(exc)}")
        return EXIT_USAGE
    for line in warnings:
        say(f"lengthscan: warning: {line}")
    data = {"memory": {**est.to_dict(), "warnings": warnings}}
    if allocator is not None or budget is not None:  # three steps of the shape through the allocator model
        from dataclasses import replace

        from lengthscan.memory.alloc_conf import AllocatorConfig
        from lengthscan.memory.reserved import CUBLAS_WORKSPACE, CUDA_CONTEXT, describe, replay_steps

        conf = allocator or AllocatorConfig()
        conf = replace(conf, total=budget, capacity=None if budget is None else budget - CUDA_CONTEXT)
        replayed = replay_steps(config, [shape] * 3, options, conf)
        replayed.pop("reserved_after_step")
        data["memory"]["allocator"] = {**replayed, "alloc_conf": describe(conf), "cuda_context_bytes": CUDA_CONTEXT,
                                       "cublas_workspace_bytes": CUBLAS_WORKSPACE, "memory_fraction":
                                       conf.memory_fraction, "variants": {}}
    fits = None
    if budget is not None:
        fits = est.peak_bytes <= usable_bytes(budget, args.margin)
        data["memory"]["budget_bytes"], data["memory"]["fits"] = budget, fits
        if not fits:  # what else makes it fit, each priced on the same batch
            from lengthscan.memory.alternatives import alternatives

            data["memory"]["alternatives"] = alternatives(config, shape, options, usable_bytes(budget, args.margin))
    if args.eval_batch_size is not None:
        try:
            data["memory"]["evaluation"] = evaluation_report(args, config, options, budget)
        except ValueError as exc:
            say(f"lengthscan: error: {_as_flags(exc)}")
            return EXIT_USAGE
        if data["memory"]["evaluation"]["fits"] is False:
            fits = data["memory"]["fits"] = False
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        gib = 1024 ** 3
        target = "" if ignored_target or args.target_len is None else f" x target {args.target_len:,}"
        inputs = f" x input {args.input_len:,}" if args.input_len is not None else ""
        objective, rows = options.objective, f"batch {args.batch_size}"
        if objective.name in ("dpo", "reward"):
            rows = f"batch {args.batch_size} pairs ({2 * args.batch_size} rows)"
        elif objective.name == "grpo" and args.input_len is not None:
            inputs = f" x (prompt {args.input_len:,} + completion {objective.completion_len:,})"
        if options.parallel.active:
            rows += f" per rank ({options.parallel.label} on {options.parallel.devices} devices)"
        print(f"{est.model_type} ({est.family}): predicted peak {size(est.peak_bytes)} at {est.phase} "
              f"for {rows}{inputs}{target}")
        if objective.name != "trainer":
            print("  phases: " + " · ".join(f"{k} {size(v)}" for k, v in est.phase_peaks.items()))
        for name, value in sorted(est.terms.items(), key=lambda kv: -kv[1]):
            if value > 0:
                print(f"  {name:26} {value / gib:10,.3f} GiB")
        for note in est.notes:
            print(f"  note: {note}")
        if "allocator" in data["memory"]:
            from lengthscan.memory.summary import allocator_lines

            print("\n".join(allocator_lines(data["memory"]["allocator"])))
        if budget is not None:
            train_fits = est.peak_bytes <= usable_bytes(budget, args.margin)
            print(f"  {'fits' if train_fits else 'does NOT fit'} in {args.budget} with a {args.margin:.0%} margin")
            if "alternatives" in data["memory"]:
                from lengthscan.memory.alternatives import advice_line

                print(f"  {advice_line(data['memory']['alternatives'], size)}")
        if "evaluation" in data["memory"]:
            from lengthscan.memory.evaluation import summary_lines

            print("\n".join(summary_lines(data["memory"]["evaluation"])))
    return EXIT_GATE if fits is False else EXIT_OK


def _as_flags(exc: Exception) -> str:
    """The library's message with its parameter names as the flags the user typed."""
    import re

    return re.sub(r"\b(batch_size|input_len|target_len)\b", lambda m: "--" + m.group(1).replace("_", "-"), str(exc))


def _add_memory_data_flags(m: argparse.ArgumentParser) -> None:
    """``lengthscan memory SRC``'s flags: the audit's fields, the epoch, the report and the export."""
    add_source_argument(m, nargs="?", help="data mode: the training data (as audit takes it); without it, shape mode")
    add_flags(m, "input", "audio", "target", "messages", "prompt", "completion", "tools", "chat_template", "train_on",
              "tokenizer", "sampling_rate", "split", "max_chars", "cache", "num_proc", prefix="data mode: ",
              split={"help": "the split trained on (default train, else the first)"})
    m.add_argument("--sampler", choices=("random", "group_by_length", "batch_rebalance"), default="random",
                   help="data mode: the Trainer's train_sampling_strategy (default random)")
    m.add_argument("--seed", type=int, default=42, help="data mode: the Trainer's args.seed (default 42)")
    m.add_argument("--pad-to-multiple-of", type=int, metavar="N", help="data mode: the collator's pad_to_multiple_of")
    m.add_argument("--margin", type=float, default=0.1, help="share of --budget kept free (default 0.1)")
    m.add_argument("--export-worst-batch", type=named, metavar="DIR",
                   help="data mode: save the worst batch's rows (save_to_disk)")
    m.add_argument("--out", type=named, metavar="DIR",
                   help="data mode: write lengths.parquet, report.json and report.html here")
    add_flags(m, "overwrite", overwrite={"help": "data mode: replace --out / --export-worst-batch"})
    add_flags(m, "packing", "max_length", "packing_num_proc", "shuffle_seed", prefix="data mode: ")
    add_flags(m, "chosen", "rejected", "pair_max_length", "pair_trainer", "truncation_mode", "rl", "num_generations",
              prefix="data mode: ", pair_trainer={"default": None})


def _memory_data(args, command: str) -> int:
    import json

    from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
    from lengthscan.memory.data import predict_dataset
    from lengthscan.memory.summary import summary_lines

    if args.input_len is not None or args.target_len is not None:
        say("lengthscan: error: --input-len/--target-len are shape mode's: drop SRC or them")
        return EXIT_USAGE
    try:
        options = _options(args)
        budget = parse_size(args.budget) if args.budget else None
        evaluation = None
        if args.eval_batch_size is not None:
            from lengthscan.memory.data_eval import EvalData

            evaluation = EvalData(eval_options(args), args.eval_split, args.eval_source)
        with ProgressBars(disabled=args.json) as progress:
            result = predict_dataset(
                args.source, model=args.model, batch_size=args.batch_size, input=args.input, target=args.target,
                audio=args.audio, tokenizer=args.tokenizer, sampling_rate=args.sampling_rate, split=args.split,
                options=options, sampler=args.sampler, seed=args.seed, pad_to_multiple_of=args.pad_to_multiple_of,
                budget_bytes=budget, margin=args.margin, out=args.out, overwrite=args.overwrite,
                export_worst_batch=args.export_worst_batch, cache=args.cache,
                max_chars=args.max_chars or DEFAULT_MAX_CHARS, num_proc=args.num_proc, progress=progress,
                command=command, chat=_fields(args),
                packing=_packing(args), evaluation=evaluation, allocator=allocator_of(args, budget))
    except ValueError as exc:
        say(f"lengthscan: error: {_as_flags(exc)}")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps({"memory": result.memory}, indent=2) + "\n")
    else:
        print("\n".join(summary_lines(result.memory)))
        if "evaluation" in result.memory:
            from lengthscan.memory.data_eval import summary_lines as eval_lines

            print("\n".join(eval_lines(result.memory["evaluation"])))
    return EXIT_GATE if result.fits is False else EXIT_OK


def _fields(args) -> dict:
    """The audit's conversation, pair and prompt fields of data mode (those given)."""
    fields = {"messages": args.messages, "prompt": args.prompt, "completion": args.completion, "tools": args.tools,
              "chat_template": args.chat_template,
              "train_on": args.train_on if args.messages or (args.prompt and args.completion) else None}
    if args.chosen or args.rejected:
        fields.update(chosen=args.chosen, rejected=args.rejected, pair_max_length=args.pair_max_length,
                      pair_trainer=args.pair_trainer or "dpo", truncation_mode=args.truncation_mode)
    if args.rl:
        fields.update(rl=args.rl, num_generations=args.num_generations,
                      max_completion_length=args.max_completion_length or 512)
    return fields


def _packing(args):
    """``PackingOptions`` of data mode's ``--packing`` flags (None without them)."""
    if args.packing is None and args.max_length is None and args.packing_num_proc is None \
            and args.shuffle_seed is None:
        return None
    from lengthscan.pack.options import PackingOptions

    return PackingOptions(packing=args.packing, max_length=args.max_length, packing_num_proc=args.packing_num_proc,
                          shuffle_seed=args.shuffle_seed, batch_size=args.batch_size, grad_accum=args.grad_accum)
