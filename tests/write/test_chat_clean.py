"""``lengthscan clean`` on conversations: drop-turns keeps the longest prefix that ends with an
unchanged assistant message and re-renders within the limit; truncate and ``--tokenize`` give what
TRL's SFTTrainer prepares for the same rows and options (built on CPU with a tiny random model)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import conversations, not_trls, trl_template, trl_training_text, write_jsonl


def _clean(*args) -> int:
    return main(["clean", *map(str, args), "--quiet", "--no-cache"])


def _strip(value):
    """A conversation as read back from Arrow (struct keys of other messages are None)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _length(tok, template: str, messages, tools=None):
    try:
        return len(tok.apply_chat_template(messages, tools=tools, chat_template=template)["input_ids"])
    except Exception:  # noqa: BLE001
        return None


@pytest.fixture(scope="module")
def rows(docs):
    return conversations(docs, 120, seed=11)


@pytest.mark.parametrize("name,limit", [("qwen3", 400), ("qwen3-copy", 400), ("qwen3_training", 250)])
def test_drop_turns_keeps_the_longest_fitting_prefix(tmp_path, chat_tok_dir, chat_tok, rows, name, limit):
    """qwen3: TRL's, which SFTTrainer(assistant_only_loss=True) swaps for qwen3_training; a copy of it
    (not swapped) renders the last turn otherwise than earlier ones."""
    from datasets import load_from_disk

    template = not_trls("qwen3", tmp_path) if name == "qwen3-copy" else trl_template(name)
    text = trl_training_text(chat_tok, template.read_text())  # what the model is trained on
    assert (text == trl_template("qwen3_training").read_text()) == (name != "qwen3-copy")
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out"
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--tools", "tools", "--limit", f"sequence_tokens<={limit}", "--action", "drop-turns",
                  "--out", out) == 0
    kept, rejects = load_from_disk(out / "dataset"), load_from_disk(out / "rejects")
    assert sorted(list(kept["id"]) + list(rejects["id"])) == list(range(len(rows)))
    cut = 0
    for row in kept:
        source = rows[row["id"]]
        tools = json.loads(source["tools"]) if source.get("tools") else None
        messages = _strip(row["messages"])
        full = _length(chat_tok, text, source["messages"], tools)
        if full is not None and full <= limit:
            assert messages == source["messages"]
            continue
        cut += 1
        k = len(messages)
        assert messages == source["messages"][:k] and messages[-1]["role"] == "assistant"
        assert _length(chat_tok, text, messages, tools) <= limit
        longer = [j + 1 for j, m in enumerate(source["messages"]) if m["role"] == "assistant" and j + 1 > k
                  and (_length(chat_tok, text, source["messages"][:j + 1], tools) or limit + 1) <= limit]
        assert not longer, (row["id"], k, longer)
        if source["messages"][0]["role"] == "system":
            assert messages[0] == source["messages"][0]
    assert cut > 5
    first = [r for r in rejects if r["reason"] == "drop-turns: the first exchange does not fit"]
    assert first
    for r in first:
        source = rows[r["id"]]
        tools = json.loads(source["tools"]) if source.get("tools") else None
        fits = [j for j, m in enumerate(source["messages"]) if m["role"] == "assistant"
                and (_length(chat_tok, text, source["messages"][:j + 1], tools) or limit + 1) <= limit]
        assert not fits
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, d in enumerate(lengths["decision"]):
        if d == "truncate":
            assert lengths["sequence_tokens_after"][i] <= limit < lengths["sequence_tokens"][i]
    report = json.loads((out / "report.json").read_text())
    decisions = report["decisions"]["splits"][0]
    assert decisions["kept"] + decisions["truncated"] + decisions["dropped"] == len(rows)


def _trl_prepared(tok_dir, template, records, **config):
    """TRL's SFTTrainer's own dataset preparation of ``records`` (input_ids and labels)."""
    pytest.importorskip("torch")
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    tok.chat_template = template.read_text()
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    args = SFTConfig(output_dir=str(tok_dir.parent / "trl-out"), use_cpu=True, bf16=False, report_to=[], **config)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(records), processing_class=tok)
    return trainer.train_dataset


