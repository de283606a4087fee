"""Batch functions for ``Dataset.map(batched=True)``: length columns with a stable fingerprint.

The function is top level and takes its options as plain values (tokenizer name and file hash,
column names), so ``datasets`` fingerprints it from names, never from a live tokenizer object,
and a changed tokenizer file gives a new fingerprint instead of a stale cache.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from . import __version__
from .measure import role_fields
from .tokens import DEFAULT_MAX_CHARS, TokenCounter


@lru_cache(maxsize=8)
def _counter(tokenizer: str, max_chars: int) -> TokenCounter:
    return TokenCounter(tokenizer, max_chars=max_chars)


def token_lengths(batch: dict, *, tokenizer: str, tokenizer_hash: str | None = None, input: str | None = None,
                  target: str | None = None, max_chars: int = DEFAULT_MAX_CHARS) -> dict:
    """Length columns (``input_tokens``, ``target_tokens``) for one batch; None where missing.

    ``tokenizer_hash`` is not used to count: it is there so that the map fingerprint changes
    when the tokenizer's files do (``add_lengths`` fills it in).
    """
    counter = _counter(tokenizer, max_chars)
    out = {}
    for f in role_fields(input=input, target=target):
        lengths, _ = counter.count(batch[f.column], f.role)
        out[f.primary.name] = [int(v) if v >= 0 else None for v in lengths]
    return out


def add_lengths(dataset, *, tokenizer: str, input: str | None = None, target: str | None = None,
                max_chars: int = DEFAULT_MAX_CHARS, batch_size: int = 1000, num_proc: int | None = None):
    """``dataset`` (Dataset or DatasetDict) with ``input_tokens``/``target_tokens`` columns added."""
    from datasets import DatasetDict

    counter = _counter(str(tokenizer), max_chars)
    kwargs = dict(tokenizer=str(tokenizer), tokenizer_hash=counter.hash, input=input, target=target,
                  max_chars=max_chars)
    if isinstance(dataset, DatasetDict):
        return DatasetDict({k: _map(v, kwargs, batch_size, num_proc) for k, v in dataset.items()})
    return _map(dataset, kwargs, batch_size, num_proc)


def _map(ds, kwargs: dict, batch_size: int, num_proc):
    key = json.dumps([ds._fingerprint, kwargs, __version__], sort_keys=True)
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    return ds.map(token_lengths, batched=True, batch_size=batch_size, fn_kwargs=kwargs,
                  new_fingerprint=fingerprint, num_proc=num_proc, desc="lengthscan: token lengths")
