"""``lengthscan.clean``: decide every row, then write a training-ready dataset with nothing lost.

When every rule is absolute (a number, or the model's limit) and the engine's batches carry the
source's columns (the local engine), one pass: the measuring loop hands each measured batch to
``write.clean_writer.CleanWriter``, which decides each row, truncates the texts to truncate
(verified by re-tokenizing), crops, and writes kept and truncated rows to ``dataset/``, dropped
rows with their reasons to ``rejects/``, and every row's lengths and decision to
``lengths.parquet``. Otherwise (a percentile or z-score rule needs the train split's
distribution first; the Ray engine writes on its actors) two passes: the loop measures every row
into ``.measured.parquet``, the rules are resolved, and the engine's ``write_pass`` reads the
source again beside it. Everything goes to a staging directory beside ``--out`` and is renamed
into place only after kept + truncated + dropped = source rows has been checked for every split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from lengthscan.engines.loop import measure_source
from lengthscan.engines.options import DatasetOptions, RuleOptions, RunOptions
from lengthscan.engines.protocols import Engine
from lengthscan.engines.results import (
    CleanResult,
    DecisionReport,
    audit_result,
    clean_extra,
    publish_clean,
    simulate_batches,
)
from lengthscan.engines.setup import Prepared, prepare_run, resolve_for, source_paths, with_identity
from lengthscan.engines.spec import Spec
from lengthscan.measure.columns import ColumnError, check_columns
from lengthscan.policy.decisions import decide_rows
from lengthscan.sources.sampling import plan_sample
from lengthscan.write.token_columns import TOKEN_COLUMNS

#: Files and folders ``clean`` writes into ``--out``.
CLEAN_FILES = {"dataset", "rejects", "lengths.parquet", "report.json", "report.html"}

__all__ = ["run_clean", "CleanResult", "CLEAN_FILES"]


@dataclass(frozen=True)
class DatasetPlan:
    """What the written dataset gets, checked against the source once: the measurement filling
    the length column (None: no column) and decide-only's caps (role -> upper token count)."""

    length_from: str | None
    decide_caps: dict


def plan_dataset(prepared: Prepared, src, rules: RuleOptions, dataset: DatasetOptions) -> DatasetPlan:
    """The length column, the token columns and decide-only mode, checked against ``src``."""
    setup = prepared.setup
    explicit_length = dataset.length_from is not None or dataset.length_column != "length"
    if dataset.tokenize and dataset.length_column and dataset.length_from != "none":
        from lengthscan.write.token_columns import TOKEN_COLUMNS

        if dataset.length_column in TOKEN_COLUMNS:
            raise ColumnError(f"--length-column {dataset.length_column}: --tokenize writes that column itself; "
                              "choose another name")
    length_from = length_source(setup, dataset.length_column, dataset.length_from, src)
    if dataset.tokenize:
        check_tokenize(setup, src)
        _warn_dpo_prepares_again(setup)
    elif setup.pairs is not None and "truncate" in {rules.action, *(r.action for r in prepared.rules)}:
        raise ColumnError("truncating preference pairs cuts their token ids: give --tokenize (the text of a "
                          "conversation is not cut)")
    if dataset.embed_audio:
        _warn_path_columns(setup, src)
    caps = decide_caps(prepared.rules, setup, rules.action, wanted=dataset.decide_only and not dataset.tokenize
                       and not explicit_length)
    if caps and length_from == "input_tokens":
        length_from = None  # exact lengths of every row are what decide-only skips
    return DatasetPlan(length_from, caps)


def run_clean(source, options: Spec, engine: Engine) -> CleanResult:
    """The clean of ``source`` as ``options`` ask, measured (and written) by ``engine``."""
    with engine.early(source, options):  # the local engine's chat workers start while the tokenizer loads
        return _clean(source, options, engine)


