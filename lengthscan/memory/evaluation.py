"""The evaluation loop: what ``Trainer.evaluate`` adds to device memory while the training state stays resident.

Per evaluation batch, in dataset order (the Trainer's sequential sampler), as ``evaluation_loop`` and
``prediction_step`` run it on the installed transformers (5.x):

1. a forward pass under ``torch.no_grad`` (``model.eval()``: no dropout, no autograd graph, no
   gradient checkpointing; the Trainer sets ``use_cache=False``, so no KV cache): the tape traced
   with ``grad=False``, every activation freed at its last use; autocast's weight casts are still
   cached until the forward returns (the weights keep ``requires_grad``);
2. with mixed precision, accelerate's ``convert_outputs_to_fp32``: a low-precision output (the
   logits) copied to fp32 while both exist;
3. the outputs the Trainer keeps (``logits``: every model output but the loss; labels; the loss
   repeated ``eval_batch_size`` times), optionally ``preprocess_logits_for_metrics`` (argmax: the
   logits' (rows, length) int64 indices);
4. ``EvalLoopContainer.add``: the first batch is kept as is, each later one concatenated to what is
   held (``torch_pad_and_concatenate``: padded with -100 to the longest length so far), a new tensor
   allocated while the old one and the new batch live; the new batch's own tensors stay referenced by
   the loop's locals until the next ``prediction_step`` returns;
5. every ``eval_accumulation_steps`` batches, everything held is moved to the host (and the locals
   deleted); without it, every batch's predictions stay on the device until the loop ends.

The training state is resident throughout: weights, optimizer state, buffers; gradients are None
(``zero_grad(set_to_none=True)``). ``prediction_loss_only`` (the Trainer's default when it has no
``compute_metrics``) keeps only the losses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from lengthscan.memory import generation
from lengthscan.memory.families import family_of, resolve_head
from lengthscan.memory.generation import Generation
from lengthscan.memory.model import state_terms, trace
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.tape import BYTES
from lengthscan.memory.timeline import replay

RESIDENT = ("weights", "optimizer_state", "buffers")


@dataclass(frozen=True)
class EvalOptions:
    """``Trainer.evaluate``'s arguments that decide its memory.

    ``batch_size``: ``per_device_eval_batch_size``. ``accumulation_steps``: ``eval_accumulation_steps``
    (None: predictions stay on the device until the end). ``prediction_loss_only``: keep only the
    loss (also what the Trainer does without ``compute_metrics``). ``argmax_logits``:
    ``preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1)`` (the first output's).
    ``predict_with_generate``, ``generation_max_length``, ``num_beams``: ``Seq2SeqTrainer``'s
    generation (``generation.py``; None: the model's ``max_length``, 20 by default).
    """

    batch_size: int
    accumulation_steps: int | None = None
    prediction_loss_only: bool = False
    argmax_logits: bool = False
    predict_with_generate: bool = False
    generation_max_length: int | None = None
    num_beams: int = 1

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError("eval batch_size must be at least 1")
        if self.accumulation_steps is not None and self.accumulation_steps < 1:
            raise ValueError("eval accumulation_steps must be at least 1")
        if self.num_beams < 1:
            raise ValueError("num_beams must be at least 1")
        if self.generation_max_length is not None and self.generation_max_length < 1:
            raise ValueError("generation_max_length must be at least 1")
        if not self.predict_with_generate and (self.generation_max_length is not None or self.num_beams != 1):
            raise ValueError("generation_max_length and num_beams apply with predict_with_generate only")
        if self.predict_with_generate and self.argmax_logits:
            raise ValueError("predict_with_generate keeps generated tokens, not logits: argmax_logits does not apply")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Part:
    """One tensor the loop keeps: ``rows`` x ``length`` (None: a fixed second dimension) x ``width``."""

    rows: int
    length: int | None
    width: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.rows * (self.length or 1) * self.width * self.itemsize

    def concat(self, new: Part) -> Part:
        """``torch_pad_and_concatenate``: rows added, the length padded to the longest so far."""
        length = None if self.length is None else max(self.length, new.length)
        return Part(self.rows + new.rows, length, self.width, self.itemsize)


@dataclass(frozen=True)
class EvalStep:
    """One batch's no-grad forward pass and what the loop keeps of it."""

    forward_peak: int
    forward_terms: dict
    batch_bytes: int
    outputs: tuple  # Parts as the model returns them (their dtype)
    preds: tuple  # Parts as kept (fp32 after accelerate's conversion, or the argmax indices)
    labels: Part | None
    losses: Part
    convert_bytes: int  # fp32 copies of low-precision outputs
    argmax_bytes: int
    generate: Generation | None = None  # predict_with_generate: model.generate's peak before the loss forward


def eval_step(config, shape: Shape, options: MemoryOptions, evo: EvalOptions) -> EvalStep:
    """The forward pass of one evaluation batch of ``shape`` and the tensors the loop keeps."""
    eval_opts = replace(options, gradient_checkpointing=False, gradient_accumulation_steps=1)
    tr = trace(config, shape, eval_opts, grad=False)
    base = state_terms(tr, eval_opts)
    fwd = replay(tr.tape, base, 0)[0]
    b = shape.batch_size
    outputs = tuple(_layout(config, shape, eval_opts, i, o.numel, BYTES[o.dtype])
                    for i, o in enumerate(tr.tape.outputs))
    converted = tuple(replace(p, itemsize=4) if p.itemsize == 2 else p for p in outputs)
    convert_bytes = sum(c.nbytes for p, c in zip(outputs, converted) if p.itemsize == 2)
    preds, argmax_bytes = converted, 0
    if evo.prediction_loss_only:
        preds = ()
    elif evo.argmax_logits and outputs:
        preds = (Part(b, converted[0].length, 1, 8),)
        argmax_bytes = preds[0].nbytes
    labels = None if evo.prediction_loss_only else _labels(config, shape, eval_opts)
    generate = None
    if evo.predict_with_generate and not evo.prediction_loss_only:
        generate, preds, labels = _generate(config, shape, options, evo, tr.tape)
    return EvalStep(fwd.peak, dict(fwd.terms), base["batch"], outputs, preds, labels, Part(evo.batch_size, None, 1, 4),
                    convert_bytes, argmax_bytes, generate)


def _generate(config, shape: Shape, options: MemoryOptions, evo: EvalOptions, tape) -> tuple:
    """``generate``'s peak (above the resident state and the batch) and the int64 predictions and labels
    ``prediction_step`` returns, both padded to the model's ``max_length`` when shorter."""
    enc_opts = generation.encoder_options(options)
    tr = trace(config, Shape(shape.batch_size, shape.input_len, 1, shape.padding), enc_opts, grad=False)
    base = state_terms(tr, enc_opts)
    enc = replay(tr.tape, base, 0)[0]
    encoder_pass = enc.peak - sum(base.values())
    pad = generation.model_max_length(config)
    length = evo.generation_max_length or pad
    copies = generation.decoder_weight_copies(tape, tape.low)
    gen = generation.generation_peak(config, shape, options, length, evo.num_beams, encoder_pass, copies)
    b = shape.batch_size
    return gen, (Part(b, max(length, pad), 1, 8),), Part(b, max(shape.target_len or 1, pad), 1, 8)


def _layout(config, shape: Shape, options: MemoryOptions, index: int, numel: int, itemsize: int) -> Part:
    """Output ``index`` (0: the logits; 1: the encoder's last hidden state) as (rows, length, width)."""
    b, family = shape.batch_size, family_of(config)
    head = resolve_head(config, options.head)
    if index == 0:
        if head == "classification":
            return Part(b, None, numel // b, itemsize)
        if family in ("encoder-decoder", "speech-seq2seq"):
            length = shape.target_len
        elif head == "ctc":  # frames after the feature encoder
            length = numel // b // config.vocab_size
        else:
            length = shape.input_len
    else:
        length = numel // b // config.d_model
    return Part(b, length, numel // b // length, itemsize)


def _labels(config, shape: Shape, options: MemoryOptions) -> Part:
    head = resolve_head(config, options.head)
    b = shape.batch_size
    if head == "classification":
        return Part(b, None, 1, 8)
    if family_of(config) in ("encoder-decoder", "speech-seq2seq") or head == "ctc":
        return Part(b, shape.target_len or 1, 1, 8)
    return Part(b, shape.input_len, 1, 8)


@dataclass(frozen=True)
class EvalEstimate:
    """The peak of an evaluation loop over ``steps`` batches, and where it breaks a budget."""

    peak_bytes: int
    peak_step: int
    moment: str  # "forward" | "fp32_outputs" | "argmax" | "concat"
    terms: dict
    step_peaks: tuple
    held_bytes: tuple  # predictions held on the device after each step
    breaking_step: int | None  # first step whose peak is past the budget (None: fits, or no budget)
    rows: int

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "peak_step": self.peak_step, "moment": self.moment,
                "terms": dict(self.terms), "steps": len(self.step_peaks), "rows": self.rows,
                "held_bytes_end": self.held_bytes[-1] if self.held_bytes else 0,
                "breaking_step": self.breaking_step}


def evaluate_loop(config, shapes, options: MemoryOptions, evo: EvalOptions,
                  usable_bytes: int | None = None) -> EvalEstimate:
    """Replay the evaluation loop over ``shapes`` (each batch's, in order); each distinct shape traced once."""
    memo: dict[Shape, EvalStep] = {}
    held = {"preds": None, "labels": None, "losses": None}  # the containers: a tuple of Parts, or None
    loose = 0  # the previous batch's locals, when not the containers' own tensors
    best, peaks, helds, breaking, rows = None, [], [], None, 0

    def total(parts) -> int:
        return sum(p.nbytes for p in parts) if parts else 0

    for k, shape in enumerate(shapes):
        step = memo.get(shape) or memo.setdefault(shape, eval_step(config, shape, options, evo))
        rows += shape.batch_size
        resident = {key: v for key, v in step.forward_terms.items() if key in RESIDENT}
        kept = sum(total(v) for v in held.values())
        moments = [("forward", {**step.forward_terms, "eval_predictions_held": kept + loose})]
        if step.generate is not None:
            moments.append((f"generate: {step.generate.moment}", {
                **resident, "batch": step.batch_bytes, "eval_predictions_held": kept + loose,
                **step.generate.terms}))
        out_bytes = total(step.outputs)
        after = {**resident, "batch": step.batch_bytes, "eval_predictions_held": kept + loose}
        if step.convert_bytes:
            moments.append(("fp32_outputs", {**after, "eval_outputs": out_bytes + step.convert_bytes}))
        outputs_now = total(_converted(step)) if step.preds or evo.argmax_logits else 0
        labels_now = step.labels.nbytes if step.labels else 0
        after = {**resident, "eval_predictions_held": kept}  # the previous locals are rebound now
        if step.argmax_bytes:
            moments.append(("argmax", {**after, "eval_outputs": outputs_now + labels_now + step.argmax_bytes}))
        new = {"losses": (step.losses,), "preds": step.preds, "labels": (step.labels,) if step.labels else ()}
        current = total(new["losses"]) + total(new["preds"]) + total(new["labels"])
        fresh = 0
        for name in ("losses", "preds", "labels"):  # the Trainer's order
            if not new[name]:
                continue
            if held[name] is None:
                held[name] = new[name]
                fresh += total(new[name])
                continue
            merged = tuple(a.concat(b) for a, b in zip(held[name], new[name]))
            kept_now = sum(total(v) for v in held.values())
            moments.append(("concat", {**after, "eval_predictions_held": kept_now - fresh,
                                       "eval_outputs": current, "eval_concat": total(merged)}))
            held[name] = merged
        kept = sum(total(v) for v in held.values())
        loose = current - fresh
        if evo.accumulation_steps is not None and (k + 1) % evo.accumulation_steps == 0:
            held = dict.fromkeys(held)
            kept = loose = 0
        name, terms = max(moments, key=lambda m: sum(m[1].values()))
        peak = sum(terms.values())
        peaks.append(peak)
        helds.append(kept + loose)
        if best is None or peak > best[0]:
            best = (peak, k, name, {t: v for t, v in terms.items() if v})
        if breaking is None and usable_bytes is not None and peak > usable_bytes:
            breaking = k
    if best is None:
        raise ValueError("the evaluation set has no rows")
    return EvalEstimate(best[0], best[1], best[2], best[3], tuple(peaks), tuple(helds), breaking, rows)


def _converted(step: EvalStep) -> tuple:
    return tuple(replace(p, itemsize=4) if p.itemsize == 2 else p for p in step.outputs)


def eval_shapes(lengths, batch_size: int, *, targets=None, pad_to_multiple_of: int | None = None) -> list[Shape]:
    """Batches of ``batch_size`` rows in dataset order, each padded to its longest row (as the collators pad)."""
    out = []
    n = len(lengths)
    for start in range(0, n, batch_size):
        chunk = list(lengths[start:start + batch_size])
        tchunk = list(targets[start:start + batch_size]) if targets is not None else None
        s, padding = _pad(chunk, pad_to_multiple_of)
        tg = None
        if tchunk is not None:
            tg, tpad = _pad(tchunk, pad_to_multiple_of)
            padding = padding or tpad
        out.append(Shape(len(chunk), s, tg, padding))
    return out


def _pad(chunk, multiple):
    longest = max(int(x) for x in chunk)
    padded = -(-longest // multiple) * multiple if multiple else longest
    return padded, any(int(x) < padded for x in chunk)


#: what the report's ``alternatives`` try, each against the options given
ALTERNATIVES = (("eval_accumulation_steps=1", {"accumulation_steps": 1}), ("argmax_logits", {"argmax_logits": True}),
                ("prediction_loss_only", {"prediction_loss_only": True}))


def shape_mode_batches(batch_size: int, rows: int, input_len: int | None, target_len: int | None) -> list[Shape]:
    """``rows`` rows of one padded shape in batches of ``batch_size`` (the last one short)."""
    full, rest = divmod(rows, batch_size)
    shapes = [Shape(batch_size, input_len, target_len)] * full
    return shapes + ([Shape(rest, input_len, target_len)] if rest else [])


def report(config, shapes, options: MemoryOptions, evo: EvalOptions, usable_bytes: int | None = None,
           rebatch=None) -> dict:
    """``report.json["memory"]["evaluation"]``: the loop's peak, its terms, where it breaks the budget, and what
    each alternative (accumulation every batch, argmax logits, loss only, half the batch size) changes.

    ``rebatch(batch_size)``: the same rows in batches of ``batch_size`` (None: no smaller-batch alternative)."""
    shapes = list(shapes)
    est = evaluate_loop(config, shapes, options, evo, usable_bytes)
    out = {**est.to_dict(), "options": evo.to_dict(), "batches": len(shapes)}
    if evo.predict_with_generate:
        out["generation"] = generation_words(evo.to_dict())
    broken = est.breaking_step
    out["breaking_rows"] = None if broken is None else sum(s.batch_size for s in shapes[:broken + 1])
    peaks = list(est.step_peaks)
    out["per_step_peak_bytes"] = peaks if len(peaks) <= 10_000 else {"steps": len(peaks), "max": max(peaks)}
    out["fits"] = None if usable_bytes is None else est.peak_bytes <= usable_bytes
    tries = []
    for name, change in ALTERNATIVES:
        if evo.prediction_loss_only or all(getattr(evo, k) == v for k, v in change.items()):
            continue  # loss only keeps nothing the others would change
        if evo.predict_with_generate and name == "argmax_logits":
            continue  # generation keeps tokens, not logits
        tries.append((name, shapes, replace(evo, **change)))
    if rebatch is not None and evo.batch_size > 1:
        half = evo.batch_size // 2
        tries.append((f"eval_batch_size={half}", list(rebatch(half)), replace(evo, batch_size=half)))
    alternatives = {}
    for name, alt_shapes, alt_evo in tries:
        alt = evaluate_loop(config, alt_shapes, options, alt_evo, usable_bytes)
        alternatives[name] = {"peak_bytes": alt.peak_bytes, "saves_bytes": est.peak_bytes - alt.peak_bytes,
                              "breaking_step": alt.breaking_step,
                              "fits": None if usable_bytes is None else alt.peak_bytes <= usable_bytes}
    out["alternatives"] = alternatives
    # the first that fits, in the order of what each costs the run: a host copy, the metrics' inputs, the metrics,
    # then more evaluation steps
    out["cheapest"] = next((name for name, a in alternatives.items() if a["fits"]), None) if out["fits"] is False \
        else None
    return out


def summary_lines(ev: dict) -> list[str]:
    """A few terminal lines for :func:`report`'s dict (batch numbers from 0, as data mode's)."""
    from lengthscan.report.fmt import size

    lines = [f"evaluation ({ev['steps']:,} batches, {ev['rows']:,} rows): peak {size(ev['peak_bytes'])} at batch "
             f"#{ev['peak_step']} ({ev['moment']}); {size(ev['held_bytes_end'])} of predictions on the device "
             "at the end"]
    gen = generation_words(ev["options"])
    if gen:
        lines.append(f"  {gen}")
    if ev["breaking_step"] is not None:
        lines.append(f"  breaks the budget at batch #{ev['breaking_step']} (after {ev['breaking_rows']:,} rows)")
    elif ev["fits"] is not None:
        lines.append("  fits the budget")
    alts = [f"{name}: {size(a['peak_bytes'])}" for name, a in ev["alternatives"].items()]
    if alts:
        lines.append("  instead, " + "; ".join(alts))
    if ev.get("cheapest"):
        lines.append(f"  cheapest change that fits: {ev['cheapest']} (peak "
                     f"{size(ev['alternatives'][ev['cheapest']]['peak_bytes'])})")
    return lines


def generation_words(evo: dict) -> str:
    """What ``predict_with_generate`` is priced as, in words ("" without it)."""
    if not evo.get("predict_with_generate"):
        return ""
    length = evo.get("generation_max_length")
    beams = evo.get("num_beams", 1)
    return (f"predict_with_generate: every row generates to {length or 'the model max_length'} tokens with "
            f"{beams} beam{'s' if beams != 1 else ''} (the worst case: no row ends early)")
