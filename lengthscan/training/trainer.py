"""Train on a lengthscan-cleaned dataset with the transformers ``Trainer``: length column, caps, sampler.

What the installed Trainer (transformers 5) does with a ``length`` column, and why each piece here
exists:

1. ``train_sampling_strategy="group_by_length"`` builds a ``LengthGroupedSampler`` from
   ``dataset[length_column_name]`` when that column exists, else it reads every row to measure
   ``len(row[model_input_names[0]])``.
2. Before the sampler is built, ``remove_unused_columns=True`` (the default) removes every column
   the model's ``forward`` does not name, ``length`` included: the column is gone and the data is
   rescanned. ``trainer_length_kwargs`` therefore also turns that removal off.
3. With the removal off, every remaining column reaches the collator, and ``tokenizer.pad`` turns
   ``length`` into a tensor that is passed to ``model(**batch)``; models taking ``**kwargs`` accept
   it without a word. ``LengthCappedCollator`` drops it (and caps the lengths on the way).

torch is imported only where a tensor or the sampler needs it, never at module level.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import numpy as np

#: The lengthscan measurement a ``length`` column is made from unless told otherwise.
DEFAULT_LENGTH_FROM = "input_tokens"

#: Keys on the target side, capped by ``max_target_tokens``. ``decoder_input_ids`` is the labels
#: shifted right, so cutting it at the same cap keeps it aligned with the cut labels.
TARGET_KEYS = ("labels", "label", "decoder_input_ids", "decoder_attention_mask")

#: Of the target keys, those whose final token (EOS) ``keep_eos`` keeps.
LABEL_KEYS = ("labels", "label")


class LengthCappedCollator:
    """Cut every feature to the caps, drop bookkeeping columns, then call the wrapped collator.

    ``input_ids`` and every other input-side key of the same length (``attention_mask``,
    ``token_type_ids``, ``special_tokens_mask`` ...) are cut to ``max_input_tokens``; ``labels``
    (and ``decoder_input_ids``/``decoder_attention_mask`` when present) to ``max_target_tokens``.
    Cutting happens before padding, so no padded batch is longer than the caps, whatever the data
    holds. ``keep_eos`` keeps a cut label sequence ending in its original final token (EOS): the
    last kept label is replaced by it. ``keep_eos_input`` does the same for the inputs, across all
    their same-length keys, so the attention mask and token types stay aligned with the EOS.
    ``drop_columns`` (``length`` by default) are removed, because a collator pads every key it is
    given and the model would receive them. Features are a list of dicts, as the Trainer passes
    them; the caller's dicts are not modified.
    """

    def __init__(self, collator, *, max_input_tokens: int | None = None, max_target_tokens: int | None = None,
                 drop_columns: Sequence[str] = ("length",), keep_eos: bool = True, keep_eos_input: bool = True):
        for name, cap in (("max_input_tokens", max_input_tokens), ("max_target_tokens", max_target_tokens)):
            if cap is not None and (not isinstance(cap, (int, np.integer)) or cap < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {cap!r}")
            problem = _padded_beyond(collator, cap)
            if problem:
                raise ValueError(f"{name}={cap}, but the wrapped collator {problem}; "
                                 f"choose a cap it pads exactly, so no batch exceeds it")
        self.collator = collator
        self.max_input_tokens = max_input_tokens
        self.max_target_tokens = max_target_tokens
        self.drop_columns = frozenset([drop_columns] if isinstance(drop_columns, str) else drop_columns)
        self.keep_eos = keep_eos
        self.keep_eos_input = keep_eos_input

    def __call__(self, features: list[dict]) -> dict:
        return self.collator([self.cap(f) for f in features])

    def cap(self, feature: Mapping) -> dict:
        """One feature cut to the caps, without the dropped columns (a new dict)."""
        out = {k: v for k, v in feature.items() if k not in self.drop_columns}
        n_input = len(out["input_ids"]) if _is_sequence(out.get("input_ids")) else None
        for key, value in out.items():
            if not _is_sequence(value):
                continue
            if key in TARGET_KEYS:
                out[key] = _cut(value, self.max_target_tokens, self.keep_eos and key in LABEL_KEYS)
            elif n_input is not None and len(value) == n_input:
                out[key] = _cut(value, self.max_input_tokens, self.keep_eos_input)
        return out

    def __repr__(self) -> str:
        return (f"LengthCappedCollator({self.collator!r}, max_input_tokens={self.max_input_tokens}, "
                f"max_target_tokens={self.max_target_tokens}, drop_columns={sorted(self.drop_columns)})")


def _is_sequence(value) -> bool:
    # token sequences come as lists, numpy arrays or tensors (a formatted Dataset); text is not one
    shape = getattr(value, "shape", None)
    if shape is not None:
        return len(shape) >= 1
    return isinstance(value, (list, tuple))


def _cut(value, cap: int | None, keep_last: bool):
    """``value[:cap]``, or ``value[:cap-1] + value[-1:]`` when ``keep_last``; same type as ``value``."""
    if cap is None or len(value) <= cap:
        return value
    if not keep_last:
        return value[:cap]
    if isinstance(value, (list, tuple)):
        return list(value[:cap - 1]) + [value[-1]]
    if isinstance(value, np.ndarray):
        return np.concatenate([value[:cap - 1], value[-1:]])
    import torch  # the only other sequence type a Dataset hands out

    return torch.cat([value[:cap - 1], value[-1:]])


def _padded_beyond(collator, cap: int | None) -> str | None:
    """Why ``collator`` would pad a batch cut to ``cap`` past ``cap`` (None when it would not)."""
    if cap is None:
        return None
    multiple = getattr(collator, "pad_to_multiple_of", None)
    if multiple and cap % multiple:
        return f"has pad_to_multiple_of={multiple} (a {cap}-token batch becomes {-(-cap // multiple) * multiple})"
    if getattr(collator, "padding", None) == "max_length":  # PaddingStrategy is a str enum
        target = getattr(collator, "max_length", None)
        if target is None:
            target = getattr(getattr(collator, "tokenizer", None), "model_max_length", None)
        if target is not None and target > cap:
            return f"pads every batch to max_length={target}"
    return None


def add_length_column(dataset, *, lengths=None, column: str = "length", from_column: str | None = None,
                      overwrite: bool = False):
    """``dataset`` with an int64 ``column`` the Trainer's length-grouped sampler reads.

    The values are ``lengths`` (one per row: a list or array, e.g. from ``lengths.parquet``) or a
    copy of ``from_column`` (default ``input_tokens``, as ``add_lengths`` writes it; name
    ``target_tokens`` or ``input_samples`` to group by those). An existing ``column`` raises
    ``ValueError`` unless ``overwrite=True``, so a length computed some other way is never replaced
    silently. Missing, negative or fractional lengths raise ``ValueError`` naming the first row:
    the sampler sorts by them and cannot place a row without one. A ``DatasetDict`` is handled
    split by split (from a column only).
    """
    from datasets import DatasetDict, Value

    if lengths is not None and from_column is not None:
        raise ValueError("give lengths= or from_column=, not both")
    if isinstance(dataset, DatasetDict):
        if lengths is not None:
            raise ValueError("lengths= needs a single Dataset; for a DatasetDict use from_column=")
        return DatasetDict({name: add_length_column(split, column=column, from_column=from_column,
                                                    overwrite=overwrite) for name, split in dataset.items()})
    if column in dataset.column_names and not overwrite:
        raise ValueError(f"the dataset already has a {column!r} column; pass overwrite=True to replace it, "
                         f"or column= another name (and the same length_column_name to the Trainer)")
    source = "lengths"
    if lengths is None:
        source = from_column or DEFAULT_LENGTH_FROM
        if source not in dataset.column_names:
            raise ValueError(f"no {source!r} column to take lengths from; columns: {', '.join(dataset.column_names)}")
        lengths = list(dataset[source])
    values = _as_lengths(lengths, len(dataset), source)
    if column in dataset.column_names:
        dataset = dataset.remove_columns(column)
    return dataset.add_column(column, values, feature=Value("int64"))


def _as_lengths(lengths, n_rows: int, source: str) -> np.ndarray:
    """``lengths`` as int64 with one value a row, or ValueError naming the first bad row."""
    if len(lengths) != n_rows:
        raise ValueError(f"{len(lengths)} lengths for {n_rows} rows")
    raw = np.asarray([np.nan if v is None else v for v in lengths], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(raw) | (raw < 0) | (raw != np.floor(raw)))
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"row {row} has no usable length in {source} ({lengths[row]!r}); "
                         f"{bad.size} such rows: filter or fill them first")
    return raw.astype(np.int64)


def trainer_length_kwargs(column: str = "length", *, args_class=None) -> dict:
    """``TrainingArguments`` keywords that make the installed Trainer group batches by ``column``.

    The spelling is read from the ``TrainingArguments`` signature (``args_class`` to check another
    class): transformers 5 has ``train_sampling_strategy="group_by_length"``, 4.x has
    ``group_by_length=True``. ``remove_unused_columns=False`` keeps ``column`` until the sampler
    reads it; pair it with ``LengthCappedCollator`` so the column never reaches the model.
    """
    if args_class is None:
        from transformers import TrainingArguments as args_class
    params = inspect.signature(args_class).parameters
    if "train_sampling_strategy" in params:
        grouping = {"train_sampling_strategy": "group_by_length"}
    elif "group_by_length" in params:
        grouping = {"group_by_length": True}
    else:
        raise RuntimeError(f"{args_class.__name__} has neither train_sampling_strategy nor group_by_length")
    missing = [p for p in ("length_column_name", "remove_unused_columns") if p not in params]
    if missing:
        raise RuntimeError(f"{args_class.__name__} has no {', '.join(missing)}")
    return {**grouping, "length_column_name": column, "remove_unused_columns": False}


def length_grouped_sampler(dataset, batch_size: int, *, column: str = "length", generator=None):
    """A transformers ``LengthGroupedSampler`` over ``dataset[column]``, read once as a list of ints.

    The Trainer hands the sampler ``dataset[column]`` as it is; with datasets >= 4 that is a lazy
    ``Column``, which the sampler indexes row by row every epoch (about four times slower than a
    list). This reads the column once. Needs torch.
    """
    from transformers.trainer_pt_utils import LengthGroupedSampler

    if column not in dataset.column_names:
        raise ValueError(f"no {column!r} column; columns: {', '.join(dataset.column_names)}")
    lengths = [int(v) for v in dataset.with_format(None)[column]]
    return LengthGroupedSampler(batch_size, lengths=lengths, generator=generator)
