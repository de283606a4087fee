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
    assert worst["lengths"]["input_tokens"] == [lengths["sequence_tokens"][r] for r in worst["rows"]]
    assert worst["shape"]["input_len"] == max(worst["lengths"]["input_tokens"])
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
