"""What a training step optimises, and which trainer runs it.

``trainer`` (the default) is transformers' ``Trainer`` step: one forward of the batch, the model's
own loss over the whole ``(rows, length, vocab)`` logits. The others are TRL 1.16's trainers, priced by
:mod:`lengthscan.memory.preference` as they run:

* ``sft`` (``SFTTrainer``): the same rows through TRL's fused log-probability head (with the entropy
  and top-1 flags its metrics read), which never builds the logits;

* ``dpo`` (``DPOTrainer``): chosen and rejected in one forward of ``2 x batch`` rows (prompt and
  answer, right-padded to the longest), TRL's fused log-probability head, then the reference model's
  forward without gradients while the policy's activations wait for backward;
* ``kto`` (``KTOTrainer``): ``batch`` rows of prompt + completion through the fused head, the batch's
  KL rows (each prompt with another row's completion) held beside them; the reference (as for DPO)
  scores both without gradients while the policy's activations wait;
* ``reward`` (``RewardTrainer``): ``2 x batch`` rows through a sequence classifier, no reference;
* ``grpo`` (``GRPOTrainer``): ``batch`` completions (prompt + up to ``completion_len`` tokens) through
  the fused head with entropy; before the step, ``generate`` on the generation batch and, with a
  reference (``beta > 0``), its log-probabilities without gradients.

``reference``: ``auto`` (DPO: the adapters switched off when training adapters, else a second copy of
the model; GRPO: none, as ``beta = 0.0``, TRL's default), ``model`` (a separate copy, in the model's
dtype and quantization), ``adapter`` (the same weights with the adapters off), ``precomputed``
(``precompute_ref_log_probs=True``: the reference ran before training) or ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: objective -> the trainer it prices
OBJECTIVES = {"trainer": "Trainer", "sft": "SFTTrainer", "dpo": "DPOTrainer", "kto": "KTOTrainer",
              "reward": "RewardTrainer", "grpo": "GRPOTrainer"}
REFERENCES = ("auto", "model", "adapter", "precomputed", "none")


@dataclass(frozen=True)
class Objective:
    """The objective of the step and, for RL, the generation it needs (see the module's text)."""

    name: str = "trainer"
    reference: str = "auto"
    completion_len: int | None = None  # grpo: max_completion_length (part of the priced sequence length)
    generation_batch: int | None = None  # grpo: rows generated at once (default: batch x gradient accumulation)

    def __post_init__(self):
        if self.name not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.name!r}")
        if self.reference not in REFERENCES:
            raise ValueError(f"reference must be one of {', '.join(REFERENCES)}, not {self.reference!r}")
        if self.name in ("trainer", "sft", "reward") and self.reference not in ("auto", "none"):
            raise ValueError(f"--reference {self.reference}: the {OBJECTIVES[self.name]} step has no reference model")
        if self.name == "grpo" and self.reference == "precomputed":
            raise ValueError("--reference precomputed: GRPO scores each new completion; its reference cannot run "
                             "before training")
        if self.name != "grpo" and (self.completion_len is not None or self.generation_batch is not None):
            raise ValueError("--max-completion-length and --generation-batch-size price GRPO's generation: "
                             "give them with --objective grpo (data mode: --prompt COL --rl grpo)")
        if self.name == "grpo" and self.completion_len is None:
            raise ValueError("--objective grpo needs --max-completion-length N (GRPOConfig.max_completion_length)")
        if self.name == "grpo" and self.completion_len < 1:
            raise ValueError("--max-completion-length must be at least 1")
        if self.generation_batch is not None and self.generation_batch < 1:
            raise ValueError("--generation-batch-size must be at least 1")

    def reference_for(self, adapter) -> str:
        """The reference the step runs: ``model``, ``adapter``, ``precomputed`` or ``none``."""
        if self.reference != "auto":
            return self.reference
        if self.name in ("dpo", "kto"):
            return "adapter" if adapter is not None else "model"
        return "none"
