"""``lengthscan.clean``: decide every row, then write a training-ready dataset with nothing lost.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from lengthscan.engines.audit import BATCH_ROWS
from lengthscan.engines.loop import measure_split
from lengthscan.engines.results import (
    CleanResult,
    audit_result,
    clean_extra,
    decisions_dict,
    publish_clean,
    simulate_batches,
)
from lengthscan.engines.setup import prepare_with_rules, resolve_for
from lengthscan.measure.batch import ColumnError, check_columns
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.opener import open_source
from lengthscan.sources.sampling import plan_sample
from lengthscan.stats.tally import SplitTally
from lengthscan.write.clean_rows import SecondPass

#: Files and folders ``clean`` writes into ``--out``.
CLEAN_FILES = {"dataset", "rejects", "lengths.parquet", "report.json", "report.html"}


def clean(source, *, out, tokenizer=None, input: str | None = None, target: str | None = None,
          audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
          split: str | None = None, limits=(), action: str = "drop", keep_empty_targets: bool = False,
          crop_audio: bool = False, fail_over=None, length_column: str | None = "length",
          length_from: str | None = None, embed_audio: bool = False, tokenize: bool = False,
          overwrite: bool = False, format: str = "arrow",
          cache: bool = True, max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS,
          redact: bool = False, num_proc: int = 1, decide_only: bool = True, progress=None,
          command: str | None = None) -> CleanResult:
    """Decide every row of ``source`` by ``limits`` and write the result to ``out``.

    Options as ``audit``; ``action`` is what rows over an upper token limit get (drop or
    truncate). ``length_column`` (None: none) is filled from ``length_from`` (default
    ``input_tokens``, or ``input_samples`` for audio) after truncation. With ``fail_over``, a
    source where more rows would be dropped or truncated publishes nothing (``gate_failed``).
    ``tokenize`` adds ``input_ids``/``attention_mask`` (and ``labels`` for a target) to the
    dataset: the tokenizer's own ``__call__`` on the final texts, checked against their lengths.
    With only numeric upper limits on ``input_tokens`` (no percentile, z-score or ratio rule, no
    ``tokenize``, no explicit ``length_from``), ``decide_only`` counts inputs only as far as each
    decision needs (see ``bounds.py``): same decisions, no ``length`` column.
    ``format`` "parquet" writes ``dataset/`` and ``rejects/`` as Parquet shards (see ``parquet_out``).
    """
    from lengthscan.write.parquet import check_format
    from lengthscan.write.staging import OutputError, staging_dir

    check_format(format)
    started = time.perf_counter()
    rules, gate_spec, setup = prepare_with_rules(limits, fail_over, tokenizer=tokenizer, input=input,
                                                 target=target, audio=audio, model=model,
                                                 sampling_rate=sampling_rate, max_chars=max_chars)
    final = Path(out)
    if final.exists() and not overwrite:
        raise OutputError(f"{final}: exists; clean never touches an existing directory without --overwrite")
    src = open_source(source, split=split)
    check_columns(src, setup.fields)
    explicit_length = length_from is not None or length_column != "length"  # a length column asked for
    length_from = _length_source(setup, length_column, length_from, src)
    if tokenize:
        _check_tokenize(setup, src)
    decide_limits = _decide_only(rules, setup, action, tokenize, explicit_length, decide_only)
    if decide_limits:
        from dataclasses import replace

        setup = replace(setup, decide_limits=decide_limits)
        if length_from == "input_tokens":
            length_from = None  # exact lengths of every row are what decide-only skips

    tmp = staging_dir(final)
    options = dict(keep_empty_targets=keep_empty_targets, length_column=length_column, length_from=length_from,
                   embed_audio=embed_audio, tokenize=tokenize, redact=redact, batch_rows=batch_rows,
                   progress=progress)
    try:
        if all(r.kind in ("number", "model") for r in rules):
            # every threshold is known before any row is measured: one pass reads, measures,
            # decides and writes each batch (the source is read once, never tokenized twice)
            resolved, basis = resolve_for(rules, src, None, setup, action, crop_audio)
            writer = SecondPass(src, setup, resolved, tmp, final, **{**options, "progress": None})
            writer.output_format = format
            audit = _single_pass(src, setup, rules, writer, cache=cache, batch_rows=batch_rows, progress=progress,
                                 command=command, num_proc=num_proc)
            dtallies, after, after_tallies = writer.finish()
        else:
            audit, tallies, plans = _measure_all(src, setup, rules, tmp, cache=cache, batch_rows=batch_rows,
                                                 progress=progress, command=command, num_proc=num_proc)
            resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
            writer = SecondPass(src, setup, resolved, tmp, final, **options)
            writer.output_format = format  # dataset/ and rejects/ as Arrow (save_to_disk) or Parquet shards
            dtallies, after, after_tallies = writer.run(plans)
        extra = {"batches": simulate_batches(src, after_tallies, setup, 0, of="cleaned dataset"),
                 "worst_rows": tuple(writer.worst.rows())}
        decisions = decisions_dict(resolved, basis, action, dtallies, fail_over, gate_spec,
                                   **clean_extra(length_column, length_from, embed_audio, decide_limits,
                                                 _proofs(setup)))
        return publish_clean(audit, decisions, after, final, tmp, extra, started=started, redact=redact)
    except BaseException:
        _remove(tmp)
        raise


def _single_pass(src, setup, rules, writer: SecondPass, *, cache, batch_rows, progress, command, num_proc=1):
    """Measure every row and hand each batch, with its lengths, straight to ``writer``."""
    import pyarrow as pa

    from lengthscan.engines.results import simulation_positions
    from lengthscan.write.lengths import lengths_batch, lengths_schema

    multi = any(s.multi_file for s in src.splits)
    schema = lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi,
                            bounded=tuple(setup.decide_limits))
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))
    splits, cached, tallies = [], [], []
    for split_src in src.splits:
        plan = plan_sample(split_src.num_rows, full=True)
        tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, 0))
        state = writer.open_split(split_src, plan)

        def write(batch, measured, split_src=split_src, state=state):
            located = split_src.locate(batch.rows) if split_src.multi_file else None
            rows = lengths_batch(schema, batch.rows, split=split_src.name if src.has_splits else None,
                                 located=located, measured=measured)
            ids = {role: m.ids for role, m in measured.items() if m.ids is not None}
            writer.write_batch(state, batch, pa.Table.from_batches([rows]), ids=ids or None)

        cached += measure_split(split_src, plan, setup, tally, cache=cache, batch_rows=batch_rows,
                                output=SimpleNamespace(lengths=None), progress=progress,
                                with_split=src.has_splits, num_proc=num_proc, columns=split_src.column_names,
                                on_batch=write, with_ids=writer.tokenize)
        writer.close_split(state)
        splits.append(tally.split_audit(split_src.name, plan, 0))
        tallies.append(tally)
    return audit_result(src, setup, splits, tallies, seed=0, command=command, cache_hits=len(cached),
                        tokenizer=setup.counter.info(cached=set(cached)) if setup.counter else None)


def _measure_all(src, setup, rules, tmp: Path, *, cache, batch_rows, progress, command, num_proc=1):
    """First pass: every row measured into ``.measured.parquet``; statistics per split."""
    from lengthscan.write.lengths import LengthsWriter, lengths_schema

    multi = any(s.multi_file for s in src.splits)
    schema = lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi,
                            bounded=tuple(setup.decide_limits))
    sink = SimpleNamespace(lengths=LengthsWriter(tmp / ".measured.parquet", schema))
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))
    splits, cached, tallies, plans = [], [], [], []
    from lengthscan.engines.results import simulation_positions

    for split_src in src.splits:
        plan = plan_sample(split_src.num_rows, full=True)
        tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, 0))
        cached += measure_split(split_src, plan, setup, tally, cache=cache, batch_rows=batch_rows, output=sink,
                                progress=progress, with_split=src.has_splits, num_proc=num_proc)
        splits.append(tally.split_audit(split_src.name, plan, 0))
        tallies.append(tally)
        plans.append(plan)
    sink.lengths.close()
    audit = audit_result(src, setup, splits, tallies, seed=0, command=command, cache_hits=len(cached),
                         tokenizer=setup.counter.info(cached=set(cached)) if setup.counter else None)
    return audit, tallies, plans


def _length_source(setup, length_column, length_from, src) -> str | None:
    """Which measurement fills the length column (None: no column); refuse to overwrite one."""
    if not length_column or length_from == "none":
        return None
    measured = [s.name for s in setup.specs]
    if length_from is None:
        length_from = next((m for m in ("input_tokens", "input_samples", "input_frames") if m in measured), None)
        if length_from is None:
            return None
    if length_from not in measured:
        raise ColumnError(f"--length-from {length_from}: not measured here; measured: {', '.join(measured)}")
    for split_src in src.splits:
        if length_column in split_src.column_names:
            raise ColumnError(f"{src.spec}: already has a {length_column!r} column; it is not overwritten: "
                              f"choose --length-column NAME or --length-from none")
    return length_from


TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels")


def _decide_only(rules, setup, action, tokenize, explicit_length, wanted) -> dict:
    """role -> limit when decide-only counting applies: numeric upper input-token limits only
    (with any other rule, the written dataset keeps its exact ``length`` column by default)."""
    if not wanted or tokenize or explicit_length or not rules or action != "drop":
        return {}
    caps = []
    for r in rules:
        if r.metric != "input_tokens" or not r.upper or r.kind not in ("number", "model") or r.action == "truncate":
            return {}
        if r.kind == "number":
            caps.append(float(r.value) if r.op == "<=" else float(r.value) - 1e-9)
        else:
            limit = setup.model_limits.get("input_tokens") if setup.model_limits else None
            if limit is None:
                return {}
            caps.append(float(limit.value) if r.op == "<=" else float(limit.value) - 1e-9)
    import math

    return {"input": math.floor(min(caps))}


def _proofs(setup) -> dict:
    counter = setup.counter
    return {role: (counter._bounds.get(role).to_dict() if counter._bounds.get(role) else None)
            for role in setup.decide_limits}


def _check_tokenize(setup, src) -> None:
    if setup.counter is None:
        raise ColumnError("--tokenize needs a text column (--input and/or --target) and a tokenizer")
    for split_src in src.splits:
        clash = [c for c in TOKEN_COLUMNS if c in split_src.column_names]
        if clash:
            raise ColumnError(f"{src.spec}: already has {', '.join(clash)}; --tokenize would overwrite them")


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
