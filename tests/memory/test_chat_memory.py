"""``lengthscan memory`` on conversations: a decoder-only model's input is the rendered sequence,
and its limits are the sequence's (``sequence_tokens<=model``)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from lengthscan.cli.main import main
from lengthscan.memory.data import predict_dataset
from tests.support.chat import conversations, trl_template, write_jsonl


def test_memory_data_mode_prices_the_sequence(tmp_path, chat_tok_dir, docs, capsys):
    from transformers import LlamaConfig

    model = tmp_path / "llama"
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=3100, max_position_embeddings=512).save_pretrained(model)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": r["messages"]} for r in conversations(docs, 60, seed=2)])
    template = trl_template("qwen3_training")
    chat = {"messages": "messages", "chat_template": str(template)}
    got = predict_dataset(str(src), model=str(model), tokenizer=str(chat_tok_dir), batch_size=4,
                          budget_bytes=150 * 2**20, out=tmp_path / "out", chat=chat)
    lengths = pq.read_table(tmp_path / "out" / "lengths.parquet").to_pydict()
    worst = got.memory["worst_batch"]
    assert worst["lengths"]["sequence_tokens"] == [lengths["sequence_tokens"][r] for r in worst["rows"]]
    assert worst["shape"]["input_len"] == max(worst["lengths"]["sequence_tokens"])
    assert all(r.startswith("sequence_tokens<=") for r in got.memory["limits"]["rules"])
    assert "--messages messages" in got.memory["limits"]["clean_command"]
    over = [v for v in lengths["sequence_tokens"] if v is not None and v > 512]
    assert over
    assert main(["audit", str(src), "--model", str(model), "--tokenizer", str(chat_tok_dir), "--messages", "messages",
                 "--chat-template", str(template), "--limit", "sequence_tokens<=model", "--json", "--quiet",
                 "--out", str(tmp_path / "audit"), "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    (limit,) = [c for c in report["splits"][0]["limits"] if c["measure"] == "sequence_tokens"]
    assert limit["limit"] == 512 and limit["over_in_measured"] == len(over)
    assert report["decisions"]["rules"][0]["threshold"] == 512
    assert report["decisions"]["splits"][0]["dropped"] == len(over)


def test_chat_memory_says_sequence_tokens_where_the_user_reads_it(tmp_path, chat_tok_dir, docs, capsys):
    """A conversation is the decoder's whole input: the terminal, the page and report.json name its
    lengths and limits sequence_tokens (as the suggested clean command does), with no note about
    concatenating an input and a target."""
    from transformers import LlamaConfig

    from tests.support.pages import visible_text

    model = tmp_path / "llama"
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=3100, max_position_embeddings=8192).save_pretrained(model)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": r["messages"]} for r in conversations(docs, 60, seed=2)])
    out = tmp_path / "out"
    code = main(["memory", str(src), "--model", str(model), "--tokenizer", str(chat_tok_dir), "--messages", "messages",
                 "--chat-template", str(trl_template("qwen3_training")), "--batch-size", "4", "--budget", "120MiB",
                 "--out", str(out), "--no-cache"])
    terminal = capsys.readouterr().out
    assert code == 1  # the worst batch does not fit: limits are suggested
    longest = max(v for v in pq.read_table(out / "lengths.parquet").column("sequence_tokens").to_pylist() if v)
    memory = json.loads((out / "report.json").read_text())["memory"]
    value = memory["limits"]["a"]["value"]
    assert memory["limits"]["a"]["measure"] == "sequence_tokens" and value < longest
    assert memory["limits"]["rules"] == [f"sequence_tokens<={value}"]
    assert f"4 rows x {longest:,} sequence_tokens" in terminal and f"--limit 'sequence_tokens<={value}'" in terminal
    assert "input_tokens" not in terminal
    html = (out / "report.html").read_text()
    panel = visible_text(html, "memory")
    assert f"4 rows × {longest:,} sequence_tokens" in panel and f"sequence_tokens ≤ {value:,}" in panel
    assert "input_tokens" not in panel and "input_tokens" not in visible_text(html, "findings")
    assert "concatenated" not in visible_text(html)
    assert "sequence_tokens ≤ 8,192" in visible_text(html, "details")  # the model's limit, on the sequence
