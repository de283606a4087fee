"""clean's per-batch units: one batch of source rows and its measured lengths in, the kept rows,
the rejects and the lengths with their decisions out; and the tally of what a split's batches gave.

``clean_batch`` composes the steps, each a function with explicit inputs: the decision
(``policy.rules.decide``), truncation (``truncate.truncate_rows``), cropping (``crop.crop_rows``),
the length column, the token columns (``token_columns.add_token_columns``) and the rejects. Both
engines call it: the local writer (``clean_writer``) per batch, the Ray writing actors per block.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lengthscan import __version__
from lengthscan.measure.columns import ColumnError, check_utf8
from lengthscan.measure.records import Measured
from lengthscan.measure.setup import Setup
from lengthscan.policy.decisions import BatchDecision, DecisionTally, decision_columns
from lengthscan.policy.rules import DROP, TRUNCATE, Decisions, ResolvedRule
from lengthscan.stats.tally import SplitTally
from lengthscan.write.worst_rows import WorstRows


@dataclass(frozen=True)
class CleanSpec:
    """What writing a clean needs, resolved once (small and picklable: the counter pickles by name)."""

    setup: Setup
    resolved: tuple[ResolvedRule, ...]
    special: dict                 # role -> the special tokens of an empty text
    staging: Path                 # the staging directory beside ``out``
    out: Path                     # ``--out``, resolved
    keep_empty_targets: bool = False
    length_column: str | None = "length"
    length_from: str | None = None
    tokenize: bool = False
    embed_audio: bool = False
    redact: bool = False
    format: str = "arrow"
    batch_rows: int = 2048

    @property
    def fields(self) -> tuple:
        return self.setup.fields


@dataclass(frozen=True, eq=False)
class CleanedBatch:
    """One batch cleaned: its rows of ``lengths.parquet``, the rows to write and the rejects."""

    rows: np.ndarray              # source row positions of the batch
    lengths: pa.Table             # measured lengths + decision, reason, reasons, ``*_after``
    kept: pa.Table                # kept and truncated rows, with the length and token columns
    rejects: pa.Table             # dropped rows with row, reason, reasons
    decisions: Decisions
    base: dict                    # measurement -> values as measured
    final: dict                   # measurement -> values after truncation and cropping
    flags: dict                   # role -> flag codes
    source: pa.Table              # the batch's source rows as read (for the worst rows' previews)


def clean_batch(spec: CleanSpec, layout, rows: np.ndarray, table: pa.Table, measured: pa.Table,
                decided: BatchDecision, ids: dict | None = None, raw: dict | None = None) -> CleanedBatch:
    """Apply the policy's decisions (``decided``: ``policy.decisions.decide_batch``, taken by the
    engine before this is called): truncate, crop and build the output tables of one batch. ``table`` holds the source
    rows ``rows`` of the split ``layout`` (a ``SplitSource`` or ``SplitLayout``), ``measured`` their
    rows of the measured lengths, ``ids`` (role -> token ids per row) what measuring them gave,
    ``raw`` (column -> values) a JSON Lines file's conversations as the file holds them."""
    setup = spec.setup
    check_utf8(table, rows, layout)  # every column is written: none may hold bytes a reader cannot load
    base, flags, d = decided.base, decided.flags, decided.decisions
    final = {name: values.copy() for name, values in base.items()}
    source = table
    out = _truncated(spec, _absolute_paths(spec, table, layout.base_dir(rows)), d, final)
    chat_tokens = None
    if setup.pairs is not None and d.truncate_to.get("pair") is not None:
        from lengthscan.write.token_columns import cut_pairs

        cut_pairs(d.truncate_to["pair"], final)
    if setup.chat is not None:
        from lengthscan.write.chat_rows import clean_chat

        out, d, chat_tokens = clean_chat(setup.chat, setup.fields[0], out, d, final, ids, tokenize=spec.tokenize,
                                         raw=raw, keep_empty_targets=spec.keep_empty_targets)
    if d.crop_seconds is not None:
        out = _cropped(spec, out, d, final, layout.base_dir(rows))
    keep = d.decision != DROP
    if spec.tokenize and setup.pairs is not None and not (ids or {}).get("pair"):  # the write pass: measured again
        columns = {c: raw[c] if raw and c in raw else table.column(c).to_pylist() for c in setup.pairs.format.columns}
        specs = {s.name: s.name for s in setup.fields[0].specs}
        ids = {**(ids or {}), "pair": setup.pairs.measure(columns, specs, with_ids=True).ids}
    kept = _with_columns(spec, out.filter(pa.array(keep)), d, keep, final, ids, chat_tokens)
    rejects = rejects_table(out.filter(pa.array(~keep)), rows[~keep], d, ~keep, layout)
    return CleanedBatch(rows, lengths_with_decisions(spec, measured, d, final), kept, rejects, d, base, final,
                        flags, source)


