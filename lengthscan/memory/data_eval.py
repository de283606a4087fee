"""Data mode's evaluation loop: ``Trainer.evaluate`` over another split of the training source
(``--eval-split``) or another source (``--eval-source``), its rows measured by the same audit
(same fields, tokenizer, model; cached lengths reused), batched in dataset order (the Trainer's
sequential sampler, ``dataloader_drop_last=False``), each batch padded as the collators pad (same
``pad_to_multiple_of``), and priced by :mod:`lengthscan.memory.evaluation` over those real batches.
Rows without a length are left out, as ``clean`` drops them.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lengthscan.memory.epoch import LayoutError, batch_shapes, layout_for, shape_of
from lengthscan.memory.evaluation import EvalOptions, report
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.training.batches import Batches

#: the split of ``--eval-source`` evaluated on, the first of these it has (else its first split)
EVAL_SPLITS = ("validation", "valid", "dev", "val", "test", "eval")


@dataclass(frozen=True)
class EvalData:
    """The evaluation data mode prices: ``split`` of the training source, or ``source`` (its ``split``
    if given, else the first of :data:`EVAL_SPLITS` it has, else its first split)."""

    options: EvalOptions
    split: str | None = None
    source: object = None

    def __post_init__(self):
        if self.split is not None and self.source is not None:
            raise LayoutError("give --eval-split (a split of SRC) or --eval-source (another source), not both")

    def resolve(self, train_source) -> tuple[object, str]:
        """The source and split evaluated on; an unknown split or a missing choice raises :class:`LayoutError`."""
        from lengthscan.sources.opener import open_source

        source = self.source if self.source is not None else train_source
        names = [s.name for s in open_source(source).splits]
        listed = ", ".join(names)
        if self.split is None and self.source is None:
            raise LayoutError(f"data mode evaluates another split or source: give --eval-split NAME (SRC has "
                              f"{listed}) or --eval-source PATH")
        if self.split is None:
            return source, next((n for n in EVAL_SPLITS if n in names), names[0])
        if self.split not in names:
            raise LayoutError(f"--eval-split {self.split}: SRC has no such split; it has {listed}")
        return source, self.split


def read_lengths(path: Path, split: str) -> tuple[np.ndarray, dict, int]:
    """Source row ids and every length column of the split, in row order (-1 or NaN: none)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if "split" in table.column_names:
        table = table.filter(pc.equal(table["split"], split))
    table = table.sort_by("row")
    names = [n for n in ("input_tokens", "target_tokens", "input_samples", "input_seconds") if n in table.column_names]
    if "input_samples" in names:
        names.remove("input_seconds")  # seconds only where samples are unknown (no sampling rate)
    arrays = {n: np.asarray(table[n].to_numpy(zero_copy_only=False), np.float64) for n in names}
    if "sequence_tokens" in table.column_names:  # a conversation: the model's input is the rendered sequence
        arrays["input_tokens"] = np.asarray(table["sequence_tokens"].to_numpy(zero_copy_only=False), np.float64)
    return np.asarray(table["row"]), {n: np.nan_to_num(a, nan=-1.0) if n != "input_seconds" else a
                                      for n, a in arrays.items()}, table.num_rows


def sequential_shapes(layout, batch_size: int) -> list[Shape]:
    """The evaluation batches of ``layout``'s rows in dataset order, padded as the collators pad."""
    order = np.arange(layout.rows, dtype=np.int64)
    table = batch_shapes(layout, Batches("sequential", batch_size, batch_size, order))
    return [shape_of(row) for row in table]


def price_evaluation(config, evaluation: EvalData, at: tuple, audit_args: dict, *, options: MemoryOptions,
                     pad_to_multiple_of: int | None, usable: int | None, train_source) -> dict:
    """``report.json["memory"]["evaluation"]`` in data mode: the audit of ``at`` (source, split) with the
    training run's ``audit_args``, its rows batched in order and the loop priced over them."""
    from lengthscan.engines.api import audit

    source, split = at
    work = Path(tempfile.mkdtemp(prefix="lengthscan-eval-"))
    try:
        audit(source, split=split, out=work / "audit", **audit_args)
        rows, lengths, total = read_lengths(work / "audit" / "lengths.parquet", split)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    layout = layout_for(config, pad_to_multiple_of=pad_to_multiple_of, **lengths)
    rows = rows[layout.known]
    if not layout.rows:
        raise LayoutError(f"the evaluation split {split} has no row with a length to evaluate on")
    shapes = sequential_shapes(layout, evaluation.options.batch_size)
    out = report(config, shapes, options, evaluation.options, usable,
                 rebatch=lambda size: sequential_shapes(layout, size))
    starts = np.arange(0, layout.rows, evaluation.options.batch_size)

    def batch(k):
        return None if k is None else {"index": k, "rows": rows[starts[k]:starts[k] + shapes[k].batch_size].tolist(),
                                       "shape": shapes[k].to_dict()}

    out.update(mode="data", split=split, source=None if source is train_source else str(source),
               source_rows=total, left_out=total - layout.rows, pad_to_multiple_of=pad_to_multiple_of,
               sides={k: v for k, v in (("input_len", layout.a_name), ("target_len", layout.b_name)) if v},
               peak_batch=batch(out["peak_step"]), breaking_batch=batch(out["breaking_step"]))
    return out


def summary_lines(ev: dict) -> list[str]:
    """Data mode's evaluation in a few terminal lines."""
    from lengthscan.memory.evaluation import summary_lines as loop_lines

    where = f"split {ev['split']}" + (f" of {ev['source']}" if ev["source"] else "")
    n = ev["left_out"]
    left = f"; {n:,} row{'' if n == 1 else 's'} without a length left out" if n else ""
    lines = loop_lines(ev)
    lines[0] = lines[0].replace("evaluation (", f"evaluation on {where} (", 1) + left
    shape = ev["peak_batch"]["shape"]
    lines.insert(1, f"  peak batch #{ev['peak_batch']['index']}: {shape['batch_size']} rows x "
                    + " x ".join(f"{shape[k]:,} {name}" for k, name in ev["sides"].items() if shape.get(k)))
    if ev["breaking_batch"]:
        lines.append(f"  breaking batch rows: {', '.join(map(str, ev['breaking_batch']['rows'][:16]))}")
    return lines
