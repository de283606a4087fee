"""``lengthscan memory SRC``: the audit's full pass for every row's lengths, then an epoch priced by
the memory model: the worst batch, the per-batch peaks, the bound for any shuffle, and limits for
a budget. With ``out`` it writes the audit's files with a ``memory`` section in ``report.json``
and a memory panel in ``report.html``; ``export_worst_batch`` saves the worst batch's rows.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.memory import preference
from lengthscan.memory.api import load_config
from lengthscan.memory.budget import usable_bytes
from lengthscan.memory.data_eval import price_evaluation, read_lengths
from lengthscan.memory.epoch import Epoch, LayoutError, check_sampler, layout_for, price_epoch
from lengthscan.memory.families import family_of
from lengthscan.memory.options import MemoryOptions, Shape

if TYPE_CHECKING:
    from lengthscan.engines.records import AuditResult

#: Per-batch peaks listed one by one in ``report.json`` up to this many batches; beyond it, the
#: highest peak of every ``every`` consecutive batches.
PER_BATCH_LISTED = 10_000
#: Trainer's default ``args.seed``.
TRAINER_SEED = 42


@dataclass(frozen=True)
class MemoryPrediction:
    """What :func:`predict_dataset` returns: the audit, the priced epoch and ``report.json["memory"]``."""

    audit: AuditResult
    epoch: Epoch
    memory: dict

    @property
    def fits(self) -> bool | None:
        """The training's verdict (``memory["fits"]``), False when the evaluation does not fit either."""
        return False if (self.memory.get("evaluation") or {}).get("fits") is False else self.memory["fits"]

    def to_dict(self) -> dict:
        """``report.json``: the audit's dict with the ``memory`` section."""
        data = self.audit.to_dict()
        data["memory"] = self.memory
        return data


