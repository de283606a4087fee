"""``lengthscan memory``'s flags for what the run is beyond one device's Trainer step: the trainer's
objective (TRL's preference and RL trainers), several devices, and the caching allocator model."""

from __future__ import annotations

import argparse

from lengthscan.cli.common import say


def add_run_shape_flags(m: argparse.ArgumentParser) -> None:
    """The trainer the step is priced for: supervised, or TRL's preference and RL trainers."""
    from lengthscan.memory.objective import OBJECTIVES, REFERENCES

    g = m.add_argument_group("the objective (TRL's preference and RL trainers)")
    g.add_argument("--objective", choices=tuple(OBJECTIVES), metavar="NAME",
                   help="the trainer whose step is priced: trainer (default: transformers' Trainer, the model's "
                        "own loss over full logits), sft (TRL's SFTTrainer: its fused log-prob head, no logits), dpo "
                        "(DPOTrainer: chosen and rejected in one forward, a reference model), kto (KTOTrainer: "
                        "data mode with --prompt/--completion), reward (RewardTrainer) "
                        "or grpo (GRPOTrainer: generation, then the step); data mode infers dpo, reward and grpo from "
                        "--chosen/--rejected (with --pair-trainer) and --rl. Shape mode: for dpo and reward "
                        "--batch-size counts pairs and --input-len is the padded pair row (prompt + the longer "
                        "answer); for grpo --input-len is the prompt")
    g.add_argument("--reference", choices=REFERENCES, default="auto",
                   help="the reference model: auto (DPO: the adapters switched off with an adapter, else a second "
                        "copy; GRPO: none, as beta=0), model, adapter, precomputed (precompute_ref_log_probs) or none")
    g.add_argument("--max-completion-length", type=int, metavar="N",
                   help="grpo: GRPOConfig.max_completion_length, the tokens generated per completion (default 512)")
    d = m.add_argument_group("several devices (per-rank peaks)")
    d.add_argument("--devices", type=int, default=1, metavar="N", help="GPUs trained on (default 1): the peak is "
                                                                         "each rank's, on its per-device batch")
    d.add_argument("--strategy", metavar="NAME",
                   help="ddp (each rank holds the model and the reducer's gradient buckets); fsdp (FULL_SHARD) or "
                        "fsdp_shard_grad_op (each rank keeps a shard of the weights, gradients and optimizer state and "
                        "gathers one layer at a time; FSDP2 as the Trainer wraps it, FSDP1 with --fsdp-version 1); "
                        "zero1, zero2, zero3 (DeepSpeed ZeRO stages: optimizer state, + gradients, + weights "
                        "partitioned)")
    d.add_argument("--fsdp-version", type=int, choices=(1, 2),
                   help="fsdp_config['version'] (default 2, the Trainer's since transformers 5)")
    d.add_argument("--offload", choices=("optimizer", "params"),
                   help="ZeRO: offload_optimizer to the CPU (master copy, Adam's moments, fp32 gradients), or "
                        "offload_param too (zero3)")
    a = m.add_argument_group("the caching allocator (modelled: reserved memory, fragmentation)")
    a.add_argument("--alloc-conf", metavar="CONF",
                   help="PYTORCH_CUDA_ALLOC_CONF as the run sets it (expandable_segments:True, max_split_size_mb:N, "
                        "roundup_power2_divisions:N, garbage_collection_threshold:F): replay the steps through a model "
                        "of PyTorch's caching allocator (also done with --budget)")
    a.add_argument("--memory-fraction", type=float, metavar="F",
                   help="torch.cuda.set_per_process_memory_fraction(F) of --budget, for the allocator model")
    g.add_argument("--generation-batch-size", type=int, metavar="N",
                   help="grpo: rows generated at once (GRPOConfig.generation_batch_size; default: --batch-size x "
                        "--grad-accum)")


def objective_of(args):
    """The step's objective from ``--objective`` (data mode: as the measured fields imply)."""
    from lengthscan.memory.objective import Objective

    implied = "grpo" if args.rl else (args.pair_trainer or "dpo") if args.chosen or args.rejected else None
    name = args.objective or implied or "trainer"
    if args.source is not None and implied != (None if name in ("trainer", "sft", "kto") else name):
        fields = {"dpo": "--chosen/--rejected", "reward": "--chosen/--rejected with --pair-trainer reward",
                  "grpo": "--prompt with --rl grpo"}
        raise ValueError(f"--objective {name}: data mode measures {fields.get(name, 'the fields of an SFT run')}"
                         + (f"; the fields given are for {implied}" if implied else ""))
    if name != "trainer" and args.eval_batch_size is not None:
        raise ValueError(f"--eval-batch-size prices Trainer.evaluate on the model's logits; the evaluation of "
                         f"--objective {name} is not priced yet: drop one of them")
    completion = args.max_completion_length
    if name == "grpo" and completion is None:
        completion = 512  # GRPOConfig's default, as the audit's --max-completion-length
    return Objective(name, args.reference, completion, args.generation_batch_size)


def allocator_of(args, budget: int | None):
    """The allocator model's configuration from ``--alloc-conf``/``--memory-fraction`` (None: neither)."""
    if args.alloc_conf is None and args.memory_fraction is None:
        return None
    from lengthscan.memory.alloc_conf import AllocatorConfig

    fraction = 1.0 if args.memory_fraction is None else args.memory_fraction
    if not 0 < fraction <= 1:
        raise ValueError("--memory-fraction: a share of the device, above 0 and at most 1")
    if fraction < 1 and budget is None:
        raise ValueError("--memory-fraction is a share of the device: give --budget (its memory)")
    conf = AllocatorConfig.parse(args.alloc_conf or "", memory_fraction=fraction, total=budget)
    if conf.garbage_collection_threshold and conf.allowed is None:
        say("lengthscan: warning: garbage_collection_threshold acts only under a memory fraction below 1 (torch "
            "ignores it otherwise): add --memory-fraction F")
    return conf
