"""The measured CPU peak of ``Trainer.evaluate`` with the training state resident (validation only).

A real ``transformers.Trainer`` trains one step (so the optimizer state exists, gradients then set
to None), then ``evaluate()`` runs under ``torch.profiler(profile_memory=True)`` with the kernels
aligned with CUDA's (:func:`lengthscan.memory.align.cuda_like`). The peak is the bytes live before
``evaluate`` plus the highest running sum of the allocation events during it, as in ``cpu_peak``.

One more alignment: on CPU, ``EvalLoopContainer.to_cpu_and_numpy``'s ``tensor.cpu().numpy()`` shares
the tensor's memory, so the "moved" predictions stay in torch's allocations; on CUDA the copy is on
the host and the device tensors are freed. The measurement copies the arrays (host memory, not
counted), as CUDA does.
"""

from __future__ import annotations

import contextlib
import tempfile

from lengthscan.memory.align import cuda_like
from lengthscan.memory.cpu_peak import Measurement, foreign_tensors, live_bytes, profiled_peak
from lengthscan.memory.families import resolve_head
from lengthscan.memory.options import MemoryOptions

OPTIM = {"adamw": "adamw_torch_fused", "adamw_foreach": "adamw_torch", "adamw_loop": "adamw_torch", "sgd": "sgd"}


def eval_rows(config, lengths, targets=None, *, head: str = "auto", seed: int = 0) -> list[dict]:
    """Rows of random token ids with the given lengths (and target lengths), as a tokenized dataset holds them."""
    import random

    rng = random.Random(seed)
    vocab = getattr(config, "vocab_size", 1000)
    head = resolve_head(config, head)
    rows = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(4, vocab) for _ in range(int(n))]
        if head == "seq2seq":
            labels = [rng.randrange(4, vocab) for _ in range(int(targets[i]))]
        elif head == "classification":
            labels = rng.randrange(max(getattr(config, "num_labels", 2), 1))
        else:
            labels = list(ids)
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def collate(rows: list[dict]) -> dict:
    """Pad to the longest row (ids with 0, attention mask 0, labels with -100), as the Trainer's collators do."""
    import torch

    longest = max(len(r["input_ids"]) for r in rows)
    batch = {"input_ids": torch.tensor([r["input_ids"] + [0] * (longest - len(r["input_ids"])) for r in rows]),
             "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (longest - len(r["input_ids"]))
                                             for r in rows])}
    if isinstance(rows[0]["labels"], int):
        batch["labels"] = torch.tensor([r["labels"] for r in rows])
    else:
        tl = max(len(r["labels"]) for r in rows)
        batch["labels"] = torch.tensor([r["labels"] + [-100] * (tl - len(r["labels"])) for r in rows])
    return batch


def _argmax(logits, labels):
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


def measure_evaluate(model, rows: list[dict], evo, options: MemoryOptions = MemoryOptions(), *,
                     align: bool = True, generation: dict | None = None) -> Measurement:
    """The CPU peak of ``Trainer.evaluate`` over ``rows`` (dataset order) after one training step.

    ``generation`` (``max_length``, ``num_beams``): ``Seq2SeqTrainer`` with ``predict_with_generate=True``
    and ``generation_max_length``/``generation_num_beams``; every row generates to ``max_length`` (the
    worst case the model prices): the EOS token's logit is pushed down (:func:`never_ends`)."""
    import numpy as np
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile
    from transformers import trainer_pt_utils

    transformers.logging.set_verbosity_error()
    if generation is not None:
        never_ends(model)
    foreign = foreign_tensors(torch, model)
    with tempfile.TemporaryDirectory() as out:
        seq2seq = {} if generation is None else {
            "predict_with_generate": True, "generation_max_length": generation.get("max_length"),
            "generation_num_beams": generation.get("num_beams")}
        arguments, trainer_class = ((transformers.TrainingArguments, transformers.Trainer) if generation is None else
                                    (transformers.Seq2SeqTrainingArguments, transformers.Seq2SeqTrainer))
        args = arguments(
            **seq2seq, output_dir=out, per_device_train_batch_size=evo.batch_size,
            per_device_eval_batch_size=evo.batch_size,
            eval_accumulation_steps=evo.accumulation_steps, prediction_loss_only=evo.prediction_loss_only,
            max_steps=1, report_to=[], use_cpu=True, remove_unused_columns=False, save_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, optim=OPTIM.get(options.optimizer, options.optimizer),
            bf16=options.precision == "bf16", fp16=options.precision == "fp16", logging_strategy="no")
        trainer = trainer_class(
            model=model, args=args, train_dataset=rows[:evo.batch_size], eval_dataset=rows, data_collator=collate,
            compute_metrics=lambda p: {}, preprocess_logits_for_metrics=_argmax if evo.argmax_logits else None)
        original = trainer_pt_utils.nested_numpify

        def to_host(tensors):  # CUDA's .cpu() is a host copy: the device tensors are freed
            arrays = original(tensors)
            return _map(arrays, lambda a: np.array(a, copy=True))

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        trainer_pt_utils.nested_numpify = to_host
        try:
            with cuda_like() if align else contextlib.nullcontext():
                trainer.train()
                model.zero_grad(set_to_none=True)
                live_before = live_bytes(torch, model, foreign)
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    trainer.evaluate()
        finally:
            trainer_pt_utils.nested_numpify = original
            torch.set_num_threads(threads)
    return profiled_peak(prof, live_before)


def never_ends(model) -> None:
    """Make a random model never emit EOS before ``max_length``: ``final_logits_bias`` (BART-like) set
    to -1e4 at EOS, or the output embedding's EOS row zeroed (a logit of 0, below the best of a random
    vocabulary's); the forced EOS at the last step still happens."""
    import torch

    eos = model.config.eos_token_id
    with torch.no_grad():
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias[..., eos] = -1e4
        else:
            model.get_output_embeddings().weight[eos] = 0


def _map(x, fn):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return fn(x)
