"""Public functions: load a config, estimate one batch shape's peak, list the families."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lengthscan.memory import decoder_gemma, decoder_moe
from lengthscan.memory.families import family_of, resolve_head, supported_model_types
from lengthscan.memory.model import phases
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.sizes import MAX_CONFIG_BYTES, check_sizes

__all__ = ["MemoryEstimate", "MemoryOptions", "Shape", "estimate", "estimate_many", "families", "load_config"]

PHASES = ("forward_end", "backward", "optimizer_step")


@dataclass(frozen=True)
class MemoryEstimate:
    """The predicted peak of one training step and what it is made of.

    ``terms`` are the bytes live at the peak, by term: ``weights``, ``gradients``,
    ``optimizer_state``, ``optimizer_temporaries``, ``batch``, ``buffers``, ``weight_copies``
    (autocast's low-precision weight casts), ``activations_<kind>`` (attention, mlp, norms,
    embeddings, masks, feature_encoder, other), ``logits_loss``, ``activation_gradients`` and
    ``workspace`` (kernel scratch); they sum to ``peak_bytes``. ``phase_peaks`` holds the highest
    point of each phase. ``notes`` say what the figure assumes beyond the options (the attention a
    model runs whatever was asked, the routing MoE experts are priced for).
    """

    peak_bytes: int
    phase: str
    terms: dict
    params: int
    trainable_params: int
    phase_peaks: dict = field(default_factory=dict)
    model_type: str = ""
    family: str = ""
    head: str = ""
    shape: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    notes: tuple = ()
    run: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready: the peak, its phase, terms and phase peaks, counts, the shape and options."""
        return {
            "peak_bytes": self.peak_bytes,
            "phase": self.phase,
            "terms": dict(self.terms),
            "phase_peaks": dict(self.phase_peaks),
            "params": self.params,
            "trainable_params": self.trainable_params,
            "model_type": self.model_type,
            "family": self.family,
            "head": self.head,
            "shape": dict(self.shape),
            "options": dict(self.options),
            "notes": list(self.notes),
            "run": dict(self.run),
        }


def load_config(model: str):
    """``AutoConfig`` of a model directory, a ``config.json`` file, or a hub name (no weights).

    A local config's sizes are checked before transformers builds anything from them (see
    ``memory/sizes.py``): a corrupt or hostile one is a ``ModelError`` (exit 2), not a hang."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoConfig

    from lengthscan.policy.model_loading import ModelError, read_config

    path = Path(str(model)).expanduser()
    if path.is_file():
        config_dict = _local_config_dict(path, str(model))
        try:  # transformers' own validation of the values (a size of 2.5 ...)
            config = AutoConfig.for_model(**config_dict)
        except Exception as exc:
            line = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise ModelError(f"{model}: the config does not load: {line}") from None
    else:
        if (path / "config.json").exists():  # a FIFO or device there is refused, not read
            _local_config_dict(path / "config.json", str(model))
        config = read_config(str(model))
    check_sizes(config, str(model))
    return config


def _local_config_dict(path: Path, model: str) -> dict:
    """A local config file's dict, its sizes checked: ``ModelError`` naming ``model`` otherwise."""
    from transformers import PretrainedConfig

    from lengthscan.policy.model_loading import ModelError

    if not path.is_file():
        raise ModelError(f"{model}: the config is not a regular file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelError(f"{model}: the config is {path.stat().st_size:,} bytes, past the bound of "
                         f"{MAX_CONFIG_BYTES:,} (real configs are a few kilobytes): not a model's config")
    try:  # not JSON, not an object
        config_dict, _ = PretrainedConfig.get_config_dict(str(path))
    except Exception as exc:
        line = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ModelError(f"{model}: the config does not load: {line}") from None
    if not isinstance(config_dict, dict) or not config_dict.get("model_type"):
        raise ModelError(f"{model}: the config has no model_type")
    check_sizes(config_dict, model)
    return config_dict


def estimate(config, shape: Shape, options: MemoryOptions = MemoryOptions()) -> MemoryEstimate:
    """The peak bytes of one training step on a batch of ``shape`` (see docs/memory.md)."""
    if isinstance(config, (str, os.PathLike)):
        config = load_config(str(config))
    if options.objective.name == "trainer":
        trace, _, result = phases(config, shape, options)
    else:
        from lengthscan.memory import preference

        trace, _, result = preference.phases(config, shape, options)
    best = max(result, key=lambda p: p.peak)
    return MemoryEstimate(
        peak_bytes=int(best.peak),
        phase=best.name,
        terms={k: int(v) for k, v in sorted(best.terms.items(), key=lambda kv: -kv[1]) if v},
        params=trace.params,
        trainable_params=trace.trainable,
        phase_peaks={p.name: int(p.peak) for p in result},
        model_type=getattr(config, "model_type", ""),
        family=family_of(config),
        head=resolve_head(config, options.head),
        shape=shape.to_dict(),
        options=options.to_dict(),
        notes=tuple(decoder_gemma.notes(config, options) + decoder_moe.notes(config) + run_notes(trace, options)),
        run=run_summary(trace, options),
    )


def run_summary(trace, options: MemoryOptions) -> dict:
    """What the run launched trains and holds: adapters, quantization, dtypes, the optimizer's state."""
    from lengthscan.memory import optimizers

    state = optimizers.state_bytes(options.optimizer, trace.trained_params)
    return {"torch_dtype": options.torch_dtype, "optimizer": options.optimizer,
            "adapter": options.adapter.describe() if options.adapter else None,
            "adapted_modules": len(trace.adapted),
            "quantization": options.quantization.describe() if options.quantization else None,
            "prepare_kbit": bool(options.quantization and options.prepare_kbit),
            "weight_bytes": trace.weight_bytes, "optimizer_state_bytes": state,
            "optimizer_state_paged_bytes": state if optimizers.paged(options.optimizer) else 0}