def predict_dataset(source, *, model, batch_size: int, input: str | None = None, target: str | None = None,
                    audio: str | None = None, tokenizer=None, sampling_rate: int | None = None,
                    split: str | None = None, options: MemoryOptions | None = None, sampler: str = "random",
                    seed: int = TRAINER_SEED, pad_to_multiple_of: int | None = None, budget_bytes: int | None = None,
                    margin: float = 0.1, out=None, overwrite: bool = False, export_worst_batch=None,
                    cache: bool = True, max_chars: int = DEFAULT_MAX_CHARS, num_proc: int | None = None, progress=None,
                    command: str | None = None, chat: dict | None = None, packing=None,
                    evaluation=None, allocator=None) -> MemoryPrediction:
    """Predict the peak memory of every batch of one training epoch of ``model`` on ``source``.

    Every row of the train split (else the first; ``split`` to choose) is measured by the audit
    (cached lengths reused); rows without a length are left out, as ``clean`` drops them. The
    epoch is ``Trainer.train()``'s epoch 0 with ``args.seed = seed`` and
    ``train_sampling_strategy = sampler``, in per-device batches of ``batch_size`` (gradient
    accumulation from ``options``). ``budget_bytes`` adds the verdict and limits that fit with
    ``margin``; ``out`` writes the audit's files with the memory section; ``export_worst_batch``
    saves the worst batch's source rows with ``save_to_disk``. ``chat`` (audit's conversation
    options: ``messages`` or ``prompt``/``completion``, ``tools``, ``chat_template``, ``train_on``)
    ``packing`` (``pack.run.PackingOptions``: strategy and ``max_length``) also prices the packed
    batches the strategy makes (``memory["packing"]``, see ``memory.packed``); the verdict is then theirs.
    measures conversations: a decoder-only model's input is the rendered sequence
    (``sequence_tokens``), and the limits found are stated on it. ``evaluation`` (``data_eval.EvalData``)
    prices ``Trainer.evaluate`` on another split or source (``memory["evaluation"]``; see ``memory.data_eval``).
    ``allocator`` (``alloc_conf.AllocatorConfig``; with ``budget_bytes`` the default one) replays the epoch's
    batches through the caching allocator model: reserved memory, modelled (``memory["allocator"]``).
    """
    from lengthscan.engines.api import audit
    from lengthscan.sources.opener import open_source
    from lengthscan.write.staging import OutputError, check_out_path, check_writable, discard, publish, staging_dir

    check_sampler(sampler)  # before the audit pass, not after it
    if packing is not None:
        packing.check()
        if export_worst_batch is not None:
            raise OutputError("--export-worst-batch saves rows of unpacked batches: drop it with --packing")
    options = options if options is not None else MemoryOptions()
    if not isinstance(batch_size, int) or batch_size < 1:
        raise LayoutError("--batch-size must be at least 1")
    if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
        raise LayoutError(f"--pad-to-multiple-of {pad_to_multiple_of!r}: give a whole number of at least 1")
    usable_bytes(budget_bytes or 0, margin)  # checks the margin
    config = load_config(model)
    family = family_of(config)  # an unsupported model type fails before anything is measured
    if options.objective.name != "trainer" and family != "decoder-only":
        raise LayoutError(f"--objective {options.objective.name} is priced for decoder-only models, not "
                          f"{config.model_type!r} ({family})")
    for path, flag in ((export_worst_batch, "--export-worst-batch"), (out, "--out")):
        if path is not None:
            check_out_path(path, flag)
    export = Path(export_worst_batch) if export_worst_batch is not None else None
    final = Path(out) if out is not None else None
    if export is not None and final is not None and _overlap(export, final):
        raise OutputError(f"--export-worst-batch {export} and --out {final} overlap: the one published last "
                          "would replace the other; choose two separate folders")
    src = open_source(source)
    for path, flag in ((export, "--export-worst-batch"), (final, "--out")):
        if path is not None:
            from lengthscan.engines.setup import source_paths
            from lengthscan.write.staging import check_apart

            try:
                check_apart(path, source_paths(source, src))
            except OutputError as exc:
                raise OutputError(str(exc).replace("--out", flag)) from None
    if export is not None and export.exists() and not (overwrite and _is_saved_dataset(export)):
        hint = "it is not a saved dataset, so --overwrite does not replace it" if overwrite else \
            "pass --overwrite to replace a dataset saved there"
        raise OutputError(f"{export}: exists; choose another --export-worst-batch ({hint})")
    if final is not None:
        check_writable(final, overwrite=overwrite)
    eval_at = evaluation.resolve(source) if evaluation is not None else None
    if split is None:
        names = [s.name for s in src.splits]
        split = "train" if "train" in names else names[0]
    if final is not None:
        work = staging_dir(final, recheck=lambda: check_writable(final, overwrite=overwrite))
    else:
        work = Path(tempfile.mkdtemp(prefix="lengthscan-memory-"))
    try:
        chat = {k: v for k, v in (chat or {}).items() if v is not None}
        packed = {} if packing is None else dict(
            packing=packing.packing, max_length=packing.max_length, packing_num_proc=packing.packing_num_proc,
            shuffle_seed=packing.shuffle_seed, batch_size=batch_size, grad_accum=options.gradient_accumulation_steps)
        measured_as = dict(tokenizer=tokenizer, input=input, target=target, audio=audio, model=model, seed=seed,
                           sampling_rate=sampling_rate, full=True, overwrite=True, cache=cache, max_chars=max_chars,
                           num_proc=num_proc, progress=progress, command=command, **chat)
        result = audit(source, split=split, out=work, **measured_as, **packed)
        rows, lengths, total = read_lengths(work / "lengths.parquet", split)
        lengths = preference.trainer_lengths(lengths, options, chat)
        layout = layout_for(config, pad_to_multiple_of=pad_to_multiple_of, **lengths)
        rows = rows[layout.known]
        epoch = price_epoch(config, layout, batch_size, options=options, sampler=sampler, seed=seed)
        measured = {n: a[layout.known] if n == "input_seconds" else a[layout.known].astype(np.int64)
                    for n, a in lengths.items()}
        memory = _memory_dict(epoch, rows, measured, model=str(model), options=options, sampler=sampler, seed=seed,
                              split=split, total=total, pad_to_multiple_of=pad_to_multiple_of)
        memory["over_model_limits"] = _over_limits(result)
        sequence = result.chat is not None or options.objective.name in ("dpo", "reward", "grpo")
        if options.objective.name != "trainer":
            from lengthscan.memory.api import objective_note
            from lengthscan.memory.objective import OBJECTIVES

            memory["objective"] = {"name": options.objective.name, "trainer": OBJECTIVES[options.objective.name],
                                   "reference": options.objective.reference_for(options.adapter),
                                   "note": objective_note(options)}
        memory["budget_bytes"], memory["margin"], memory["fits"], memory["limits"] = budget_bytes, margin, None, None
        if budget_bytes is not None:
            memory.update(_verdict(config, epoch, lengths, budget_bytes, margin, options, result))
            if sequence:  # the decoder's input is the conversation's (the pair's, the prompt's) sequence
                memory["limits"]["rules"] = [r.replace("input_tokens", "sequence_tokens")
                                             for r in memory["limits"]["rules"]]
            memory["limits"]["clean_command"] = clean_command(
                source, memory["limits"]["rules"], input=input, target=target, audio=audio, tokenizer=tokenizer,
                model=model, sampling_rate=sampling_rate, **chat)
        if allocator is not None or budget_bytes is not None:
            from lengthscan.memory.alloc_conf import AllocatorConfig
            from lengthscan.memory.reserved import epoch_report

            memory["allocator"] = epoch_report(config, epoch, options, allocator or AllocatorConfig(), budget_bytes,
                                               memory.get("usable_bytes"), sampler=sampler, seed=seed)
            memory["allocator"]["unpacked"] = packing is not None
        if sequence:  # its lengths and limits named as the sequence they are
            from lengthscan.memory.advice import as_sequence

            as_sequence(memory)
            if options.objective.name == "trainer":
                memory["objective_hint"] = ("priced as transformers' Trainer runs the step (the model's loss over "
                                            "the full logits); TRL's SFTTrainer uses its fused log-probability head "
                                            "instead: --objective sft")
        if eval_at is not None:
            memory["evaluation"] = price_evaluation(
                config, evaluation, eval_at, measured_as, options=options, pad_to_multiple_of=pad_to_multiple_of,
                usable=memory.get("usable_bytes"), train_source=source)
        if packing is not None:
            memory["packing"] = _packed(config, lengths, packing, batch_size, options, seed, memory)
        if export is not None:
            memory["export"] = export_rows(source, split, memory["worst_batch"]["rows"], export, overwrite=overwrite)
        prediction = MemoryPrediction(result, epoch, memory)
        if final is not None:
            from lengthscan.report.html import write_html
            from lengthscan.write.staging import write_json

            data = prediction.to_dict()
            write_json(work / "report.json", data)
            write_html(work / "report.html", data)
            publish(work, final)
        return prediction
    finally:
        if work.exists():
            discard(work)


