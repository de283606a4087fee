"""``lengthscan.audit``: source -> sample -> measure -> stats -> (policy) -> outputs, on any engine.

``audit`` keeps the keyword signature users call; it builds the option records once and hands
them to ``run_audit`` with the engine (``LocalEngine``; ``engines.ray.api.audit_ray`` passes a
``RayEngine``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from lengthscan.engines.loop import LocalEngine, measure_source
from lengthscan.engines.options import (
    MeasureOptions,
    OutputOptions,
    Progress,
    RuleOptions,
    RunOptions,
    SampleOptions,
    split_options,
)
from lengthscan.engines.records import AuditResult
from lengthscan.engines.results import DecisionReport, audit_result
from lengthscan.engines.setup import prepare_run, resolve_for, with_identity
from lengthscan.measure.batch import ColumnError, check_columns
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.pack.options import PackingOptions
from lengthscan.policy.decisions import special_lengths
from lengthscan.sources.sampling import DEFAULT_SEED, FULL_UP_TO, choose_unit, plan_sample
from lengthscan.sources.scan import BATCH_ROWS

__all__ = ["audit", "run_audit", "AuditOptions", "ColumnError"]


@dataclass(frozen=True)
class AuditOptions:
    """Everything an audit is asked: what to measure, which rows, the rules, the outputs, the run."""

    measure: MeasureOptions = MeasureOptions()
    sample: SampleOptions = SampleOptions()
    rules: RuleOptions = RuleOptions()
    output: OutputOptions = OutputOptions()
    run: RunOptions = RunOptions()
    packing: PackingOptions = PackingOptions()

    @classmethod
    def of(cls, **kwargs) -> "AuditOptions":
        """The records from ``audit``'s keyword arguments."""
        return cls(*split_options(kwargs, MeasureOptions, SampleOptions, RuleOptions, OutputOptions, RunOptions,
                                  PackingOptions))


def audit(source, *, tokenizer=None, input: str | None = None, target: str | None = None,
          audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
          split: str | None = None, sample=None, full: bool = False, seed: int = DEFAULT_SEED,
          sample_unit: str | None = None, config: str | None = None, revision: str | None = None,
          limits=(), action: str = "drop", keep_empty_targets: bool = False, crop_audio: bool = False,
          target_is_label: bool = False, fail_over=None, out: str | Path | None = None, overwrite: bool = False,
          cache: bool = True,
          max_chars: int = DEFAULT_MAX_CHARS, count_engine: str = "auto", verify_counts: int = 0,
          batch_rows: int = BATCH_ROWS, redact: bool = False,
          num_proc: int = 1, progress: Progress | None = None, command: str | None = None, messages: str | None = None,
          prompt: str | None = None, completion: str | None = None, tools: str | None = None,
          chat_template: str | None = None, train_on: str = "assistant", id_column: str | None = None,
          images: str | None = None, processor: str | None = None, max_pixels: int | None = None,
          packing: str | None = None, max_length: int | None = None, packing_num_proc: int | None = None,
          shuffle_seed: int | None = None, batch_size: int = 8, grad_accum: int = 1, devices: int = 1) -> AuditResult:
    """Measure the lengths of the ``input``/``audio`` and ``target`` columns of ``source``.

    ``source`` is anything ``open_source`` opens (path, glob, directory, audio folder, hub id,
    Dataset or DatasetDict). ``tokenizer`` is a local directory, a hub name or a loaded tokenizer
    (default: ``model``). ``model`` also gives the model's limits, sampling rate and frame rule.
    ``sample`` is a row count or a fraction; ``full`` measures every row; ``sample_unit`` ("row" or
    "block": whole Parquet row groups) is what the sample draws (default: block for remote and
    large Parquet sources). ``config`` and ``revision`` pick a hub dataset's subset and commit. ``limits`` are
    ``clean``'s rules: the audit then reports what clean would do to each row (with ``action``,
    ``keep_empty_targets``, ``crop_audio``, ``target_is_label``), and ``fail_over`` ('1%' or a row count) marks the
    result failed when more rows would be dropped or truncated. With ``out``, writes
    ``lengths.parquet``, ``report.json`` and ``report.html`` there atomically; ``redact`` keeps
    every text of the data out of the report (row ids and lengths only); ``id_column`` (a plain
    column identifying rows) is carried into ``lengths.parquet`` beside ``row``. ``num_proc`` > 1 measures
    in worker processes (same results, same order). Conversations instead of text columns:
    ``messages`` (or ``prompt`` and ``completion``), ``tools``, ``chat_template`` (a Jinja file;
    default: the tokenizer's) and ``train_on`` (assistant, last or all); see README "Chat data".
    Images in conversations: ``images`` (a column of per-row images), ``processor`` (the model's
    processor: image tokens as it expands them; default ``model``), ``max_pixels`` (count as if the
    image processor's max_pixels were this); see README "Images in conversations".
    ``packing`` (bfd, bfd_split or wrapped) with ``max_length`` simulates TRL's packing of every row
    (``packing_num_proc``: its ``dataset_num_proc``; ``shuffle_seed``: ``shuffle_dataset`` with that
    seed); ``batch_size``, ``grad_accum`` and ``devices`` turn packs into steps (README "Packing").
    """
    options = AuditOptions.of(**{k: v for k, v in locals().items() if k != "source"})
    return run_audit(source, options, LocalEngine(options.run.num_proc))