def _clean(source, options: Spec, engine: Engine) -> CleanResult:
    from lengthscan.write.clean_rows import CleanSpec
    from lengthscan.write.parquet import check_format
    from lengthscan.write.staging import OutputError, check_apart, check_out_path, discard, staging_dir

    dataset, rules, run = options.dataset, options.rules, options.run
    check_format(dataset.format)
    started = time.perf_counter()
    prepared = prepare_run(options.measure, rules)
    out = Path(options.output.out)

    def check_out() -> None:
        check_out_path(options.output.out)
        if out.exists() and not out.is_dir():  # a data file named by mistake is never replaced by a folder
            raise OutputError(f"--out {out}: exists and is not a directory; choose another --out")
        if out.exists() and not options.output.overwrite:
            raise OutputError(f"{out}: exists; clean never touches an existing directory without --overwrite")

    check_out()
    final = out.resolve()  # Ray's workers may run in another working directory
    engine.check(source)
    with engine.session():
        sample = options.sample
        src = engine.open(source, sample.split, config=sample.config, revision=sample.revision)
        check_apart(out, source_paths(source, src))
        check_columns(src, prepared.setup.fields)
        plan = plan_dataset(prepared, src, rules, dataset)
        setup = replace(with_identity(prepared.setup, src, options.output.id_column), decide_caps=plan.decide_caps)
        prepared = replace(prepared, setup=setup)
        staging = staging_dir(final, recheck=check_out)  # under a lock on --out, checked again
        try:
            from lengthscan.policy.decisions import special_lengths

            def spec_for(resolved) -> CleanSpec:
                return CleanSpec(setup, tuple(resolved), special_lengths(setup.counter, setup.fields), staging,
                                 final, keep_empty_targets=rules.keep_empty_targets,
                                 length_column=dataset.length_column, length_from=plan.length_from,
                                 tokenize=dataset.tokenize, embed_audio=dataset.embed_audio,
                                 redact=options.output.redact, format=dataset.format, batch_rows=run.batch_rows)

            if prepared.absolute and engine.single_pass:
                measurement, outcome, resolved, basis = _single_pass(src, prepared, engine, run, rules, spec_for)
            else:
                measurement, outcome, resolved, basis = _two_passes(src, prepared, engine, run, rules, spec_for,
                                                                    staging)
            audit = audit_result(src, setup, measurement, seed=0, command=run.command,
                                 tokenizer=engine.tokenizer_info(setup.counter, measurement.cached))
            extra = clean_extra(dataset.length_column, plan.length_from, dataset.embed_audio, plan.decide_caps,
                                engine.proofs(setup))
            decisions = DecisionReport.of(resolved, basis, rules.action, outcome.decisions, rules.fail_over,
                                          prepared.gate, **extra)
            result = CleanResult(audit, decisions, outcome.after, str(final), published=False,
                                 batches=simulate_batches(src, outcome.after_tallies, setup, 0, of="cleaned dataset"),
                                 worst_rows=outcome.worst_rows())
            result = publish_clean(result, staging, final, started=started, redact=options.output.redact)
            _warn_still_over(result)
            return result
        except BaseException:
            discard(staging)
            raise


def _warn_path_columns(setup, src) -> None:
    """``--embed-audio`` embeds the bytes of ``Audio`` columns; a column of path strings stays paths."""
    import warnings

    features = src.splits[0].parts[0].features() if src.splits and src.splits[0].parts else {}
    for f in setup.fields:
        if f.kind.holds_files and (features.get(f.column) or {}).get("dtype") in ("string", "large_string"):
            warnings.warn(f"lengthscan: --embed-audio embeds Audio columns; {f.column!r} holds paths (text), written "
                          "as absolute paths instead (cast it to datasets.Audio to embed the files)",
                          stacklevel=5)  # the caller of lengthscan.clean: past plan_dataset, run_clean, clean


def _warn_still_over(result: CleanResult) -> None:
    """One warning per model limit the written rows still exceed (a rule looser than the model)."""
    import warnings

    from lengthscan.report.findings import still_over

    for after in result.after:
        where = f" of split {after.split}" if len(result.after) > 1 else ""
        for line in still_over(after.to_dict(), where):
            warnings.warn(f"lengthscan: {line}", stacklevel=4)  # the caller of lengthscan.clean


def _single_pass(src, prepared: Prepared, engine, run: RunOptions, rules: RuleOptions, spec_for):
    """Every threshold is known before any row is measured: one pass reads, measures, decides and
    writes each batch (the source is read once, never tokenized twice)."""
    from lengthscan.write.clean_writer import CleanWriter

    setup = prepared.setup
    resolved, basis = resolve_for(prepared.rules, src, None, setup, rules.action, rules.crop_audio)
    writer = CleanWriter(spec_for(resolved), src)
    sink = CleanSink(writer, lengths_schema_of(src, setup), with_split=src.has_splits)
    try:
        measurement = measure_source(src, setup, engine, run=run, ratios=prepared.ratios, sinks=[sink],
                                     plan_for=lambda s: plan_sample(s.num_rows, full=True), all_columns=True,
                                     with_ids=writer.spec.tokenize)
    except BaseException:
        writer.abort()
        raise
    return measurement, writer.finish(), resolved, basis


def _two_passes(src, prepared: Prepared, engine, run: RunOptions, rules: RuleOptions, spec_for, staging: Path):
    """First pass: every row measured into ``.measured.parquet``; the rules resolved on the
    distributions; then the engine's write pass reads the source again beside it."""
    from lengthscan.write.lengths import LengthsSink, LengthsWriter

    setup = prepared.setup
    measured_path = staging / ".measured.parquet"
    lengths = LengthsWriter(measured_path, lengths_schema_of(src, setup))
    try:
        measurement = measure_source(src, setup, engine, run=run, ratios=prepared.ratios,
                                     sinks=[LengthsSink(lengths, with_split=src.has_splits)],
                                     plan_for=lambda s: plan_sample(s.num_rows, full=True))
    finally:
        lengths.close()
    resolved, basis = resolve_for(prepared.rules, src, measurement.tallies, setup, rules.action, rules.crop_audio)
    outcome = engine.write_pass(src, measurement.plans, spec_for(resolved), measured_path, progress=run.progress)
    return measurement, outcome, resolved, basis


