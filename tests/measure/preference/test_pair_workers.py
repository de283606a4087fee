"""Preference pairs and RL prompts with ``--num-proc``: worker processes that hold no tokenizer
render batches (``TemplateRows.apart``, ``TextsJob``); this process tokenizes what they rendered
(``measure(rendered=...)``) and measures a batch itself whenever the workers are behind. Every
row, its reason and its prepared ids as in one process."""

from __future__ import annotations

import pickle

import pyarrow.parquet as pq
import pytest

import lengthscan
from lengthscan.measure.preference.counter import PairCounter
from lengthscan.measure.preference.pairs import PairFormat
from lengthscan.measure.preference.render import Failed, TextsJob
from lengthscan.measure.text.counter import TokenCounter
from tests.support.chat import trl_template, write_jsonl


def _pairs(docs: list[str]) -> list[dict]:
    """Conversational pairs with explicit prompts, string pairs, and rows that are not pairs."""
    rows = []
    for k in range(60):
        q, a, b = docs[k][:200] or "Why?", docs[k + 60][: 40 + 7 * k], docs[k + 120][:90] or "No."
        if k % 3 == 0:
            rows.append({"prompt": f"Q: {q}\n", "chosen": f"A: {a}", "rejected": f"A: {b}"})
        else:
            system = [{"role": "system", "content": docs[k + 180][:60]}] if k % 4 == 1 else []
            rows.append({"prompt": [*system, {"role": "user", "content": q}],
                         "chosen": [{"role": "assistant", "content": a}],
                         "rejected": [{"role": "assistant", "content": b}]})
    user = [{"role": "user", "content": "Hi"}]
    rows[5] = {"prompt": user, "chosen": "a string", "rejected": [{"role": "assistant", "content": "x"}]}
    rows[17] = {"prompt": user, "chosen": None, "rejected": [{"role": "assistant", "content": "x"}]}
    rows[29] = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
                "chosen": [{"role": "assistant", "content": "A cat."}],
                "rejected": [{"role": "assistant", "content": "A dog."}]}
    rows[41] = {"prompt": user, "chosen": [{"role": "assistant", "content": "y" * 5_000}],
                "rejected": [{"role": "assistant", "content": "z"}]}
    return rows


def _audit(tmp_path, name: str, src, tok, **extra) -> tuple[dict, dict]:
    out = tmp_path / name
    result = lengthscan.audit(str(src), tokenizer=str(tok), chat_template=str(trl_template("qwen3")), full=True,
                              cache=False, batch_rows=8, max_chars=4_000, out=str(out), **extra)
    return pq.read_table(out / "lengths.parquet").to_pydict(), result.to_dict()


@pytest.mark.parametrize("pair_max_length", [None, 40])
def test_pairs_rendered_by_workers_measure_as_one_process(tmp_path, chat_tok_dir, docs, pair_max_length):
    """Every row's values, flags, reasons and side columns equal one process's; the report says
    how the batches were shared and most of them were rendered by the worker."""
    src = write_jsonl(tmp_path / "pairs.jsonl", _pairs(docs))
    kw = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected", "pair_max_length": pair_max_length}
    two, report = _audit(tmp_path, "two", src, chat_tok_dir, num_proc=2, **kw)
    one, single = _audit(tmp_path, "one", src, chat_tok_dir, **kw)
    assert two == one
    assert two["pair_flag"][5] == "invalid_conversation" and two["pair_flag"][17] == "missing"
    assert two["pair_flag"][29] == "unsupported_content" and "--max-chars" in two["pair_error"][41]
    assert sum((v or 0) > 0 for v in two["sequence_tokens"]) >= 50
    shared = report["preference"]["processes"]
    assert shared["processes"] == 2
    assert shared["measured_here"] + shared["rendered_by_workers"] == -(-60 // 8)
    assert shared["rendered_by_workers"] >= 2, shared
    assert "processes" not in single["preference"]


def test_rl_prompts_rendered_by_workers_measure_as_one_process(tmp_path, chat_tok_dir, docs):
    rows = [{"prompt": r["prompt"]} for r in _pairs(docs)]
    rows[7] = {"prompt": 12}
    src = write_jsonl(tmp_path / "prompts.jsonl", rows)
    two, report = _audit(tmp_path, "two", src, chat_tok_dir, num_proc=2, prompt="prompt", rl="grpo")
    one, _ = _audit(tmp_path, "one", src, chat_tok_dir, prompt="prompt", rl="grpo")
    assert two == one
    assert report["preference"]["processes"]["rendered_by_workers"] >= 2
    assert sum((v or 0) > 0 for v in two["prompt_tokens"]) >= 50
    assert two["rl_flag"][7] == "invalid_conversation" and "neither a string" in two["rl_error"][7]


def test_clean_tokenize_writes_the_same_ids_with_workers(tmp_path, chat_tok_dir, docs):
    """``clean --tokenize``: the trainer's prepared ids of rows rendered by a worker are this
    process's tokenizer's, equal to one process's."""
    from datasets import load_from_disk

    src = write_jsonl(tmp_path / "pairs.jsonl", _pairs(docs))
    kept = []
    for n in (2, 1):
        out = tmp_path / f"clean{n}"
        lengthscan.clean(str(src), tokenizer=str(chat_tok_dir), chat_template=str(trl_template("qwen3")),
                         prompt="prompt", chosen="chosen", rejected="rejected", cache=False, batch_rows=8,
                         max_chars=4_000, tokenize=True, num_proc=n, out=str(out))
        kept.append(load_from_disk(str(out / "dataset")).to_dict())
    assert kept[0] == kept[1] and len(kept[0]["chosen_ids"]) >= 50


def test_a_worker_renders_without_the_tokenizer(tmp_path, chat_tok_dir, docs, monkeypatch):
    """The worker's copy (``apart``) holds the template and the tokenizer's facts, no tokenizer: it
    renders a batch after a pickle round trip with the tokenizer's load refused, and this process
    measures those renderings as it measures the batch itself."""
    from lengthscan.measure.text import handle

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "home"))
    rows = _pairs(docs)[:24]
    columns = {k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")}
    counter = PairCounter(TokenCounter(str(chat_tok_dir)), PairFormat("chosen", "rejected", "prompt"),
                          str(trl_template("qwen3")))
    from lengthscan.measure.preference import pair_specs

    specs = {s.name: s for s in pair_specs("chosen")}
    job = pickle.loads(pickle.dumps(TextsJob("pair", columns, counter.apart())))

    def refuse(self):
        raise AssertionError("the worker's copy loaded the tokenizer")

    with monkeypatch.context() as m:
        m.setattr(handle.TokenizerHandle, "_load", refuse)
        rendered = job()["pair"]
    assert isinstance(rendered[5], Failed) and rendered[5].flag == "invalid_conversation"
    assert rendered[17] is None
    given = counter.measure(columns, specs, rendered=rendered)
    here = counter.measure(columns, specs)
    assert given.flags.tolist() == here.flags.tolist() and given.errors == here.errors
    assert {s.name: v.tolist() for s, v in given.values.items()} == {s.name: v.tolist() for s, v in here.values.items()}
