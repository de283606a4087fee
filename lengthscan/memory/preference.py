"""The steps of TRL's trainers (1.16), priced on the memory model's tape.

``SFTTrainer``: the Trainer's step with TRL's fused log-probability head (``fused_head.log_probs``)
instead of the model's logits and loss.

``DPOTrainer._compute_loss``, per batch of ``B`` pairs padded to ``L`` tokens (prompt and the
longer answer):

1. the policy's forward on ``2B`` rows (chosen then rejected) through TRL's fused log-probability
   head (``fused_head.log_probs``), its graph kept for backward;
2. the reference's forward on the same rows under ``torch.no_grad``, while step 1's activations wait:
   a second copy of the model held all along (``reference_weights``), or the policy itself with its
   adapters switched off (``use_adapter``: no second copy); ``precompute_ref_log_probs`` skips it;
3. the loss, backward and the optimizer step, as any step.

``KTOTrainer``: ``B`` rows (prompt + completion) through the same head, the batch's KL rows (each
prompt with another row's completion) held beside them; the policy scores the KL rows without
gradients before its forward (below the reference's moment), and the reference scores both while the
policy's activations wait (one forward at a time: the larger is priced).
``RewardTrainer``: ``2B`` rows through ``AutoModelForSequenceClassification`` (one score per row,
``fused_head.score``), no reference. ``GRPOTrainer``: the training step is ``B`` completions of
``L`` tokens (prompt + ``max_completion_length``) through the fused head with entropy, no
reference in the step; before it, ``generate`` on the generation batch (``B`` x steps per generation
rows, the Trainer's gradient accumulation by default; no vLLM) with the training state resident:
the prefill (the head on each row's last position), then the key/value cache growing to ``L``
positions in every layer, and each step's fp32 scores; with ``beta > 0`` the reference's
log-probabilities (its weights held, a no-grad forward of ``B`` rows). The generation figures are
a model of transformers' ``generate`` (every row runs to ``max_completion_length``), measured on CPU
apart; the SFT, DPO and reward steps are measured on CPU by ``bench/preference_memory_validation.py``.
The caching allocator's replay (``reserved.py``) covers the step, not GRPO's generation.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lengthscan.memory.families import family_of
from lengthscan.memory.model import optimizer_temporaries, state_terms, trace
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.tape import BYTES
from lengthscan.memory.timeline import Phase, replay
from lengthscan.memory.weights import ADAPTER_PARTS, TORCH_DTYPES

#: the objective -> the head its trainer puts on the model (``fused_head.py``)
HEADS = {"sft": "sft", "dpo": "dpo", "kto": "dpo", "reward": "score", "grpo": "grpo"}


def phases(config, shape: Shape, options: MemoryOptions, log: list | None = None):
    """(trace, state terms, phases) of the objective's step on ``shape`` (``B`` rows of ``L`` tokens);
    ``log``: see ``timeline.replay`` (GRPO's generation phase is not logged)."""
    obj = options.objective
    if family_of(config) != "decoder-only":
        raise ValueError(f"--objective {obj.name} is priced for decoder-only models, not {config.model_type!r} "
                         f"({family_of(config)})")
    if shape.input_len is None:
        raise ValueError("this model's shape needs input_len")
    pairs = obj.name in ("dpo", "reward")
    step = Shape(2 * shape.batch_size, shape.input_len, None, True) if pairs else shape
    head = HEADS[obj.name]
    tr = trace(config, step, options, trl_head=head)
    base = state_terms(tr, options)
    reference = obj.reference_for(options.adapter)
    if reference == "model":
        base["reference_weights"] = reference_weights(tr)
    if obj.name == "kto":  # the collator's KL rows: input ids, attention and completion masks (int64)
        base["batch"] += 3 * step.batch_size * step.input_len * 8
    interlude = None
    if obj.name in ("dpo", "kto") and reference in ("model", "adapter"):
        interlude = ("reference_forward", {"reference_forward": no_grad_forward(config, step, options, head,
                                                                                 reference)})
    result = replay(tr.tape, base, optimizer_temporaries(tr, options), interlude, log)
    if obj.name == "grpo":
        result.append(generation_phase(config, shape, options, base, reference))
    return tr, base, result


def reference_weights(tr) -> int:
    """The reference model's weights: the policy's without adapters (a model loaded like the policy)."""
    seen, total = set(), 0
    for name, p in tr.tape.params.items():
        if id(p) in seen or any(part in name for part in ADAPTER_PARTS) or name.endswith("#original"):
            continue
        seen.add(id(p))
        total += p.nbytes
    return total


def no_grad_forward(config, step: Shape, options: MemoryOptions, head: str, reference: str) -> int:
    """Bytes a forward without gradients allocates above the state (its outputs included, alive until the
    trainer's loss returns). The adapters-off reference reuses the policy's autocast weight casts."""
    opts = replace(options, gradient_checkpointing=False, gradient_accumulation_steps=1)
    peak = replay(trace(config, step, opts, grad=False, trl_head=head).tape, {}, 0)[0]
    return peak.peak - (peak.terms.get("weight_copies", 0) if reference == "adapter" else 0)


def generation_phase(config, shape: Shape, options: MemoryOptions, base: dict, reference: str) -> Phase:
    """GRPO's generation and scoring before the step, on top of the state (no gradients then)."""
    obj = options.objective
    rows = obj.generation_batch or shape.batch_size * options.gradient_accumulation_steps
    total = shape.input_len
    prompt = max(total - obj.completion_len, 1)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer")
    heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head")
    d = getattr(text, "hidden_size", None) or getattr(text, "n_embd")
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or d // heads
    weights = BYTES[TORCH_DTYPES[options.torch_dtype]]
    cache_bytes = 2 if options.precision != "fp32" else weights  # k_proj/v_proj outputs: autocast's dtype
    per_position = 2 * layers * kv_heads * head_dim * cache_bytes

    state = {k: v for k, v in base.items() if k != "gradients"}
    opts = replace(options, gradient_checkpointing=False, gradient_accumulation_steps=1)
    prefill = replay(trace(config, Shape(rows, prompt, None, True), opts, grad=False, trl_head="last_logits").tape,
                     {}, 0)[0].peak
    # the int64 ids and attention mask, grown one position a step by torch.cat: old and new ids at once
    sequences = 3 * rows * total * 8
    moments = {"prefill": {"generation_prefill": prefill, "kv_cache": rows * prompt * per_position},
               "last step": {"kv_cache": rows * total * per_position, "generation_logits":
                             rows * text.vocab_size * (cache_bytes + 3 * 4), "generation_sequences": sequences}}
    if reference in ("model", "adapter"):
        moments["reference log-probs"] = {
            "reference_forward": no_grad_forward(config, shape, options, "dpo", reference),
            "generation_sequences": sequences}
    name, terms = max(moments.items(), key=lambda m: sum(m[1].values()))
    terms = {**state, **terms}
    return Phase(f"generation ({name})", sum(terms.values()), {k: v for k, v in terms.items() if v})


def trainer_lengths(lengths: dict, options: MemoryOptions, fields: dict) -> dict:
    """The rows' lengths as the objective's trainer batches them: DPO's collator cuts each sequence to
    ``--pair-max-length``, RewardTrainer drops the pairs past it (left out here, as ``clean`` drops them)."""
    cap = fields.get("pair_max_length")
    if not cap or "input_tokens" not in lengths or options.objective.name not in ("dpo", "reward"):
        return lengths
    x = lengths["input_tokens"]
    if options.objective.name == "dpo":
        x = np.where(x > cap, float(cap), x)
    else:
        x = np.where(x > cap, -1.0, x)
    return {**lengths, "input_tokens": x}