def _absolute_paths(spec: CleanSpec, table: pa.Table, base_dir: str | None) -> pa.Table:
    """Audio and image paths made absolute: relative ones resolve against the data file's folder,
    which ``dataset/`` and ``rejects/`` are not in."""
    import os

    chat = spec.setup.chat
    if base_dir is not None and chat is not None and chat.options.format.vision:
        from lengthscan.write.image_paths import absolute_images

        fmt = chat.options.format
        table = absolute_images(table, base_dir, images=fmt.images, conversations=(fmt.messages, fmt.prompt,
                                                                                    fmt.completion))
    for f in spec.fields:
        if not f.kind.holds_files or base_dir is None or not pa.types.is_string(table.schema.field(f.column).type):
            continue
        values = table.column(f.column).to_pylist()
        fixed = [p if not p or os.path.isabs(p) or "://" in p else os.path.normpath(os.path.join(base_dir, p))
                 for p in values]
        if fixed != values:
            table = table.set_column(table.schema.get_field_index(f.column), f.column, pa.array(fixed, pa.string()))
    return table


def _truncated(spec: CleanSpec, table: pa.Table, d: Decisions, final: dict) -> pa.Table:
    from lengthscan.write.truncate import truncate_rows

    return truncate_rows(table, spec.fields, spec.setup.counter, d.truncate_to, final)


def _cropped(spec: CleanSpec, table: pa.Table, d: Decisions, final: dict, base_dir) -> pa.Table:
    from lengthscan.write.crop import crop_rows

    audio = next(f for f in spec.fields if f.kind.crops)
    return crop_rows(table, audio, spec.setup.settings, d.crop_seconds, final, spec.staging, spec.out,
                     base_dir=base_dir)


def _with_columns(spec: CleanSpec, kept: pa.Table, d: Decisions, keep: np.ndarray, final: dict,
                  ids: dict | None, chat_tokens: dict | None = None) -> pa.Table:
    """The kept rows with the length column and, with ``tokenize``, the token columns."""
    if spec.length_from:
        kept = kept.append_column(spec.length_column, pa.array(final[spec.length_from][keep]))
    if spec.tokenize and spec.setup.pairs is not None:
        from lengthscan.write.token_columns import pair_columns

        index = np.flatnonzero(keep)
        return pair_columns(kept, spec.setup.pairs.id_columns, [ids["pair"][i] for i in index],
                            {n: v[keep] for n, v in final.items()}, cut=(d.decision == TRUNCATE)[keep])
    if spec.tokenize and chat_tokens is not None:
        from lengthscan.write.chat_rows import token_columns

        index = np.flatnonzero(keep)
        row_ids = [chat_tokens["ids"][i] for i in index]
        bad = next((k for k, i in enumerate(index) if len(row_ids[k]) != final["sequence_tokens"][i]), None)
        if bad is not None:
            raise RuntimeError(f"--tokenize: a kept conversation gives {len(row_ids[bad])} ids, measured "
                               f"{final['sequence_tokens'][index[bad]]}: refusing to write inconsistent data")
        return token_columns(kept, row_ids, [chat_tokens["labels"][i] for i in index])
    if spec.tokenize:
        from lengthscan.write.token_columns import add_token_columns

        index = np.flatnonzero(keep)
        given = {role: [row_ids[i] for i in index] for role, row_ids in (ids or {}).items()}
        kept = add_token_columns(kept, spec.fields, spec.setup.counter, {n: v[keep] for n, v in final.items()},
                                 given, changed=(d.decision == TRUNCATE)[keep])
    return kept


def rejects_table(dropped: pa.Table, rows: np.ndarray, d: Decisions, mask: np.ndarray, layout) -> pa.Table:
    """The dropped rows with their ``row`` (and ``source_file``/``file_row``), ``reason``, ``reasons``."""
    out = dropped.append_column("row", pa.array(rows, pa.int64()))
    if layout.multi_file:
        files, file_rows = layout.locate(rows)
        out = out.append_column("source_file", pa.array(files, pa.string()))
        out = out.append_column("file_row", pa.array(file_rows, pa.int64()))
    cols = decision_columns(d)
    out = out.append_column("reason", cols["reason"].filter(pa.array(mask)))
    return out.append_column("reasons", cols["reasons"].filter(pa.array(mask)))