@pytest.mark.parametrize("name,train_on,trl_options", [
    ("qwen3_training", "assistant", {"assistant_only_loss": True}),
    ("llama3_training", "assistant", {"assistant_only_loss": True}),
    ("qwen2_5", "all", {"assistant_only_loss": False}),
    # originals: SFTTrainer swaps in TRL's training template (qwen3_training, llama3_training)
    ("qwen3", "assistant", {"assistant_only_loss": True}),
    ("llama3", "assistant", {"assistant_only_loss": True}),
])
def test_tokenize_equals_trl_sft_preparation(tmp_path, chat_tok_dir, rows, name, train_on, trl_options):
    from datasets import load_from_disk

    template = trl_template(name)
    sample = [{"id": r["id"], "messages": r["messages"]} for r in rows[:50]]
    src = write_jsonl(tmp_path / "chat.jsonl", sample)
    out = tmp_path / "out"
    limit = 300
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--train-on", train_on, "--limit", f"sequence_tokens<={limit}", "--action", "truncate",
                  "--tokenize", "--out", out) == 0
    ours = load_from_disk(out / "dataset")
    theirs = _trl_prepared(chat_tok_dir, template, [{"id": r["id"], "messages": r["messages"]} for r in sample],
                           max_length=limit, **trl_options)
    assert list(ours["id"]) == list(theirs["id"])
    assert list(ours["input_ids"]) == list(theirs["input_ids"])
    assert list(ours["labels"]) == list(theirs["labels"])
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    truncated = [i for i, d in enumerate(lengths["decision"]) if d == "truncate"]
    assert truncated
    for i in truncated:
        assert lengths["sequence_tokens_after"][i] == limit
    by_id = {r["id"]: r for r in ours}
    for i in truncated:
        labels = by_id[sample[i]["id"]]["labels"]
        assert lengths["completion_tokens_after"][i] == sum(x != -100 for x in labels)
        lost = lengths["final_eot_at"][i] is not None and lengths["final_eot_at"][i] >= limit
        assert (lengths["final_eot_at_after"][i] is None) == (lost or lengths["final_eot_at"][i] is None)
    report = json.loads((out / "report.json").read_text())
    after = report["clean"]["after"][0]["chat"]
    lost = sum(1 for i in truncated if (lengths["final_eot_at"][i] or -1) >= limit)
    assert after["without_final_eot"] - report["splits"][0]["chat"]["without_final_eot"] == lost


def test_tokenize_prompt_completion_equals_trl(tmp_path, chat_tok_dir, docs):
    from datasets import load_from_disk

    template = trl_template("qwen2_5")
    records = [{"id": i, "prompt": [{"role": "user", "content": docs[i][:600]}],
                "completion": [{"role": "assistant", "content": docs[i + 1][:900]}]} for i in range(30)]
    src = write_jsonl(tmp_path / "pc.jsonl", records)
    out = tmp_path / "out"
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--prompt", "prompt",
                  "--completion", "completion", "--limit", "sequence_tokens<=250", "--action", "truncate",
                  "--tokenize", "--out", out) == 0
    ours = load_from_disk(out / "dataset")
    theirs = _trl_prepared(chat_tok_dir, template, records, max_length=250)
    assert list(ours["id"]) == list(theirs["id"]) and list(ours["input_ids"]) == list(theirs["input_ids"])
    assert list(ours["labels"]) == list(theirs["labels"])


def test_percentile_rule_two_passes_with_tokenize(tmp_path, chat_tok_dir, chat_tok, rows):
    from datasets import load_from_disk

    template = trl_template("qwen3_training")
    src = write_jsonl(tmp_path / "chat.jsonl", [{"id": r["id"], "messages": r["messages"]} for r in rows[:60]])
    out = tmp_path / "out"
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--limit", "sequence_tokens<=p80:drop-turns", "--limit", "completion_tokens>=1", "--tokenize",
                  "--out", out) == 0
    report = json.loads((out / "report.json").read_text())
    threshold = report["decisions"]["rules"][0]["threshold"]
    ours = load_from_disk(out / "dataset")
    text = template.read_text()
    for row in ours:
        messages = _strip(row["messages"])
        ref = chat_tok.apply_chat_template(messages, chat_template=text, return_assistant_tokens_mask=True)
        assert row["input_ids"] == ref["input_ids"] and len(row["input_ids"]) <= threshold
        assert row["labels"] == [t if m else -100 for t, m in zip(ref["input_ids"], ref["assistant_masks"])]
        assert row["length"] == len(row["input_ids"])


def test_drop_turns_on_sharegpt(tmp_path, chat_tok_dir, chat_tok, docs):
    """ShareGPT conversations ({from, value}) are cut at their gpt turns, and keep their form."""
    from datasets import load_from_disk

    rows = [{"id": i, "conversations": [
        {"from": "human", "value": docs[i][:300]}, {"from": "gpt", "value": docs[i + 1][:200]},
        {"from": "human", "value": docs[i + 2][:800]}, {"from": "gpt", "value": docs[i + 3][:1500]}]}
        for i in range(0, 40, 4)]
    src = write_jsonl(tmp_path / "share.jsonl", rows)
    template = trl_template("qwen2_5")
    out = tmp_path / "out"
    limit = 250
    assert _clean(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "conversations",
                  "--limit", f"sequence_tokens<={limit}", "--action", "drop-turns", "--out", out) == 0
    kept = load_from_disk(out / "dataset")
    text = template.read_text()
    role = {"human": "user", "gpt": "assistant"}
    cut = 0
    for row in kept:
        got = _strip(row["conversations"])
        source = rows[row["id"] // 4]["conversations"]
        assert got == source[:len(got)] and got[-1]["from"] == "gpt"
        as_messages = [{"role": role[m["from"]], "content": m["value"]} for m in got]
        assert _length(chat_tok, text, as_messages) <= limit
        cut += len(got) < len(source)
    assert cut > 0