def _memory_dict(epoch: Epoch, rows: np.ndarray, measured: dict, *, model: str, options: MemoryOptions,
                 sampler: str, seed: int, split: str, total: int, pad_to_multiple_of) -> dict:
    lay, worst, bound = epoch.layout, epoch.worst_estimate, epoch.any_shuffle_estimate
    members = epoch.batches[epoch.worst]
    sides = {k: v for k, v in (("input_len", lay.a_name), ("target_len", lay.b_name)) if v}
    arrays = ((lay.a_name, lay.a), (lay.b_name, lay.b))
    lengths = {name: arr[members].tolist() for name, arr in (*measured.items(), *arrays) if name and arr is not None}
    longest = {name: int(rows[int(np.argmax(arr))]) for name, arr in arrays if name}
    peaks = epoch.peaks
    return {
        "mode": "data", "model": model, "model_type": worst.model_type, "family": worst.family, "head": worst.head,
        "params": worst.params, "trainable_params": worst.trainable_params, "options": options.to_dict(),
        "run": dict(worst.run),
        "split": split, "rows": total, "simulated_rows": lay.rows, "left_out": total - lay.rows,
        "sampler": sampler, "seed": seed, "batch_size": epoch.batches.batch_size,
        "grad_accum": options.gradient_accumulation_steps, "pad_to_multiple_of": pad_to_multiple_of,
        "batches": len(epoch.batches), "sides": sides, "transformers": _version("transformers"),
        "peak_bytes": worst.peak_bytes, "phase": worst.phase, "terms": dict(worst.terms),
        "phase_peaks": dict(worst.phase_peaks), "notes": list(worst.notes),
        "worst_batch": {"index": epoch.worst, "rows": rows[members].tolist(), "shape": worst.shape,
                        "peak_bytes": worst.peak_bytes, "phase": worst.phase, "terms": dict(worst.terms),
                        "lengths": lengths},
        "any_shuffle": {"shape": epoch.any_shuffle.to_dict(), "peak_bytes": bound.peak_bytes, "phase": bound.phase,
                        "terms": dict(bound.terms), "rows": longest},
        "per_batch": {"batches": int(peaks.size), "exact": int(epoch.exact.sum()), "grid_bits": epoch.grid_bits,
                      **epoch.percentiles()},
        "per_batch_peak_bytes": _per_batch(peaks),
    }


def _over_limits(result) -> list[dict]:
    """Rows over the model's (or tokenizer's) own limits: it fails on them before memory does."""
    return [{"name": c["name"], "measure": c["measure"], "limit": c["limit"], "rows": c["over_in_measured"]}
            for s in result.to_dict()["splits"] for c in s.get("limits") or [] if c["over_in_measured"]]


