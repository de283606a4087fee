"""One epoch's batches priced by the memory model (pure: per-row lengths in, peaks out).

The batches are those ``lengthscan.training.batches`` simulates for the installed Trainer (its random or
length-grouped order, cut into per-device batches, or ``lengthscan.training.rebalance``'s variable-size
micro-batches for ``batch_rebalance``); each batch is padded as the collators pad
it (to its longest row, rounded up to ``pad_to_multiple_of`` for tokens) and becomes one
:class:`Shape`. Which lengths go where depends on the family (:func:`layout_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthscan.memory.api import MemoryEstimate, estimate
from lengthscan.memory.families import family_of
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.stats.histograms import nearest_rank_index
from lengthscan.training.batches import TRAINER_DRAWS_BEFORE_GROUPING, Batches, grouped_batches, random_batches
from lengthscan.training.rebalance import TRAINER_REBALANCE_SEED, most_rows, rebalance_available, rebalance_batches

#: Distinct batch shapes priced one by one; beyond this, the others are priced on lengths rounded
#: up to a grid (upper bounds within 2^-bits), and only batches that could be the worst exactly.
EXACT_SHAPES = 2048
SAMPLERS = ("random", "group_by_length", "batch_rebalance")


class LayoutError(ValueError):
    """The measured fields do not fit the model family (exit code 2)."""


@dataclass(frozen=True, eq=False)
class Layout:
    """Which per-row lengths become a batch's ``Shape.input_len`` (``a``) and ``target_len`` (``b``).

    ``a``/``b``: int64 arrays or None; ``group``: what ``group_by_length`` sorts by (the Trainer's
    ``len(input_ids)``, ``len(input_values)`` or the ``length`` column ``clean`` writes);
    ``a_multiple``/``b_multiple``: ``pad_to_multiple_of`` where the side is tokens. ``a_name`` and
    ``b_name`` name the measurements (``input_tokens``, ``input_tokens+target_tokens``,
    ``input_samples``, ``target_tokens``). ``known`` marks the rows given that had every length
    used (the arrays hold only those rows).
    """

    family: str
    a: np.ndarray | None
    b: np.ndarray | None
    group: np.ndarray
    a_name: str | None
    b_name: str | None
    a_multiple: int | None = None
    b_multiple: int | None = None
    known: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.group.size)

    def pad_a(self, n):
        return None if n is None else _round_up(n, self.a_multiple)

    def pad_b(self, n):
        return None if n is None else _round_up(n, self.b_multiple)


def layout_for(config, *, input_tokens=None, target_tokens=None, input_samples=None, input_seconds=None,
               pad_to_multiple_of: int | None = None) -> Layout:
    """The layout of ``config``'s family for the rows' lengths (arrays of equal size; -1 or NaN
    where a row has none: such rows are left out when the family uses that length).

    Encoder-decoders: inputs and targets (tokens). Decoder-only: input and target concatenated
    into one sequence, labels being the inputs. Encoder-only: inputs (one label per row).
    Wav2Vec2-like: audio samples, target tokens as CTC labels. Whisper: the fixed 30 s of mel
    frames (the feature extractor pads every clip), target tokens; ``group_by_length`` sorts clips
    by samples (else seconds), as by the ``length`` column ``clean`` writes.
    """
    family = family_of(config)
    m = pad_to_multiple_of or None
    given = {"x": input_tokens, "y": target_tokens, "s": input_samples, "sec": input_seconds}
    given = {k: np.asarray(v, np.float64).ravel() for k, v in given.items() if v is not None}
    speech = family in ("speech-encoder", "speech-seq2seq")
    if speech and "x" in given:
        raise LayoutError(f"{config.model_type} takes audio (--audio COL), not text (--input)")
    if family == "speech-encoder" and "s" not in given:
        raise LayoutError(f"{config.model_type} takes audio samples: give --audio COL and a sampling rate "
                          "(--sampling-rate, or a --model with a feature extractor)")
    if family == "speech-seq2seq" and "s" not in given and "sec" not in given:
        raise LayoutError(f"{config.model_type} takes audio: give --audio COL")
    if not speech and "x" not in given:
        raise LayoutError(f"{config.model_type} takes text: give --input COL")
    if family in ("encoder-decoder", "speech-seq2seq") and "y" not in given:
        raise LayoutError(f"{config.model_type} is trained on targets: give --target COL")
    used = {"encoder-decoder": ("x", "y"), "decoder-only": ("x", "y"), "encoder-only": ("x",),
            "speech-encoder": ("s", "y"), "speech-seq2seq": ("s" if "s" in given else "sec", "y")}[family]
    used = [k for k in used if k in given]
    known = np.logical_and.reduce([~np.isnan(given[k]) & (given[k] >= 0) for k in used])
    v = {k: given[k][known] if k == "sec" else given[k][known].astype(np.int64) for k in used}
    x, y, s = v.get("x"), v.get("y"), v.get("s")
    if family == "encoder-decoder":
        return Layout(family, x, y, x, "input_tokens", "target_tokens", m, m, known)
    if family == "decoder-only":
        seq = x if y is None else x + y
        name = "input_tokens" if y is None else "input_tokens+target_tokens"
        return Layout(family, seq, None, seq, name, None, m, None, known)
    if family == "encoder-only":
        return Layout(family, x, None, x, "input_tokens", None, m, None, known)
    if family == "speech-encoder":
        return Layout(family, s, y, s, "input_samples", None if y is None else "target_tokens", None, m, known)
    return Layout(family, None, y, s if s is not None else v["sec"], None, "target_tokens", None, m, known)


@dataclass(frozen=True, eq=False)
class Epoch:
    """Every batch of one simulated epoch with its shape and predicted peak.

    ``shapes`` holds (rows, padded a, padded b, padding) per batch (-1 for a side the family does
    not have); ``peaks`` the predicted peak bytes, exact where ``exact`` is set and otherwise an
    upper bound on lengths rounded up by at most ``2**-grid_bits`` (None: all exact). ``worst`` is
    the first batch of the epoch with the highest peak; ``any_shuffle`` the batch no order can
    exceed: ``batch_size`` rows padded to the longest ``a`` and the longest ``b``.
    """

    layout: Layout
    batches: Batches
    shapes: np.ndarray
    peaks: np.ndarray
    exact: np.ndarray
    grid_bits: int | None
    worst: int
    worst_estimate: MemoryEstimate
    any_shuffle: Shape
    any_shuffle_estimate: MemoryEstimate

    def shape(self, i: int) -> Shape:
        return shape_of(self.shapes[i])

    def percentiles(self) -> dict:
        """p50, p90, p99 and max of the per-batch peaks (nearest rank)."""
        ordered = np.sort(self.peaks)
        out = {f"p{p}": int(ordered[nearest_rank_index(ordered.size, p)]) for p in (50, 90, 99)}
        out["max"] = int(ordered[-1])
        return out


def simulate_epoch(layout: Layout, batch_size: int, *, sampler: str = "random", seed: int = 42,
                   grad_accum: int = 1, drop_last: bool = False) -> Batches:
    """Epoch 0 of ``Trainer.train()`` with ``args.seed = seed`` (``data_seed`` unset, one process).

    ``batch_rebalance`` ignores ``seed``: the Trainer leaves the sampler's own (42). It needs an
    installed transformers that offers it (:class:`LayoutError` otherwise).
    """
    if sampler == "random":
        return random_batches(layout.rows, batch_size, seed=seed, drop_last=drop_last)
    if sampler == "group_by_length":
        return grouped_batches(layout.group, batch_size, grad_accum=grad_accum, seed=seed, drop_last=drop_last,
                               draws_before=TRAINER_DRAWS_BEFORE_GROUPING)
    if sampler == "batch_rebalance":
        check_sampler(sampler)
        return rebalance_batches(layout.group, batch_size, grad_accum=grad_accum, seed=TRAINER_REBALANCE_SEED,
                                 drop_last=drop_last)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, not {sampler!r}")


def check_sampler(sampler: str) -> None:
    """Raise :class:`LayoutError` when the installed transformers lacks ``sampler`` (``batch_rebalance``)."""
    if sampler not in SAMPLERS:
        raise LayoutError(f"sampler must be one of {', '.join(SAMPLERS)}, not {sampler!r}")
    if sampler == "batch_rebalance" and not rebalance_available():
        from lengthscan.training.batches import transformers_version

        version = transformers_version()
        raise LayoutError(f"--sampler batch_rebalance: the installed transformers "
                          f"({version or 'not installed'}) has no BatchRebalanceSampler "
                          "(train_sampling_strategy='batch_rebalance'); use random or group_by_length")


def batch_shapes(layout: Layout, batches: Batches) -> np.ndarray:
    """(rows, padded a, padded b, padding) of every batch, as the collators pad them."""
    order = batches.order
    if not order.size:
        raise ValueError("no rows to batch: every row lacks a length, or the source is empty")
    starts = batches.starts
    out = np.full((starts.size, 4), -1, np.int64)
    out[:, 0] = batches.sizes
    for col, values, multiple in ((1, layout.a, layout.a_multiple), (2, layout.b, layout.b_multiple)):
        if values is not None:
            out[:, col] = _round_up(np.maximum.reduceat(values[order], starts), multiple)
    # padding: some row of the batch is shorter than its padded length (the model builds masks)
    key, col = (layout.a, 1) if layout.a is not None else (layout.b, 2)
    out[:, 3] = np.minimum.reduceat(key[order], starts) < out[:, col]
    return out


def price_epoch(config, layout: Layout, batch_size: int, *, options: MemoryOptions = MemoryOptions(),
                sampler: str = "random", seed: int = 42, drop_last: bool = False,
                exact_shapes: int = EXACT_SHAPES) -> Epoch:
    """Simulate the epoch and predict every batch's peak; the worst batch is always exact.

    The peak never decreases when rows or lengths grow, so a batch whose rounded-up bound is
    below the highest exact peak cannot be the worst: batches are priced exactly in order of
    their bound until the next bound falls below the best exact peak found.
    """
    batches = simulate_epoch(layout, batch_size, sampler=sampler, seed=seed,
                             grad_accum=options.gradient_accumulation_steps, drop_last=drop_last)
    shapes = batch_shapes(layout, batches)
    memo: dict[Shape, MemoryEstimate] = {}

    def price(row) -> MemoryEstimate:
        s = shape_of(row)
        if s not in memo:
            memo[s] = estimate(config, s, options)
        return memo[s]

    bits, priced = _grid(shapes, exact_shapes)
    unique, inverse = np.unique(priced, axis=0, return_inverse=True)
    peaks = np.asarray([price(u).peak_bytes for u in unique], np.int64)[inverse.ravel()]
    exact = np.full(len(shapes), bits is None)
    if bits is not None:
        best = -1
        for i in np.argsort(-peaks, kind="stable"):
            if peaks[i] < best:
                break
            peaks[i] = price(shapes[i]).peak_bytes
            exact[i] = True
            best = max(best, int(peaks[i]))
    worst = int(np.flatnonzero(exact & (peaks == peaks[exact].max()))[0])
    rows = batch_size
    if sampler == "batch_rebalance":  # variable batch sizes: short rows come many to a batch
        rows = most_rows(layout.rows, batch_size, options.gradient_accumulation_steps)
    bound = any_shuffle_shape(layout, rows)
    return Epoch(layout, batches, shapes, peaks, exact, bits, worst, price(shapes[worst]), bound,
                 estimate(config, bound, options))


def any_shuffle_shape(layout: Layout, batch_size: int) -> Shape:
    """The batch no order exceeds: ``batch_size`` rows padded to the longest ``a`` and ``b``.

    For ``batch_rebalance`` pass the most rows a micro-batch can hold (:func:`most_rows`)."""
    a = None if layout.a is None else int(layout.pad_a(layout.a.max()))
    b = None if layout.b is None else int(layout.pad_b(layout.b.max()))
    key, top = (layout.a, a) if layout.a is not None else (layout.b, b)
    return Shape(min(batch_size, layout.rows), a, b, padding=bool(key.min() < top))


def shape_of(row) -> Shape:
    """The ``Shape`` of a row of :func:`batch_shapes`' table (rows, a, b, padding; -1: no such side)."""
    rows, a, b, padding = (int(v) for v in row)
    return Shape(rows, a if a >= 0 else None, b if b >= 0 else None, bool(padding))


def _grid(shapes: np.ndarray, limit: int):
    """(None, shapes) when few enough shapes are distinct; else the finest grid that is coarse enough."""
    if len(np.unique(shapes, axis=0)) <= limit:
        return None, shapes
    for bits in (7, 6, 5, 4, 3, 2, 1, 0):
        rounded = shapes.copy()
        for col in (1, 2):
            rounded[:, col] = _grid_up(shapes[:, col], bits)
        if len(np.unique(rounded, axis=0)) <= limit or bits == 0:
            return bits, rounded
    raise AssertionError("unreachable")


def _grid_up(values: np.ndarray, bits: int) -> np.ndarray:
    """Round positive values up to ``m * 2**e`` with ``m < 2**(bits + 1)``: at most ``2**-bits`` higher."""
    v = np.asarray(values, np.int64)
    top = np.floor(np.log2(np.maximum(v, 1))).astype(np.int64)
    step = np.left_shift(np.int64(1), np.maximum(top - bits, 0))
    return np.where(v > 0, -(-v // step) * step, v)


def _round_up(values, multiple: int | None):
    if not multiple:
        return values
    return -(-np.asarray(values) // multiple) * multiple
