"""Padding and batches as the transformers ``Trainer`` builds them: pure numpy, torch optional.

The installed transformers (5.x) orders a training epoch by ``train_sampling_strategy``:

- ``"random"``: a ``RandomSampler``, which accelerate's ``prepare`` replaces by a
  ``SeedableRandomSampler``; epoch ``e`` is ``torch.randperm(n, generator=Generator().manual_seed(s + e))``
  with ``s = data_seed`` or, when that is unset, ``args.seed`` (``set_seed`` ran in ``Trainer.__init__``).
- ``"group_by_length"``: ``LengthGroupedSampler(train_batch_size * gradient_accumulation_steps)`` with
  no generator: ``get_length_grouped_indices`` draws its permutation from torch's global RNG, which the
  DataLoader iterator has advanced by one int64 draw (its worker base seed) just before.

Either order is cut into DataLoader batches of ``per_device_train_batch_size``, and each batch is
padded to its longest member rounded up to ``pad_to_multiple_of`` (inputs by ``tokenizer.pad``,
labels by ``DataCollatorForSeq2Seq`` with -100), so a batch holds rows x padded length positions.
``"batch_rebalance"`` (variable batch sizes) is :func:`lengthscan.training.rebalance.rebalance_batches`; the
report's :func:`simulate` compares the first two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lengthscan.stats.histograms import nearest_rank_index

#: Global-RNG draws between ``set_seed`` and the grouped sampler inside ``Trainer.train()``: the
#: DataLoader iterator's ``_base_seed`` (torch/utils/data/dataloader.py, ``_BaseDataLoaderIter``).
TRAINER_DRAWS_BEFORE_GROUPING = 1


@dataclass(frozen=True, eq=False)
class Batches:
    """An epoch's batches: batch ``i`` is ``order[i * batch_size : (i + 1) * batch_size]``.

    ``order`` holds row positions (0..n-1) in the order the sampler yields them, without the rows
    ``drop_last`` dropped. ``batch_size`` is the DataLoader batch (per device); ``group_size`` is
    the batch the grouping used (per device x gradient accumulation, as the Trainer passes it).
    ``offsets`` (variable batch sizes, ``batch_rebalance``): batch ``i`` is
    ``order[offsets[i]:offsets[i + 1]]``, ``batch_size`` then being the nominal per-device batch.
    """

    strategy: str
    batch_size: int
    group_size: int
    order: np.ndarray
    offsets: np.ndarray | None = None

    @property
    def starts(self) -> np.ndarray:
        """Where each batch starts in ``order``."""
        if self.offsets is not None:
            return self.offsets[:-1]
        return np.arange(0, self.order.size, self.batch_size)

    @property
    def indices(self) -> list[np.ndarray]:
        """Row positions of each batch, in order (views into ``order``)."""
        if self.offsets is not None:
            return np.split(self.order, self.offsets[1:-1]) if len(self) else []
        return [self.order[i:i + self.batch_size] for i in range(0, self.order.size, self.batch_size)]

    @property
    def sizes(self) -> np.ndarray:
        """Rows in each batch (the last one may be short)."""
        if self.offsets is not None:
            return np.diff(self.offsets).astype(np.int64)
        full, rest = divmod(self.order.size, self.batch_size)
        return np.asarray([self.batch_size] * full + ([rest] if rest else []), np.int64)

    def __getitem__(self, i: int) -> np.ndarray:
        """Row positions of batch ``i``."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        i %= len(self)
        if self.offsets is not None:
            return self.order[self.offsets[i]:self.offsets[i + 1]]
        return self.order[i * self.batch_size:(i + 1) * self.batch_size]

    def __len__(self) -> int:
        if self.offsets is not None:
            return self.offsets.size - 1
        return (self.order.size + self.batch_size - 1) // self.batch_size

    def padded_lengths(self, lengths, pad_to_multiple_of: int | None = None) -> np.ndarray:
        """The padded length of every batch: its longest row, rounded up to ``pad_to_multiple_of``."""
        if not self.order.size:
            return np.zeros(0, np.asarray(lengths).dtype)
        longest = np.maximum.reduceat(np.asarray(lengths)[self.order], self.starts)
        return _round_up(longest, pad_to_multiple_of)