def _per_batch(peaks: np.ndarray):
    """Every batch's peak, or past ``PER_BATCH_LISTED`` batches the highest of each run of ``every``."""
    if peaks.size <= PER_BATCH_LISTED:
        return peaks.tolist()
    every = -(-peaks.size // PER_BATCH_LISTED)
    padded = np.concatenate([peaks, np.full(-peaks.size % every, peaks.min())])
    return {"batches": int(peaks.size), "every": every, "max": padded.reshape(-1, every).max(axis=1).tolist()}


def _verdict(config, epoch: Epoch, lengths: dict, budget_bytes: int, margin: float, options, result) -> dict:
    """Whether the worst batch and the any-shuffle batch fit, and the limits that do."""
    from lengthscan.memory.advice import recommend_limits

    usable = usable_bytes(budget_bytes, margin)
    lay = epoch.layout
    caps = {}
    for lim in result.model.limits if result.model is not None else ():  # the model's own, else the tokenizer's
        side = {"input_tokens": "a" if lay.a_name in ("input_tokens", "input_tokens+target_tokens") else None,
                "target_tokens": "b" if lay.b_name == "target_tokens" else None}.get(lim.name)
        if side:
            caps[side] = min(caps.get(side, lim.value), int(lim.value))
    parts = None
    if lay.a_name == "input_tokens+target_tokens":
        parts = tuple(int(lengths[n][lay.known].max()) for n in ("input_tokens", "target_tokens"))
    rate = (result.audio or {}).get("sampling_rate")
    limits = recommend_limits(config, lay, epoch.batches.batch_size, budget_bytes, options=options, margin=margin,
                              caps=caps, sampling_rate=rate, parts=parts)
    fits = epoch.worst_estimate.peak_bytes <= usable
    out = {"usable_bytes": usable, "fits": fits, "any_shuffle_fits": epoch.any_shuffle_estimate.peak_bytes <= usable,
           "limits": limits}
    if not fits:  # what else makes the worst batch fit, each priced on it
        from lengthscan.memory.alternatives import alternatives

        out["alternatives"] = alternatives(config, Shape(**epoch.worst_estimate.shape), options, usable)
    return out


def clean_command(source, rules: list[str], **flags) -> str | None:
    """A ``lengthscan clean`` command line applying ``rules`` to ``source`` with the same fields."""
    import os
    import shlex

    if not rules:
        return None
    spec = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "SRC"
    args = ["lengthscan", "clean", spec]
    for name, value in flags.items():
        if isinstance(value, (str, os.PathLike, int)) and value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    for rule in rules:
        args += ["--limit", rule]
    return shlex.join([*args, "--out", "cleaned"])


def export_rows(source, split: str, rows: list[int], out: Path, *, overwrite: bool = False) -> str:
    """Save ``rows`` of ``split`` of ``source`` (in this order, every column) with ``save_to_disk``."""
    from lengthscan.sources.opener import open_source

    src = open_source(source, split=split)
    ds = src.splits[0].dataset().select(rows)
    ds.info.description = f"lengthscan memory: rows {rows} of split {split!r} of {src.spec} (the worst batch)"
    out = Path(out)
    if overwrite and _is_saved_dataset(out):
        shutil.rmtree(out)
    ds.save_to_disk(str(out))
    return str(out.resolve())


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _packed(config, lengths: dict, packing, batch_size: int, options, seed: int, memory: dict) -> dict:
    """The packed batches' prediction; with a budget, the verdict becomes theirs."""
    from dataclasses import replace

    from lengthscan.memory.packed import price_packed
    from lengthscan.pack.run import make_packs

    name = "sequence_tokens" if "sequence_tokens" in lengths else "input_tokens"
    values = np.nan_to_num(np.asarray(lengths[name], np.float64), nan=-1).astype(np.int64)
    packs = make_packs(values, packing.max_length, replace(packing, batch_size=batch_size))
    out = price_packed(config, packs, packing.packing, batch_size, options=options, seed=seed,
                       shuffle_seed=packing.shuffle_seed)
    out["unpacked_peak_bytes"] = memory["peak_bytes"]
    if memory.get("usable_bytes") is not None:
        out["fits"] = out["worst_batch"]["peak_bytes"] <= memory["usable_bytes"]
        memory["unpacked_fits"], memory["fits"] = memory["fits"], out["fits"]
    return out
