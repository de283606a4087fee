"""The peak of one training step: trace the family's forward pass, add the state, replay the phases."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lengthscan.memory import adapted, audio, decoder, encoder, optimizers, seq2seq
from lengthscan.memory.adapters import AdapterError
from lengthscan.memory.families import family_of, resolve_head
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.parallel import rank_terms
from lengthscan.memory.sharded import UNWRAPPED, Sharding
from lengthscan.memory.sizes import check_sizes
from lengthscan.memory.tape import Tape
from lengthscan.memory.timeline import Phase, replay
from lengthscan.memory.weights import TORCH_DTYPES, WeightPlan
from lengthscan.memory.zero import Zero


@dataclass(frozen=True)
class Trace:
    """A traced step: the tape and the counts the state is made of."""

    tape: Tape
    params: int
    trainable: int
    trained: int  # trainable parameters the forward pass uses: only these get gradients and state
    tensors_trained: int
    adapted: tuple = ()  # the linear layers given an adapter
    model_type: str = ""
    hidden: int | None = None  # the text model's hidden size (ZeRO's "auto" bucket)

    @property
    def trained_params(self) -> list:
        """The distinct parameters that get gradients and optimizer state."""
        return [p for p in _distinct(self.tape) if p.trainable and p.used]

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in _distinct(self.tape))


def trace(config, shape: Shape, options: MemoryOptions = MemoryOptions(), *, grad: bool = True,
          trl_head: str | None = None) -> Trace:
    """Run the family's forward pass for ``shape`` on a tape (the config's sizes checked first);
    ``grad=False``: under ``torch.no_grad`` (evaluation), nothing kept for backward. ``trl_head``: a
    decoder's head as a TRL trainer runs it (``log_probs``, ``log_probs+entropy``, ``score``: see
    ``fused_head.py``) instead of the logits and the loss."""
    check_sizes(config)
    head = resolve_head(config, options.head)
    family = family_of(config)
    mt = config.model_type
    weights, adapter, precision = options.torch_dtype, options.adapter, options.precision
    if options.parallel.sharded and options.precision != "fp32":  # FSDP's mixed precision policy gathers every
        weights = options.precision  # parameter in param_dtype, the adapters' too; DeepSpeed holds the model
        adapter = adapter and replace(adapter, autocast_dtype=False)  # in it and runs without autocast
        precision = "fp32" if options.parallel.zero else precision
    # FSDP's mixed precision gathers the weights prepare_model_for_kbit_training upcast in param_dtype
    prepared = options.prepare_kbit and not (options.parallel.sharded and options.precision != "fp32")
    plan = WeightPlan(TORCH_DTYPES[weights], adapter, options.quantization, prepared)
    t = Tape(precision, plan.torch_dtype, plan, grad=grad)
    if trl_head is not None:
        t.trl_head = (trl_head, shape.batch_size)
    if options.parallel.fsdp and options.parallel.fsdp_version == 2 and t.low and mt not in UNWRAPPED:
        t.cast_inputs = t.low  # the mixed precision policy's cast_forward_inputs
    if plan.active:
        t.linear_hook = adapted.linear
        t.input_grads = grad and options.gradient_checkpointing  # transformers' checkpointing enables input gradients
    b, s, tg = shape.batch_size, shape.input_len, shape.target_len
    if family == "encoder-decoder":
        fn = seq2seq.trace_t5 if mt in seq2seq.T5_TYPES else seq2seq.trace_bart
        fn(t, config, b, _need(s, "input_len"), _need(tg, "target_len"), options, shape.padding)
    elif family == "decoder-only":
        decoder.trace(t, config, b, _need(s, "input_len"), options, shape.padding)
    elif family == "encoder-only":
        encoder.trace(t, config, b, _need(s, "input_len"), options, shape.padding, head)
    elif family == "speech-encoder":
        audio.trace_wav2vec2(t, config, b, _need(s, "input_len"), tg or 1, options, shape.padding)
    else:
        frames = 2 * config.max_source_positions
        if s not in (None, frames):
            raise ValueError(f"Whisper takes exactly {frames} mel frames (2 x max_source_positions): its feature "
                             "extractor pads or cuts every clip to that; leave input_len None")
        audio.trace_whisper(t, config, b, frames, _need(tg, "target_len"), options, shape.padding)
    if options.adapter is not None and not t.adapted:
        _no_target(options.adapter, t.linears)
    params = _distinct(t)
    trained = [p for p in params if p.trainable and p.used]
    return Trace(t, sum(p.numel for p in params), sum(p.numel for p in params if p.trainable),
                 sum(p.numel for p in trained), len(trained), tuple(t.adapted), mt, _hidden(config))


def _hidden(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "hidden_size", None) or getattr(text, "d_model", None)


def _distinct(t: Tape) -> list:
    return list({id(p): p for p in t.params.values()}.values())


def _no_target(lora, linears: list) -> None:
    """peft's "Target modules ... not found in the base model", with the names that would match."""
    suffixes = sorted({name.rsplit(".", 1)[-1] for name in linears})
    targets = lora.targets[0] if lora.regex else ", ".join(lora.targets)
    raise AdapterError(f"target_modules ({targets}) match no linear layer of this model; its linear layers end "
                       f"with: {', '.join(suffixes)}")


def _need(value, name):
    if value is None:
        raise ValueError(f"this model's shape needs {name}")
    return value


def state_terms(tr: Trace, options: MemoryOptions, sharded: Sharding | None = None) -> dict:
    """Bytes live before the step: weights, optimizer state, batch, buffers (and gradients when accumulating)."""
    t = tr.tape
    trained = tr.trained_params
    terms = {"weights": tr.weight_bytes, "optimizer_state": optimizers.state_bytes(options.optimizer, trained),
             "batch": 0, "buffers": 0}
    for s in t.storages:
        if s.held and s.kind in ("batch", "buffers"):
            terms[s.kind] += s.nbytes
    if options.gradient_accumulation_steps > 1:
        terms["gradients"] = sum(p.nbytes for p in trained)
    terms.update(rank_terms(trained, options.parallel))
    if options.parallel.sharded:
        del terms["weights"], terms["optimizer_state"]
        terms.update((sharded or sharding(tr, options)).state(options.optimizer))
    return terms


def sharding(tr: Trace, options: MemoryOptions) -> Sharding | None:
    """FSDP's or ZeRO's gathers and reduces for this step (None for one device or DDP)."""
    if options.parallel.zero:
        return Zero(tr, options.parallel, options, tr.hidden)
    return Sharding(tr, options.parallel, options) if options.parallel.fsdp else None


def optimizer_temporaries(tr: Trace, options: MemoryOptions, sharded: Sharding | None = None) -> int:
    """Bytes the optimizer step allocates beyond its state (see optimizers.py)."""
    if options.parallel.sharded:
        return (sharded or sharding(tr, options)).optimizer_temporaries(options.optimizer)
    return optimizers.temporaries(options.optimizer, tr.trained_params)


def phases(config, shape: Shape, options: MemoryOptions = MemoryOptions(),
           log: list | None = None) -> tuple[Trace, dict, list[Phase]]:
    """The traced step, its state terms and the peak of each phase (``log``: see ``timeline.replay``)."""
    tr = trace(config, shape, options)
    sharded = sharding(tr, options)
    base = state_terms(tr, options, sharded)
    return tr, base, replay(tr.tape, base, optimizer_temporaries(tr, options, sharded), log=log, units=sharded)