def lengths_with_decisions(spec: CleanSpec, measured: pa.Table, d: Decisions, final: dict) -> pa.Table:
    """The batch's rows of ``lengths.parquet``: decision columns and each text's length after truncation."""
    table = measured
    for name, col in decision_columns(d).items():
        table = table.append_column(name, col)
    for f in spec.fields:
        for name in f.kind.after(f):
            after = np.where(d.decision == TRUNCATE, final[name], -1)
            table = table.append_column(f"{name}_after", pa.array(after, pa.int64(), mask=after < 0))
    return table


@dataclass
class CleanTally:
    """What a split's cleaned batches gave: rows per decision and reason, the statistics of the
    written rows after cleaning, and the longest source rows. Merges with another's (Ray blocks)."""

    decisions: DecisionTally
    after: SplitTally
    worst: WorstRows

    @classmethod
    def start(cls, split: str, rows_total: int, spec: "CleanSpec") -> "CleanTally":
        """An empty tally of a split; the model's limits are counted again on the written rows (a
        rule looser than the model's own leaves rows over them)."""
        return cls(DecisionTally(split, rows_total, redact=spec.redact), SplitTally(spec.fields,
                                                                                 list(spec.setup.ceilings)),
                   WorstRows(spec.fields, redact=spec.redact, identity=spec.setup.identity))

    def add(self, cleaned: CleanedBatch) -> None:
        d, keep = cleaned.decisions, cleaned.decisions.decision != DROP
        self.decisions.add(d)
        self.worst.add(self.decisions.split, cleaned.rows, cleaned.base, d, cleaned.source, cleaned.final)
        fields = self.after.fields
        after = {f.role: Measured({s: cleaned.final[s.name][keep] for s in f.specs}, cleaned.flags[f.role][keep],
                                  notes=_notes_after(f, cleaned.final, keep))
                 for f in fields}
        self.after.add(cleaned.rows[keep], after)

    def merge(self, other: "CleanTally") -> "CleanTally":
        self.decisions.merge(other.decisions)
        self.after.merge(other.after)
        self.worst.merge(other.worst)
        return self


def _notes_after(f, final: dict, keep: np.ndarray) -> dict | None:
    """A conversation field's side columns after cleaning (the end-of-turn token a cut removed)."""
    if not f.notes or any(name not in final for name in f.notes):
        return None
    return {name: (final[name][keep] > 0 if kind == "bool" else final[name][keep]) for name, kind in f.notes.items()}


def output_features(spec: CleanSpec, source_features: dict, *, multi_file: bool, source_name: str) -> tuple:
    """(features of ``dataset/``, features of ``rejects/``) of a split whose source has
    ``source_features``; a source column that the outputs need for their own is refused."""
    from lengthscan.sources.features import list_of, value

    features = dict(source_features)
    if spec.length_from:
        features[spec.length_column] = value("float64" if spec.length_from == "input_seconds" else "int64")
    if spec.tokenize:
        from lengthscan.write.token_columns import token_features

        features.update(token_features(spec.fields))
        if spec.setup.pairs is not None:
            features.update({name: list_of(value("int32")) for name in spec.setup.pairs.id_columns})
        if spec.setup.chat is not None:
            features.update({"input_ids": list_of(value("int32")), "attention_mask": list_of(value("int8")),
                             "labels": list_of(value("int32"))})
    extra = {"row": value("int64")}
    if multi_file:
        extra.update({"source_file": value("string"), "file_row": value("int64")})
    extra.update({"reason": value("string"), "reasons": list_of(value("string"))})
    taken = [name for name in extra if name in source_features]
    if taken:
        earlier = " (an earlier clean's rejects/?)" if {"row", "reason"} <= set(source_features) else ""
        raise ColumnError(f"{source_name}: has the column(s) {', '.join(taken)}{earlier}, which rejects/ adds itself; "
                          f"remove or rename them first, e.g. load_from_disk(...).remove_columns({taken!r})")
    return features, {**source_features, **extra}


def output_fingerprint(split_fingerprint: str, resolved) -> str:
    """The fingerprint of a written split: its source's, the resolved rules and the version."""
    return hashlib.sha256(json.dumps([split_fingerprint, [r.to_dict() for r in resolved],
                                      __version__]).encode()).hexdigest()[:16]
