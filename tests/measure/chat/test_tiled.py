"""Conversations measured with the count-only engine's offsets (``countbpe/tiling.py``): the same
columns, row for row, as with the tokenizer's own offsets, and the report says which was used."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import conversations, reference, trl_template, write_jsonl


@pytest.fixture(scope="module")
def rows(docs):
    out = conversations(docs, 300, seed=11)
    for i in (150, 151, 299):  # texts the engine leaves to the tokenizer (a NUL could spell its separator)
        out[i] = {"messages": [{"role": "user", "content": f"a\x00b {i}"}, {"role": "assistant", "content": "c\x00"}]}
    return out


def _audit(src, tok_dir, template, out, *extra) -> dict:
    assert main(["audit", str(src), "--tokenizer", str(tok_dir), "--chat-template", str(template), "--messages",
                 "messages", "--tools", "tools", "--full", "--quiet", "--no-cache", "--out", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("name", ["qwen3_training", "qwen2_5", "llama3_1"])  # llama3_1: the common-prefix rule
def test_engine_offsets_measure_as_the_tokenizers(tmp_path, chat_tok_dir, chat_tok, rows, name):
    template = trl_template(name)
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    import lengthscan

    lengthscan.audit(str(src), tokenizer=str(chat_tok_dir), chat_template=str(template), messages="messages",
                     tools="tools", full=True, cache=False, batch_rows=64, out=tmp_path / "engine")  # 5 batches
    report = json.loads((tmp_path / "engine" / "report.json").read_text())
    assert report["chat"]["token_offsets"].startswith("count-only engine"), report["chat"]["token_offsets"]
    plain = _audit(src, chat_tok_dir, template, tmp_path / "tokenizers", "--count-engine", "tokenizers")
    assert plain["chat"]["token_offsets"] == "--count-engine tokenizers"
    ours = pq.read_table(tmp_path / "engine" / "lengths.parquet")
    theirs = pq.read_table(tmp_path / "tokenizers" / "lengths.parquet")
    assert ours.column_names == theirs.column_names
    for column in ours.column_names:
        assert ours[column].to_pylist() == theirs[column].to_pylist(), column
    table = ours.to_pydict()
    for i in range(0, len(rows), 7):  # and both are apply_chat_template's
        seq, comp = reference(chat_tok, template, rows[i]["messages"], rows[i].get("tools"))
        assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == (seq, comp), i
    html = (tmp_path / "engine" / "report.html").read_text()
    assert "token offsets: count-only engine" in html


def test_a_prefix_space_keeps_the_tokenizers_offsets(tmp_path, chat_tok_dir, chat_tok, rows):
    """ByteLevel's prefix space is a byte no rendering holds: the engine tiles nothing and the
    tokenizer gives every offset (the counts stay apply_chat_template's)."""
    state = json.loads((chat_tok_dir / "tokenizer.json").read_text())
    state["pre_tokenizer"]["add_prefix_space"] = True
    spaced = tmp_path / "spaced"
    spaced.mkdir()
    (spaced / "tokenizer.json").write_text(json.dumps(state))
    (spaced / "tokenizer_config.json").write_text((chat_tok_dir / "tokenizer_config.json").read_text())
    template = trl_template("qwen3_training")
    src = write_jsonl(tmp_path / "chat.jsonl", rows[:80])
    report = _audit(src, spaced, template, tmp_path / "out")
    assert not report["chat"]["token_offsets"].startswith("count-only engine"), report["chat"]["token_offsets"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spaced)
    table = pq.read_table(tmp_path / "out" / "lengths.parquet").to_pydict()
    for i in range(0, 80, 5):
        seq, comp = reference(tok, template, rows[i]["messages"], rows[i].get("tools"))
        assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == (seq, comp), i


@pytest.mark.parametrize("nul_rows", [False, True])
def test_the_tokenizer_takes_only_the_proof_rows_of_a_first_batch(tmp_path, chat_tok_dir, rows, monkeypatch, nul_rows):
    """A run's first batch: the tokenizer tokenizes the renderings the engine's offsets are checked
    on (the first ``PROOF_ROWS``, to a row's end) and the engine the rest, with the same columns as
    the tokenizer alone; a batch whose rest holds a text the engine leaves goes to the tokenizer."""
    import lengthscan
    from lengthscan.measure.chat import tokenized

    taken: list[int] = []
    views = tokenized.views
    monkeypatch.setattr(tokenized, "views", lambda counter, texts, **kw: taken.append(len(texts)) or
                        views(counter, texts, **kw))
    part = rows[80:180] if nul_rows else rows[:140]  # 150 and 151 hold a NUL
    src = write_jsonl(tmp_path / "chat.jsonl", part)
    template = trl_template("qwen3_training")
    lengthscan.audit(str(src), tokenizer=str(chat_tok_dir), chat_template=str(template), messages="messages",
                     tools="tools", full=True, cache=False, batch_rows=1000, out=tmp_path / "engine")
    assert taken == ([tokenized.PROOF_ROWS, len(part) - tokenized.PROOF_ROWS] if nul_rows
                     else [tokenized.PROOF_ROWS]), taken
    plain = _audit(src, chat_tok_dir, template, tmp_path / "tokenizers", "--count-engine", "tokenizers")
    assert plain["chat"]["token_offsets"] == "--count-engine tokenizers"
    ours = pq.read_table(tmp_path / "engine" / "lengths.parquet")
    assert ours.equals(pq.read_table(tmp_path / "tokenizers" / "lengths.parquet"))