def run_notes(trace, options: MemoryOptions) -> list[str]:
    from lengthscan.memory import optimizers

    out = []
    if options.adapter is not None:
        out.append(f"{options.adapter.describe()}: {len(trace.adapted)} layers adapted; trains "
                   f"{trace.trainable:,} of {trace.params:,} parameters")
    if options.quantization is not None:
        prepared = ", prepared with prepare_model_for_kbit_training (its other weights in fp32)" \
            if options.prepare_kbit else ""
        out.append(f"base quantized: {options.quantization.describe()}{prepared}")
    if options.objective.name != "trainer":
        out.append(objective_note(options))
    if options.parallel.active:
        out.append(options.parallel.note())
    if optimizers.paged(options.optimizer):
        out.append(f"{options.optimizer}: its state is counted on the device; CUDA may page it out to host "
                   "memory under pressure (optimizer_state is the evictable part)")
    return out


def objective_note(options: MemoryOptions) -> str:
    """What the priced step of a preference or RL trainer runs, in words."""

    obj = options.objective
    reference = obj.reference_for(options.adapter)
    ref = {"model": "a second copy of the model as reference (held, and its forward without gradients while "
                    "the policy's activations wait)",
           "adapter": "the model with its adapters off as reference (its forward without gradients while the "
                      "policy's activations wait)",
           "precomputed": "reference log-probabilities precomputed (no reference in the step)",
           "none": "no reference model"}[reference]
    defaults = ("; TRL's configs default to bf16=True and gradient_checkpointing=True (--precision bf16 "
                "--gradient-checkpointing price those)")
    return _objective_words(obj, ref) + defaults


def _objective_words(obj, ref: str) -> str:
    from lengthscan.memory.objective import OBJECTIVES

    if obj.name == "sft":
        return f"{OBJECTIVES['sft']}: TRL's fused log-probability head with entropy and top-1 flags (no " \
               "vocabulary-wide logits; every position's bound)"
    if obj.name == "dpo":
        return f"{OBJECTIVES['dpo']}: chosen and rejected in one forward of 2 x the batch's rows, TRL's fused " \
               f"log-probability head (no vocabulary-wide logits; every position's bound); {ref}; DPOConfig cuts " \
               "sequences at max_length=1024 by default (--pair-max-length prices the cut)"
    if obj.name == "kto":
        return f"{OBJECTIVES['kto']}: the batch's rows through TRL's fused log-probability head, its KL rows " \
               f"held beside them; {ref} (its forwards of both)"
    if obj.name == "reward":
        return f"{OBJECTIVES['reward']}: chosen and rejected in one forward of 2 x the batch's rows through a " \
               "sequence classifier; no reference model; RewardConfig drops pairs past max_length=1024 by default " \
               "(--pair-max-length prices that)"
    return f"{OBJECTIVES['grpo']}: the step on the batch's completions (prompt + {obj.completion_len:,} tokens) " \
           f"through TRL's fused head with entropy; generate on {obj.generation_batch or 'batch x accumulation'} " \
           f"rows before it (modelled: transformers' generate, no vLLM, every row to the maximum); {ref}"


def estimate_many(config, shapes, options: MemoryOptions = MemoryOptions()) -> list[MemoryEstimate]:
    """:func:`estimate` for each shape, computing each distinct shape once.

    The peak never decreases when the batch size or a length grows, so the worst of many batches
    is among the shapes no other shape dominates; callers with thousands of distinct shapes can
    round lengths up (to a multiple of 8, say) for an upper bound at a fraction of the cost.
    """
    if isinstance(config, (str, os.PathLike)):
        config = load_config(str(config))
    memo: dict[Shape, MemoryEstimate] = {}
    return [memo[s] if s in memo else memo.setdefault(s, estimate(config, s, options)) for s in shapes]


def families() -> list[str]:
    """The model types modeled (``config.model_type``)."""
    return supported_model_types()


#: the measurement a family's ``input_len`` counts, for its model limit
_INPUT_METRIC = {"speech-encoder": "input_samples", "speech-seq2seq": "input_frames"}


def shape_warnings(config, shape: Shape) -> list[str]:
    """What a shape asks that the model ignores or cannot take: a target length of a model whose
    labels are its inputs, and lengths past the model's positions (priced anyway)."""
    from lengthscan.policy.model_limits import ModelContext, model_limits

    family = family_of(config)
    out = []
    if shape.target_len is not None and family in ("decoder-only", "encoder-only"):
        out.append(f"--target-len {shape.target_len:,} is ignored: a {family} model has no separate target (its "
                   "labels are the input); the prediction leaves it out")
    limits = model_limits(ModelContext(getattr(config, "model_type", "") or "model", config, None, None))
    checks = [("--input-len", shape.input_len, _INPUT_METRIC.get(family, "input_tokens"))]
    if family not in ("decoder-only", "encoder-only"):
        checks.append(("--target-len", shape.target_len, "target_tokens"))
    for flag, length, metric in checks:
        limit = limits.get(metric)
        if length is not None and limit is not None and length > limit.value:
            out.append(f"{flag} {length:,} is past the model's limit of {limit.value:,} ({limit.origin}): training "
                       "would fail or truncate there; this prices a batch the model cannot take")
    return out
