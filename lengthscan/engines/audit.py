"""The audit: source -> sample -> measure -> stats -> (policy) -> outputs, on any engine.

``run_audit`` takes the run's ``Spec`` and the engine (``LocalEngine`` or ``RayEngine``);
``engines.api.audit`` is the public call that builds both.
"""

from __future__ import annotations

import time
from pathlib import Path

from lengthscan.engines.loop import measure_source
from lengthscan.engines.protocols import Engine
from lengthscan.engines.records import AuditResult
from lengthscan.engines.results import DecisionReport, audit_result
from lengthscan.engines.setup import prepare_run, resolve_for, with_identity
from lengthscan.engines.spec import Spec
from lengthscan.measure.columns import ColumnError, check_columns
from lengthscan.pack.options import PackingOptions
from lengthscan.policy.decisions import decide_file, special_lengths
from lengthscan.sources.sampling import FULL_UP_TO, choose_unit, plan_sample

__all__ = ["run_audit", "ColumnError"]


def run_audit(source, options: Spec, engine: Engine) -> AuditResult:
    """The audit of ``source`` as ``options`` ask, measured by ``engine`` (``options.dataset`` is clean's, unread)."""
    with engine.early(source, options):  # the local engine's chat workers start while the tokenizer loads
        return _audit(source, options, engine)


def _audit(source, options: Spec, engine: Engine) -> AuditResult:
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
            if setup.counter is not None and (setup.counter.loaded or setup.counter.methods()):
                special_lengths(setup.counter, setup.fields)  # free now; a clean on cached lengths needs it
            decisions = None
            if prepared.rules:
                special = special_lengths(setup.counter, setup.fields)
                resolved, basis = resolve_for(prepared.rules, src, measurement.tallies, setup, rules.action,
                                              rules.crop_audio)
                splits = [(s.name, p.rows_total, p.size) for s, p in zip(src.splits, measurement.plans)]
                tallies = decide_file(output.measured(), splits, setup.fields, resolved, special=special,
                                      keep_empty_targets=rules.keep_empty_targets, redact=output.redact,
                                      out_path=output.lengths_path())
                output.decided()
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
