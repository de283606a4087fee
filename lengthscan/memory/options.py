"""The inputs of the memory model: training options and one batch's shape (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lengthscan.memory.adapters import Lora
from lengthscan.memory.objective import Objective
from lengthscan.memory.optimizers import ALIASES, OPTIMIZERS, canonical
from lengthscan.memory.parallel import Parallel
from lengthscan.memory.quant import Quantization

PRECISIONS = ("fp32", "bf16", "fp16")
TORCH_DTYPES = ("fp32", "bf16", "fp16")
ATTENTIONS = ("eager", "sdpa", "flash")
HEADS = ("auto", "seq2seq", "causal_lm", "masked_lm", "classification", "ctc", "whisper")


@dataclass(frozen=True)
class MemoryOptions:
    """How the model is trained: what the Trainer's arguments decide about memory.

    ``precision``: ``fp32``, or ``bf16``/``fp16`` autocast (``TrainingArguments(bf16=True)``).
    ``torch_dtype``: the dtype the weights are loaded in (``from_pretrained(dtype=...)``): the
    Trainer keeps it, so ``bf16`` weights have bf16 gradients and optimizer state and no fp32
    master copy. ``optimizer``: ``TrainingArguments.optim`` (see ``optimizers.py``; ``adamw``,
    ``adamw_foreach`` and ``adamw_loop`` are accepted as aliases). ``adapter``: a LoRA/DoRA
    adapter (peft): only it trains. ``quantization``: a bitsandbytes-quantized base (4-bit or
    LLM.int8), prepared with ``prepare_model_for_kbit_training`` when ``prepare_kbit``.
    ``attention``: ``eager`` saves the quadratic attention matrices, ``sdpa`` and ``flash`` keep a
    linear amount. ``head``: the model class trained (``auto``: from ``config.architectures``, else
    the family's usual one: see :func:`lengthscan.memory.families.resolve_head`).
    ``gradient_accumulation_steps`` > 1 keeps the gradients alive through the forward pass.
    ``objective``: what the step optimises (``objective.py``): the Trainer's loss, or a TRL preference
    or RL trainer's (chosen and rejected in one forward, a reference model, generation).
    ``parallel``: several devices (``parallel.py``): what each rank holds beyond one device's step.
    """

    precision: str = "fp32"
    optimizer: str = "adamw"
    gradient_checkpointing: bool = False
    attention: str = "sdpa"
    freeze_feature_encoder: bool = False
    head: str = "auto"
    gradient_accumulation_steps: int = 1
    torch_dtype: str = "fp32"
    adapter: Lora | None = None
    quantization: Quantization | None = None
    prepare_kbit: bool = True
    objective: Objective = Objective()
    parallel: Parallel = Parallel()

    def __post_init__(self):
        if self.optimizer in ALIASES:
            object.__setattr__(self, "optimizer", canonical(self.optimizer))
        for name, allowed in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS), ("attention", ATTENTIONS),
                              ("head", HEADS), ("torch_dtype", TORCH_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError("gradient_accumulation_steps must be at least 1")
        if self.quantization is not None and self.adapter is None:
            raise ValueError("a quantized model trains only through adapters (the Trainer refuses to fine-tune it "
                             "whole): add --adapter-config (or --lora-r), or leave --quantization-config out")
        if self.parallel.sharded and self.gradient_accumulation_steps > 1 and not (
                self.parallel.fsdp and self.parallel.fsdp_version == 2):
            raise ValueError(f"--strategy {self.parallel.strategy} with gradient accumulation is priced for FSDP2 only "
                             "yet (FSDP1's and DeepSpeed's gradients between micro-batches are their own)")
        if self.parallel.sharded and self.objective.name != "trainer":
            raise ValueError(f"--strategy {self.parallel.strategy} with --objective {self.objective.name} is not "
                             "priced yet (its reference forward and generation under sharding): use ddp, or the "
                             "Trainer's objective")
        if self.quantization is not None and (self.parallel.zero or (self.parallel.fsdp and (
                self.parallel.fsdp_version == 1 or not self.quantization.four_bit))):
            raise ValueError(f"--strategy {self.parallel.strategy} over a bitsandbytes-quantized model is priced for "
                             "FSDP2 with 4-bit weights (FSDP-QLoRA) only")
        if self.objective.reference == "adapter" and self.adapter is None:
            raise ValueError("--reference adapter is the model with its adapters switched off: it needs an adapter "
                             "(--adapter-config or --lora-r)")

    def to_dict(self) -> dict:
        return asdict(self)


#: shapes past these are typos, not plans (and would overflow the arithmetic)
MAX_BATCH, MAX_LEN = 1_000_000, 1_000_000_000


@dataclass(frozen=True)
class Shape:
    """One padded batch: rows and padded lengths.

    ``input_len``: tokens; audio samples for speech encoders (Wav2Vec2-like, ``input_samples``);
    mel frames for Whisper (None: the ``2 * max_source_positions`` frames Whisper requires).
    ``target_len``: label tokens of encoder-decoders and CTC heads (decoder-only models use the
    inputs as labels). ``padding``: some row is shorter than the padded length, so the model builds
    attention masks (a batch of equal rows builds none with SDPA).
    """

    batch_size: int
    input_len: int | None = None
    target_len: int | None = None
    padding: bool = False

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.batch_size > MAX_BATCH:
            raise ValueError(f"batch_size {self.batch_size:,} is past {MAX_BATCH:,}: not a training batch")
        for name in ("input_len", "target_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1")
            if value is not None and value > MAX_LEN:
                raise ValueError(f"{name} {value:,} is past {MAX_LEN:,}: no model takes that")

    def to_dict(self) -> dict:
        return asdict(self)
