"""Batch functions for ``Dataset.map``: exact lengths and a fingerprint keyed by names and file hash."""

from __future__ import annotations

import shutil

from datasets import Dataset

import lengthscan
from tests.support.reference import direct_counts


def test_add_lengths_values_and_stable_fingerprint(tmp_path, corpus_rows, bpe_dir):
    rows = corpus_rows[:200]
    ds = Dataset.from_list(rows)
    a = lengthscan.add_lengths(ds, tokenizer=str(bpe_dir), input="text", target="summary")
    b = lengthscan.add_lengths(ds, tokenizer=str(bpe_dir), input="text", target="summary")
    assert a._fingerprint == b._fingerprint
    assert a["input_tokens"] == direct_counts(bpe_dir, [r["text"] for r in rows], "input")
    assert a["target_tokens"] == direct_counts(bpe_dir, [r["summary"] for r in rows], "target")

    # same name, changed tokenizer files: a new fingerprint, never a stale cache
    copy = tmp_path / "tok"
    shutil.copytree(bpe_dir, copy)
    c1 = lengthscan.add_lengths(ds, tokenizer=str(copy), input="text")
    cfg = copy / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("256", "300"))
    lengthscan.training.mapping._counter.cache_clear()
    c2 = lengthscan.add_lengths(ds, tokenizer=str(copy), input="text")
    assert c1._fingerprint != c2._fingerprint


def test_token_lengths_is_a_plain_batch_function(bpe_dir):
    out = lengthscan.token_lengths({"text": ["hello", None, ""]}, tokenizer=str(bpe_dir), input="text")
    assert out["input_tokens"][1] is None
    assert out["input_tokens"][0] == direct_counts(bpe_dir, ["hello"], "input")[0]
    assert out["input_tokens"][2] == 2


def test_library_audit_on_a_dataset(corpus_rows, bpe_dir):
    ds = Dataset.from_list(corpus_rows[:300])
    result = lengthscan.audit(ds, tokenizer=str(bpe_dir), input="text", target="summary")
    assert result.splits[0].sample.full
    stats = result.split("train").field("input_tokens")
    expected = [v for v in direct_counts(bpe_dir, ds["text"], "input") if v is not None]
    assert stats.summary().max == max(expected) and stats.histogram.n == len(expected)
    d = result.to_dict()
    assert d["splits"][0]["fields"]["input_tokens"]["max"] == max(expected)
    import dataclasses

    assert dataclasses.is_dataclass(result)
    try:
        result.seed = 3
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("AuditResult must be frozen")


def test_within_limits_and_truncate_to_limits(corpus_rows, bpe_dir):
    from transformers import AutoTokenizer

    rows = [r for r in corpus_rows[:300] if r["text"] and r["summary"]]
    ds = Dataset.from_list(rows)
    kw = {"tokenizer": str(bpe_dir), "input": "text", "target": "summary",
          "limits": ["input_tokens<=64", "target_tokens<=16"]}
    kept = ds.filter(lengthscan.within_limits, batched=True, fn_kwargs=kw)
    x = direct_counts(bpe_dir, ds["text"], "input")
    y = direct_counts(bpe_dir, ds["summary"], "target")
    assert kept["text"] == [r["text"] for r, a, b in zip(rows, x, y) if a <= 64 and 2 < b <= 16]
    cut = ds.map(lengthscan.truncate_to_limits, batched=True, fn_kwargs=kw)
    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    for original, text, summary in zip(rows, cut["text"], cut["summary"]):
        assert original["text"].startswith(text) and len(tok(text)["input_ids"]) <= 64
        assert original["summary"].startswith(summary) and len(tok(text_target=summary)["input_ids"]) <= 16
    import pytest

    from lengthscan.policy.rules import RuleError

    with pytest.raises(RuleError, match="numeric limits"):
        lengthscan.within_limits({"text": ["a"]}, tokenizer=str(bpe_dir), input="text", limits=["input_tokens<=p99"])