def permutation(n: int, seed: int, *, draws_before: int = 0) -> np.ndarray:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))``, exactly, without torch.

    torch's CPU generator is a 32-bit Mersenne Twister seeded like numpy's legacy ``MT19937``, and
    its ``randperm`` is a Fisher-Yates shuffle taking one 32-bit output modulo ``n - i`` per step;
    an int64 ``random_()`` draw (``draws_before``, see ``TRAINER_DRAWS_BEFORE_GROUPING``) consumes two
    outputs. Tests compare this with torch itself when it is installed. Doing it in numpy keeps a
    cached rerun from importing torch (seconds) just to order an epoch.
    """
    return _permutation(int(n), int(seed), int(draws_before)).copy()


@functools.lru_cache(maxsize=8)
def _permutation(n: int, seed: int, draws_before: int) -> np.ndarray:
    """:func:`permutation`, kept for the report's several batch sizes over the same rows."""
    bits = np.random.MT19937()
    bits._legacy_seeding(int(seed))  # numpy's own private: RandomState(seed)'s seeding, torch's too
    if draws_before:
        bits.random_raw(2 * int(draws_before))
    raw = bits.random_raw(max(int(n) - 1, 0)).astype(np.uint64)
    steps = (raw % np.arange(int(n), 1, -1, dtype=np.uint64)).astype(np.int64)
    order = list(range(int(n)))  # a list: element swaps cost a tenth of numpy's
    for i, z in enumerate(steps.tolist()):
        j = i + z
        order[i], order[j] = order[j], order[i]
    return np.array(order, dtype=np.int64)


def exact_permutation() -> bool:
    """The permutation is torch's own (reproduced in numpy), whether or not torch is installed."""
    return True


def random_batches(n: int, batch_size: int, *, seed: int = 0, drop_last: bool = False) -> Batches:
    """``RandomSampler(generator=Generator().manual_seed(seed))`` cut into batches of ``batch_size``."""
    check_batch_size(batch_size)
    return _cut("random", batch_size, batch_size, permutation(n, seed), drop_last)


