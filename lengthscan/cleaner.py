"""``lengthscan.clean``: decide every row, then write a training-ready dataset with nothing lost.

(The module is named ``cleaner`` so that importing it never shadows the function ``lengthscan.clean``.)

When every rule is absolute (a number, or the model's limit), one pass: each batch is read,
measured (lengths cached by an earlier audit of the same source and tokenizer are reused; with
``tokenize``, the ids are kept) and handed to ``clean_pass.SecondPass``'s steps, which decide each
row, truncate the texts to truncate (verified by re-tokenizing), and write kept and truncated rows
to ``dataset/``, dropped rows with their reasons to ``rejects/``, and every row's lengths and
decision to ``lengths.parquet``. A percentile or z-score rule needs the train split's distribution
first: the first pass measures every row into ``.measured.parquet``, the rules are resolved, and
the second pass reads the source again beside it.
Everything goes to a staging directory beside ``--out`` and is renamed into place only after
kept + truncated + dropped = source rows has been checked for every split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from .assemble import audit_result, clean_extra, decisions_dict, publish_clean
from .clean_pass import SecondPass
from .measure import ColumnError, check_columns
from .measure_pass import measure_split
from .pipeline import BATCH_ROWS, resolve_for, simulate_batches
from .prepare import prepare_with_rules
from .records import AuditResult
from .sampling import plan_sample
from .sources import open_source
from .tally import SplitTally
from .tokens import DEFAULT_MAX_CHARS

#: Files and folders ``clean`` writes into ``--out``.
CLEAN_FILES = {"dataset", "rejects", "lengths.parquet", "report.json", "report.html"}


@dataclass(frozen=True)
class CleanResult:
    """What ``lengthscan.clean`` returns and its ``report.json`` stores."""

    audit: AuditResult                 # the source as measured (every row)
    decisions: dict                    # rules, basis, per-split counts by decision and reason, gate
    after: tuple                       # SplitAudit of the written dataset (lengths after truncation)
    out_dir: str
    published: bool
    batches: dict | None = None        # padding and batches of the written dataset
    worst_rows: tuple = ()             # the longest rows of the source, with their decisions

    @property
    def gate_failed(self) -> str | None:
        return self.decisions.get("gate")

    def to_dict(self) -> dict:
        data = self.audit.to_dict()
        data["decisions"] = self.decisions
        data["clean"] = {"out_dir": self.out_dir, "published": self.published,
                         "after": [s.to_dict() for s in self.after], "worst_rows": list(self.worst_rows),
                         "batches_before": data.get("batches")}
        data["batches"] = self.batches
        return data


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
    from .parquet_out import check_format
    from .writer import OutputError, staging_dir

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

    from .pipeline import simulation_positions
    from .writer import lengths_batch, lengths_schema

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
    from .writer import LengthsWriter, lengths_schema

    multi = any(s.multi_file for s in src.splits)
    schema = lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi,
                            bounded=tuple(setup.decide_limits))
    sink = SimpleNamespace(lengths=LengthsWriter(tmp / ".measured.parquet", schema))
    ratios = tuple(dict.fromkeys(r.metric for r in rules if r.is_ratio))
    splits, cached, tallies, plans = [], [], [], []
    from .pipeline import simulation_positions

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