def lengths_schema_of(src, setup):
    """The schema of the measured lengths of ``src`` (with decide-only's bound columns)."""
    from lengthscan.write.lengths import lengths_schema

    multi = any(s.multi_file for s in src.splits)
    return lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi,
                          bounded=tuple(setup.decide_caps), identity=setup.identity)


class CleanSink:
    """The single pass's sink: each measured batch, as its rows of the lengths file, to the writer."""

    def __init__(self, writer, schema: pa.Schema, *, with_split: bool):
        self.writer, self.schema, self.with_split = writer, schema, with_split

    def open_split(self, split_src, plan) -> None:
        self.writer.open_split(split_src, plan)

    def write(self, split_src, batch, measured: dict) -> None:
        from lengthscan.write.lengths import lengths_batch

        located = split_src.locate(batch.rows) if split_src.multi_file else None
        rows = lengths_batch(self.schema, batch.rows, split=split_src.name if self.with_split else None,
                             located=located, measured=measured, table=batch.table)
        ids = {role: m.ids for role, m in measured.items() if m.ids is not None}
        ids.update({f"{role}_labels": m.labels for role, m in measured.items() if m.labels is not None})
        table = pa.Table.from_batches([rows])
        self.writer.write(split_src, batch, table, decide_rows(self.writer.spec, table), ids=ids or None)

    def close_split(self, split_src) -> None:
        self.writer.close_split(split_src)


def length_source(setup, length_column, length_from, src) -> str | None:
    """Which measurement fills the length column (None: no column); refuse to overwrite one."""
    if not length_column or length_from == "none":
        return None
    measured = [s.name for s in setup.specs]
    if length_from is None:
        length_from = next((m for m in ("input_tokens", "sequence_tokens", "input_samples", "input_frames")
                            if m in measured), None)
        if length_from is None:
            return None
    if length_from not in measured:
        raise ColumnError(f"--length-from {length_from}: not measured here; measured: {', '.join(measured)}")
    for split_src in src.splits:
        if length_column in split_src.column_names:
            raise ColumnError(f"{src.spec}: already has a {length_column!r} column; it is not overwritten: "
                              f"choose --length-column NAME or --length-from none")
    return length_from


def decide_caps(rules, setup, action: str, *, wanted: bool) -> dict:
    """role -> upper token count when decide-only counting applies: numeric upper input-token
    limits only (with any other rule, the written dataset keeps its exact ``length`` column)."""
    if not wanted or not rules or action != "drop":
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
    return {"input": math.floor(min(caps))}


def _warn_dpo_prepares_again(setup) -> None:
    """DPOTrainer (unlike RewardTrainer) prepares its dataset from the text again, whatever id
    columns it holds: say so, and how to get the same cut in training."""
    if setup.pairs is None or getattr(setup.pairs.format, "trainer", None) != "dpo":
        return
    import warnings

    warnings.warn("lengthscan: DPOTrainer tokenizes prompt, chosen and rejected again from the text and replaces "
                  "prompt_ids/chosen_ids/rejected_ids: the written ids serve your own loop; in DPOTrainer, set "
                  "DPOConfig(max_length=N, truncation_mode='keep_start') with the limit N to cut every pair as "
                  "these ids are cut (the pairs that cut would collapse are already dropped)", stacklevel=4)


def check_tokenize(setup, src) -> None:
    """``--tokenize`` needs a text column and a tokenizer, and never overwrites a column."""
    if setup.counter is None:
        raise ColumnError("--tokenize needs a text column (--input and/or --target) and a tokenizer")
    pairs = getattr(setup.pairs, "id_columns", None)
    if setup.pairs is not None and pairs is None:
        raise ColumnError("--tokenize with RL prompts: GRPOTrainer tokenizes its prompts itself at every step; "
                          "leave out --tokenize")
    chat = setup.chat
    media = [name for name, counter in (("images", chat and chat.images), ("videos", chat and chat.videos),
                                        ("audio", chat and chat.audios)) if counter is not None]
    if media:
        raise ColumnError(f"--tokenize writes text token ids; with {' and '.join(media)} the processor writes its own "
                          "(leave out --tokenize, or --processor and the media columns)")
    for split_src in src.splits:
        clash = [c for c in (pairs or TOKEN_COLUMNS) if c in split_src.column_names]
        if clash:
            raise ColumnError(f"{src.spec}: already has {', '.join(clash)}; --tokenize would overwrite them")