def grouped_batches(lengths, batch_size: int, *, grad_accum: int = 1, seed: int = 0, drop_last: bool = False,
                    mega_batch_mult: int | None = None, draws_before: int = 0) -> Batches:
    """``LengthGroupedSampler`` cut into DataLoader batches: a port of ``get_length_grouped_indices``.

    The permutation is split into megabatches of ``mega_batch_mult * group`` rows (``group`` =
    ``batch_size * grad_accum``; default multiplier ``min(n // (group * 4), 50)``, at least 1), each
    sorted longest first (stably, as Python's ``sorted(reverse=True)``), then the longest row of all
    is swapped to the very front, so the first batch holds it (an OOM shows at step 0).
    """
    check_batch_size(batch_size)
    lengths = as_lengths(lengths)
    group = batch_size * grad_accum
    n = lengths.size
    if mega_batch_mult is None:
        mega_batch_mult = max(min(n // (group * 4), 50), 1)
    size = mega_batch_mult * group
    megabatches = []
    for chunk in np.split(permutation(n, seed, draws_before=draws_before), np.arange(size, n, size)):
        megabatches.append(chunk[np.argsort(-lengths[chunk], kind="stable")])
    if n:
        # np.argmax, like torch.argmax, picks the first megabatch among equal maxima.
        top = int(np.argmax([lengths[m[0]] for m in megabatches]))
        megabatches[0][0], megabatches[top][0] = megabatches[top][0], megabatches[0][0]
    order = np.concatenate(megabatches) if megabatches else np.zeros(0, np.int64)
    return _cut("group_by_length", batch_size, group, order, drop_last)


def padded_shape(batch_lengths, pad_to_multiple_of: int | None = None):
    """The padded length of one batch: its longest row, rounded up to a multiple of ``pad_to_multiple_of``.

    As ``tokenizer.pad(padding=True)`` for inputs and ``DataCollatorForSeq2Seq`` for labels.
    """
    return _round_up(np.max(np.asarray(batch_lengths)), pad_to_multiple_of).item()


def simulate(input_lengths, target_lengths=None, *, batch_sizes=(8, 16, 32), seed: int = 0, grad_accum: int = 1,
             pad_to_multiple_of: int | None = None, rows=None, unit: str = "tokens", drop_last: bool = False,
             as_trainer: bool = True) -> dict:
    """Padding share, largest and median padded batch per strategy and batch size: ``report.json["batches"]``.

    ``rows`` are the row ids reported for each position (default 0..n-1). Rows without a length
    (negative or NaN, on either side) are left out and counted. ``unit="seconds"``: float input
    lengths of audio, padded to the longest clip (no ``pad_to_multiple_of``). ``as_trainer``: draw the
    orders ``Trainer.train()`` uses in epoch 0 with ``args.seed=seed`` (one process, ``data_seed``
    unset); else both with ``Generator().manual_seed(seed)``, as samplers given that generator.
    """
    if unit not in ("tokens", "seconds"):
        raise ValueError(f"unit must be 'tokens' or 'seconds', not {unit!r}")
    if unit == "seconds" and pad_to_multiple_of:
        raise ValueError("pad_to_multiple_of applies to tokens, not to seconds of audio")
    inputs, known = _known(input_lengths, seconds=unit == "seconds")
    targets = None
    if target_lengths is not None:
        targets, known_target = _known(target_lengths, seconds=False)
        known &= known_target
        targets = targets[known]
    rows = np.arange(known.size) if rows is None else np.asarray(rows)
    inputs, rows = inputs[known], rows[known]
    out = {"rows": int(known.size), "simulated_rows": int(inputs.size), "left_out": int((~known).sum()),
           "seed": seed, "grad_accum": grad_accum, "pad_to_multiple_of": pad_to_multiple_of, "unit": unit,
           "exact_permutation": exact_permutation(), "transformers": transformers_version(),
           "drop_last": drop_last, "as_trainer": as_trainer, "by_batch_size": []}
    draws = TRAINER_DRAWS_BEFORE_GROUPING if as_trainer else 0
    for bs in batch_sizes:
        orders = {"random": random_batches(inputs.size, bs, seed=seed, drop_last=drop_last),
                  "group_by_length": grouped_batches(inputs, bs, grad_accum=grad_accum, seed=seed,
                                                     drop_last=drop_last, draws_before=draws)}
        out["by_batch_size"].append({
            "batch_size": bs, "effective_batch_size": bs * grad_accum,
            "strategies": {name: _summary(b, inputs, targets, rows, pad_to_multiple_of, seconds=unit == "seconds")
                           for name, b in orders.items()},
            "worst_case": _worst_case(bs, inputs, targets, rows, pad_to_multiple_of)})
    return out


# -- parts -------------------------------------------------------------------------------------------------------

def _summary(batches: Batches, inputs, targets, rows, multiple, *, seconds: bool) -> dict:
    """Padding shares, the largest and the median batch, for one order."""
    sides = {"input": inputs, "target": targets}
    real, padded, largest, largest_rows, median = {}, {}, {}, {}, {}
    for side, lengths in sides.items():
        positions = np.zeros(0) if lengths is None else batches.sizes * batches.padded_lengths(lengths, multiple)
        k = int(np.argmax(positions)) if positions.size else None
        largest[side] = None if k is None else _plain(positions[k])
        largest_rows[f"{side}_rows"] = None if k is None else rows[batches[k]].tolist()
        median[side] = _plain(np.sort(positions)[nearest_rank_index(positions.size, 50)]) if positions.size else None
        if lengths is not None:
            real[side], padded[side] = lengths[batches.order].sum(), positions.sum()
    share = {side: _share(real[side], padded[side]) if side in real else None for side in sides}
    # Seconds of audio and target tokens do not add up to one share; each side keeps its own.
    mixed = seconds and targets is not None
    overall = None if mixed else _share(sum(real.values()), sum(padded.values()))
    return {"padding_share": overall,
            "input_padding_share": share["input"], "target_padding_share": share["target"],
            "largest_batch": largest | largest_rows, "median_batch": median, "batches": len(batches)}


def _worst_case(bs: int, inputs, targets, rows, multiple) -> dict:
    """What any shuffle can produce: ``bs`` rows padded to the longest row (the batch that holds it)."""
    out = {"input": None, "target": None, "input_row": None, "target_row": None}
    for side, lengths in (("input", inputs), ("target", targets)):
        if lengths is not None and lengths.size:
            k = int(np.argmax(lengths))
            out[side] = _plain(min(bs, lengths.size) * _round_up(lengths[k], multiple))
            out[f"{side}_row"] = rows[k].item()
    return out


def _cut(strategy: str, batch_size: int, group_size: int, order: np.ndarray, drop_last: bool) -> Batches:
    if drop_last:
        order = order[: order.size - order.size % batch_size]
    return Batches(strategy, batch_size, group_size, np.asarray(order, np.int64))


def _round_up(length, multiple: int | None):
    if not multiple:
        return length
    return -(-np.asarray(length) // multiple) * multiple


def as_lengths(values) -> np.ndarray:
    """Lengths as a flat array: float64 if they are seconds (a float dtype), else int64 tokens."""
    arr = np.asarray(values).ravel()
    return arr.astype(np.float64) if arr.dtype.kind == "f" else arr.astype(np.int64)


def _known(values, *, seconds: bool) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (float seconds or int tokens) and which rows have one: -1 and NaN (a null column) do not."""
    arr = np.asarray(values, np.float64).ravel()
    known = ~np.isnan(arr) & (arr >= 0)
    return (arr if seconds else np.where(known, arr, -1).astype(np.int64)), known


def _share(real, padded) -> float | None:
    # The share of positions that are padding; None for an empty epoch rather than 0/0.
    return None if not padded else round(float(1 - real / padded), 6)


def _plain(value):
    """A numpy scalar as a plain int (tokens) or float (seconds), for report.json."""
    return value.item() if hasattr(value, "item") else value


def check_batch_size(batch_size: int) -> None:
    """Raise ``ValueError`` unless ``batch_size`` is a positive integer."""
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")


def transformers_version() -> str | None:
    """The installed transformers' version, or None; read from the package metadata, since
    importing transformers would take seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None
