"""The peak of one training step: trace the family's forward pass, add the state, replay the phases."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.memory import audio, decoder, encoder, seq2seq
from lengthscan.memory.families import family_of, resolve_head
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.sizes import check_sizes
from lengthscan.memory.tape import BYTES, Tape
from lengthscan.memory.timeline import Phase, replay


@dataclass(frozen=True)
class Trace:
    """A traced step: the tape and the counts the state is made of."""

    tape: Tape
    params: int
    trainable: int
    trained: int  # trainable parameters the forward pass uses: only these get gradients and state
    tensors_trained: int


def trace(config, shape: Shape, options: MemoryOptions = MemoryOptions(), *, grad: bool = True) -> Trace:
    """Run the family's forward pass for ``shape`` on a tape (the config's sizes checked first);
    ``grad=False``: under ``torch.no_grad`` (evaluation), nothing kept for backward."""
    check_sizes(config)
    head = resolve_head(config, options.head)
    family = family_of(config)
    t = Tape(options.precision, grad=grad)
    b, s, tg = shape.batch_size, shape.input_len, shape.target_len
    mt = config.model_type
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
    params = list({id(p): p for p in t.params.values()}.values())
    trained = [p for p in params if p.trainable and p.used]
    return Trace(t, sum(p.numel for p in params), sum(p.numel for p in params if p.trainable),
                 sum(p.numel for p in trained), len(trained))


def _need(value, name):
    if value is None:
        raise ValueError(f"this model's shape needs {name}")
    return value


def state_terms(tr: Trace, options: MemoryOptions) -> dict:
    """Bytes live before the step: weights, optimizer state, batch, buffers (and gradients when accumulating)."""
    t = tr.tape
    w = BYTES[t.weights]
    terms = {"weights": tr.params * w, "optimizer_state": 0, "batch": 0, "buffers": 0}
    if options.optimizer != "sgd":  # AdamW: exp_avg and exp_avg_sq like the weights, a step scalar a tensor
        terms["optimizer_state"] = 2 * tr.trained * w + 4 * tr.tensors_trained
    for s in t.storages:
        if s.held and s.kind in ("batch", "buffers"):
            terms[s.kind] += s.nbytes
    if options.gradient_accumulation_steps > 1:
        terms["gradients"] = tr.trained * w
    return terms


def optimizer_temporaries(tr: Trace, options: MemoryOptions) -> int:
    """Bytes the optimizer step allocates beyond its state."""
    w = BYTES[tr.tape.weights]
    if options.optimizer == "adamw_foreach":  # _foreach_sqrt(exp_avg_sqs): one buffer like every weight
        return tr.trained * w
    if options.optimizer == "adamw_loop":  # (exp_avg_sq.sqrt() / bias_correction2_sqrt) for one weight
        largest = max((p.numel for p in tr.tape.params.values() if p.trainable and p.used), default=0)
        return 2 * largest * w
    return 0  # fused AdamW updates in place; plain SGD adds the gradient in place


def phases(config, shape: Shape, options: MemoryOptions = MemoryOptions()) -> tuple[Trace, dict, list[Phase]]:
    """The traced step, its state terms and the peak of each phase."""
    tr = trace(config, shape, options)
    base = state_terms(tr, options)
    return tr, base, replay(tr.tape, base, optimizer_temporaries(tr, options))
