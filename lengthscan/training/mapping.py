"""Batch functions for ``Dataset.map(batched=True)``: length columns with a stable fingerprint.

The function is top level and takes its options as plain values (tokenizer name and file hash,
column names), so ``datasets`` fingerprints it from names, never from a live tokenizer object,
and a changed tokenizer file gives a new fingerprint instead of a stale cache.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from lengthscan import __version__
from lengthscan.measure.batch import role_fields
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS, TokenCounter


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
    # ``_fingerprint`` is datasets' own private attribute (no public accessor): the map's cache key
    key = json.dumps([ds._fingerprint, kwargs, __version__], sort_keys=True)
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    return ds.map(token_lengths, batched=True, batch_size=batch_size, fn_kwargs=kwargs,
                  new_fingerprint=fingerprint, num_proc=num_proc, desc="lengthscan: token lengths")


def _absolute_rules(limits):
    """Rules with numeric values only: a batch function sees one batch, not the corpus."""
    from lengthscan.policy.rules import RuleError, parse_rule, resolve_rules

    rules = [parse_rule(t) for t in limits]
    for r in rules:
        if r.kind != "number" or r.parts[0] not in ("input_tokens", "target_tokens") or r.is_ratio:
            raise RuleError(f"limit rule {r.text!r}: batch functions take numeric limits on input_tokens or "
                            "target_tokens; resolve percentiles, z-scores and model limits with lengthscan.clean")
    return rules, resolve_rules


def within_limits(batch: dict, *, tokenizer: str, limits, input: str | None = None, target: str | None = None,
                  keep_empty_targets: bool = False, tokenizer_hash: str | None = None,
                  max_chars: int = DEFAULT_MAX_CHARS) -> list[bool]:
    """For ``Dataset.filter(batched=True)``: True for rows ``clean`` would keep as they are.

    ``limits`` are numeric rules (``'input_tokens<=1024'``); rows that would be truncated or
    dropped (None, empty targets, over a limit) are False.
    """
    from lengthscan.policy.rules import KEEP, decide

    counter = _counter(tokenizer, max_chars)
    rules, resolve = _absolute_rules(limits)
    resolved = resolve(rules, histograms={}, default_action="drop")
    base, flags, special = _measure(counter, batch, input, target)
    d = decide(base, flags, resolved, special=special, keep_empty_targets=keep_empty_targets)
    return (d.decision == KEEP).tolist()


def truncate_to_limits(batch: dict, *, tokenizer: str, limits, input: str | None = None,
                       target: str | None = None, tokenizer_hash: str | None = None,
                       max_chars: int = DEFAULT_MAX_CHARS) -> dict:
    """For ``Dataset.map(batched=True)``: texts over an upper token limit replaced by their longest
    verified prefix that fits (special tokens included); other texts unchanged."""
    from lengthscan.policy.rules import int_cap
    from lengthscan.write.truncate import truncate_texts

    counter = _counter(tokenizer, max_chars)
    rules, _ = _absolute_rules(limits)
    out = {}
    for f in role_fields(input=input, target=target):
        caps = [int_cap(float(r.value), r.op) for r in rules if r.metric == f.primary.name and r.upper]
        texts = list(batch[f.column])
        if not caps:
            continue
        cap = min(caps)
        lengths, _ = counter.count(texts, f.role)
        idx = [i for i, n in enumerate(lengths) if n > cap]  # None (-1) and short texts stay as they are
        if idx:
            for i, t in zip(idx, truncate_texts(counter, [texts[i] for i in idx], [cap] * len(idx), f.role)):
                texts[i] = t.text
        out[f.column] = texts
    return out


def _measure(counter, batch: dict, input, target):
    import numpy as np

    base, flags, special = {}, {}, {}
    for f in role_fields(input=input, target=target):
        lengths, codes = counter.count(batch[f.column], f.role)
        base[f.primary.name], flags[f.role] = np.asarray(lengths), np.asarray(codes)
        special[f.role] = int(counter.count([""], f.role)[0][0])
    return base, flags, special
