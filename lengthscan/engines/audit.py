"""The library entry point ``lengthscan.audit``: source -> sample -> measure -> stats -> outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lengthscan.engines.loop import measure_split
from lengthscan.engines.results import audit_result, decisions_dict, simulation_positions
from lengthscan.engines.setup import prepare_with_rules, resolve_for
from lengthscan.measure.batch import ColumnError, check_columns
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.opener import open_source
from lengthscan.sources.sampling import DEFAULT_SEED, plan_sample
from lengthscan.sources.scan import BATCH_ROWS
from lengthscan.stats.result import AuditResult
from lengthscan.stats.tally import SplitTally
from lengthscan.write.audit_output import _Output

Progress = Callable[[str, int, int], None]


"""Called as ``progress(split, rows_done, rows_total)`` while measuring."""


__all__ = ["audit", "ColumnError"]


def audit(source, *, tokenizer=None, input: str | None = None, target: str | None = None,
          audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
          split: str | None = None, sample=None, full: bool = False, seed: int = DEFAULT_SEED,
          limits=(), action: str = "drop", keep_empty_targets: bool = False, crop_audio: bool = False,
          fail_over=None, out: str | Path | None = None, overwrite: bool = False, cache: bool = True,
          max_chars: int = DEFAULT_MAX_CHARS, batch_rows: int = BATCH_ROWS, redact: bool = False,
          num_proc: int = 1, progress: Progress | None = None, command: str | None = None) -> AuditResult:
    """Measure the lengths of the ``input``/``audio`` and ``target`` columns of ``source``.

    ``source`` is anything ``open_source`` opens (path, glob, directory, audio folder, hub id,
    Dataset or DatasetDict). ``tokenizer`` is a local directory, a hub name or a loaded tokenizer
    (default: ``model``). ``model`` also gives the model's limits, sampling rate and frame rule.
    ``sample`` is a row count or a fraction; ``full`` measures every row. ``limits`` are
    ``clean``'s rules: the audit then reports what clean would do to each row (with ``action``,
    ``keep_empty_targets``, ``crop_audio``), and ``fail_over`` ('1%' or a row count) marks the
    result failed when more rows would be dropped or truncated. With ``out``, writes
    ``lengths.parquet``, ``report.json`` and ``report.html`` there atomically; ``redact`` keeps
    every text of the data out of the report (row ids and lengths only). ``num_proc`` > 1 measures
    in worker processes (same results, same order).
    """

    started = time.perf_counter()
    rules, gate_spec, setup = prepare_with_rules(limits, fail_over, tokenizer=tokenizer, input=input,
                                                 target=target, audio=audio, model=model,
                                                 sampling_rate=sampling_rate, max_chars=max_chars)
    if out is not None:
        from lengthscan.write.staging import check_writable

        check_writable(Path(out), overwrite=overwrite)
    src = open_source(source, split=split)
    check_columns(src, setup.fields)
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))

    output = _Output.start(Path(out) if out is not None else None, setup.fields, src,
                           measured_only=bool(rules), redact=redact)
    try:
        splits, cached, tallies, plans = [], [], [], []
        for split_src in src.splits:
            plan = plan_sample(split_src.num_rows, sample=sample, full=full, seed=seed)
            tally = SplitTally(setup.fields, setup.limits, ratios, keep_positions=simulation_positions(plan, seed))
            cached += measure_split(split_src, plan, setup, tally, cache=cache, batch_rows=batch_rows,
                                    output=output, progress=progress, with_split=src.has_splits,
                                    num_proc=num_proc)
            splits.append(tally.split_audit(split_src.name, plan, seed))
            tallies.append(tally)
            plans.append(plan)
        if setup.counter is not None and setup.counter.loaded:
            from lengthscan.policy.decisions import special_lengths

            special_lengths(setup.counter, setup.fields)  # free now; a clean on cached lengths needs it
        decisions = None
        if rules:
            resolved, basis = resolve_for(rules, src, tallies, setup, action, crop_audio)
            dtallies = output.decide(src, plans, setup, resolved, keep_empty_targets)
            decisions = decisions_dict(resolved, basis, action, dtallies, fail_over, gate_spec)
        result = audit_result(src, setup, splits, tallies, seed=seed, command=command, cache_hits=len(cached),
                              tokenizer=setup.counter.info(cached=set(cached)) if setup.counter else None,
                              out=out, started=started, decisions=decisions)
        output.finish(result)
        return result
    except BaseException:
        output.abort()
        raise