def run_audit(source, options: AuditOptions, engine) -> AuditResult:
    """The audit of ``source`` as ``options`` ask, measured by ``engine``."""
    from lengthscan.write.audit_output import AuditOutput

    started = time.perf_counter()
    options.packing.check()
    prepared = prepare_run(options.measure, options.rules)
    setup, rules, sample = prepared.setup, options.rules, options.sample
    if options.packing.packing is not None:
        _check_max_length(options.packing, setup)
    out = options.output.out
    if out is not None:
        from lengthscan.write.staging import check_out_path, check_writable

        check_out_path(out)
        check_writable(Path(out), overwrite=options.output.overwrite)
    engine.check(source)
    with engine.session():
        src = engine.open(source, sample.split, config=sample.config, revision=sample.revision)
        if out is not None:
            from lengthscan.engines.setup import source_paths
            from lengthscan.write.staging import check_apart

            check_apart(Path(out), source_paths(source, src))
        check_columns(src, setup.fields)
        setup = with_identity(setup, src, options.output.id_column)
        output = AuditOutput.start(Path(out) if out is not None else None, setup, src,
                                   measured_only=bool(prepared.rules), redact=options.output.redact,
                                   overwrite=options.output.overwrite)
        packer = None
        if options.packing.packing is not None:
            from lengthscan.pack.run import PackSink

            packer = PackSink(setup.fields, setup.identity)
        try:
            measurement = measure_source(
                src, setup, engine, run=options.run, ratios=prepared.ratios, seed=sample.seed,
                sinks=[*output.sinks(src, setup), *([packer] if packer is not None else [])],
                plan_for=lambda s: _plan(s, sample, remote=src.remote is not None,
                                         columns=list(dict.fromkeys(c for f in setup.fields for c in f.columns))))
            if setup.counter is not None and setup.counter.loaded:
                special_lengths(setup.counter, setup.fields)  # free now; a clean on cached lengths needs it
            decisions = None
            if prepared.rules:
                special = special_lengths(setup.counter, setup.fields)
                resolved, basis = resolve_for(prepared.rules, src, measurement.tallies, setup, rules.action,
                                              rules.crop_audio)
                tallies = output.decide(src, measurement.plans, setup, resolved, special=special,
                                        keep_empty_targets=rules.keep_empty_targets)
                decisions = DecisionReport.of(resolved, basis, rules.action, tallies, rules.fail_over, prepared.gate)
            packing = _pack(packer, options.packing, setup, output, src) if packer is not None else None
            result = audit_result(src, setup, measurement, seed=sample.seed, command=options.run.command, out=out,
                                  tokenizer=engine.tokenizer_info(setup.counter, measurement.cached),
                                  started=started, decisions=decisions, longest=output.longest_rows(src, setup),
                                  packing=packing)
            output.finish(result.to_dict())
            return result
        except BaseException:
            output.abort()
            raise


def _plan(split_src, sample, *, remote: bool, columns: list[str]):
    """The split's sample plan: by row or by block (``sampling.choose_unit``); a remote file's huge
    row groups are split into page blocks where its page index allows (``sources.remote.parquet_pages``)."""
    import os

    drawn = not sample.full and (sample.sample is not None or split_src.num_rows > FULL_UP_TO)
    blocks = split_src.blocks(columns) if drawn and sample.sample_unit != "row" else None
    unit, why = choose_unit(sample.sample_unit, remote=remote, has_blocks=bool(blocks),
                            local_bytes=lambda: sum(os.path.getsize(p.path) for p in split_src.parts))
    return plan_sample(split_src.num_rows, sample=sample.sample, full=sample.full, seed=sample.seed, unit=unit,
                       blocks=blocks, why_unit=why)


def _pack(packer, options: PackingOptions, setup, output, src) -> dict:
    """The packs of every split (``packs.parquet`` beside the lengths, with ``--out``) and their
    figures; with conversations, the trained tokens the packing loses (their rows read again)."""
    from lengthscan.pack.run import simulate_packing, write_packs

    limit = setup.model_limits.get(packer.spec.name) if setup.model_limits is not None else None
    trained = None
    if packer.trained_spec is not None and setup.chat is not None:
        from lengthscan.pack.trained import trained_masks

        splits = {s.name: s for s in src.splits}
        trained = (packer.completion, lambda name, rows: trained_masks(splits[name], setup, rows,
                                                                        packer.lengths[name]))
    report, packs = simulate_packing(packer.lengths, options, model_limit=int(limit.value) if limit else None,
                                     ids=None if output.redact else packer.id_of, trained=trained)
    if output.final is not None:
        write_packs(output.staging / "packs.parquet", packs)
    return report


def _check_max_length(options: PackingOptions, setup) -> None:
    """A packed length that cannot hold one token of content beside the special tokens every
    sequence carries (BOS, EOS ...) packs nothing: refused before measuring."""
    from lengthscan.pack.options import PackingError

    special = special_lengths(setup.counter, setup.fields).get("input", 0)
    if options.max_length <= special:
        raise PackingError(f"--max-length {options.max_length}: every sequence carries {special} special token(s); "
                           "a pack that short holds no content: give a larger L")
