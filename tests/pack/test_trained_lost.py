"""The figures of a packing where the user reads them (report.html's packing panel, the terminal's
findings): the share of tokens lost as report.json has it, and for conversations the *trained*
tokens lost, against TRL's own ``pack_dataset`` packing ``input_ids`` with the assistant mask
``apply_chat_template`` returns."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import conversations, trl_template, write_jsonl
from tests.support.pages import tables, visible_text

trl = pytest.importorskip("trl")


def _cells(html: str) -> dict:
    """The packing panel's first table as {header: cell} of its packing row."""
    head, row = tables(html, "packing")[0][:2]
    return dict(zip(head, row))


def _percent(cell: str) -> float:
    return float(re.search(r"\(([\d.]+)%\)", cell).group(1))


@pytest.mark.slow  # an audit with packing and the CLI's terminal output
def test_the_panel_shows_the_tokens_lost_share_of_report_json(tmp_path, bpe_dir, corpus_jsonl, capsys):
    out = tmp_path / "o"
    assert main(["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--packing", "bfd", "--max-length", "48", "--out", str(out), "--no-cache"]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    lengths = pq.read_table(out / "lengths.parquet").column("input_tokens").fill_null(0).to_numpy()
    lost, total = int(np.maximum(lengths - 48, 0).sum()), int(lengths.sum())
    share = 100 * lost / total
    cell = _cells((out / "report.html").read_text())["tokens lost"]
    assert cell.startswith(f"{lost:,} (") and _percent(cell) == pytest.approx(share, abs=0.05)
    assert f"lose {lost:,} tokens ({share:.1f}% of all tokens)" in terminal


def _reference(tok, template, rows, max_length: int):
    """TRL's bfd packing of ``input_ids`` with the assistant mask: (trained tokens, trained tokens
    lost, per row the trained tokens past ``max_length``)."""
    from datasets import Dataset, disable_progress_bars
    from trl import pack_dataset

    disable_progress_bars()
    ids, masks = [], []
    for r in rows:
        out = tok.apply_chat_template(r["messages"], chat_template=template.read_text(), tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
        ids.append(out["input_ids"])
        masks.append(out["assistant_masks"])
    packed = pack_dataset(Dataset.from_dict({"input_ids": ids, "assistant_masks": masks}), max_length, "bfd")
    trained = sum(map(sum, masks))
    kept = sum(map(sum, packed["assistant_masks"]))
    return trained, trained - kept, [sum(m[max_length:]) for m in masks], [len(i) for i in ids], masks


@pytest.mark.slow  # an audit, TRL's packing and apply_chat_template on 120 conversations
def test_trained_tokens_lost_are_trls(tmp_path, chat_tok_dir, chat_tok, docs, capsys):
    rows = [{"messages": r["messages"]} for r in conversations(docs, 120, seed=5)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    template = trl_template("qwen3_training")
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(template), "--full", "--packing", "bfd", "--max-length", "384", "--out", str(out),
                 "--no-cache"]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    trained, lost, per_row, lengths, masks = _reference(chat_tok, template, rows, 384)
    assert 0 < lost < trained and sum(n > 384 for n in lengths) > 5
    s = json.loads((out / "report.json").read_text())["packing"]["splits"][0]
    assert (s["trained_tokens"], s["trained_tokens_lost"]) == (trained, lost)
    assert s["rows_losing_trained_tokens"] == sum(n > 0 for n in per_row)
    assert s["rows_losing_every_trained_token"] == sum(0 < sum(m) == p for m, p in zip(masks, per_row))
    assert all(e["trained_tokens_lost"] == per_row[e["row"]] for e in s["largest_losses"])
    # at a longer L of the table, TRL's packing at that L
    at_1024 = next(r for r in s["by_max_length"] if r["max_length"] == 1024)
    assert at_1024["trained_tokens_lost"] == _reference(chat_tok, template, rows, 1024)[1]
    # where the user reads it: the panel's cell, the by-length table and the terminal's findings
    html = (out / "report.html").read_text()
    cell = _cells(html)["trained tokens lost"]
    assert cell.startswith(f"{lost:,} (") and _percent(cell) == pytest.approx(100 * lost / trained, abs=0.05)
    by_length = {r[0]: r for r in tables(html, "packing")[1][1:]}
    assert by_length["1,024"][4] == f"{at_1024['trained_tokens_lost']:,}"
    assert f"{lost:,} tokens of the {trained:,} trained tokens ({100 * lost / trained:.1f}%)" in terminal
    first = s["largest_losses"][0]
    assert f"row {first['row']}: {first['tokens_lost']:,} ({per_row[first['row']]:,} trained)" in \
        visible_text(html, "packing")


def test_multipack_loses_the_trained_tokens_of_the_rows_it_drops(tmp_path, chat_tok_dir, chat_tok, docs):
    rows = [{"messages": r["messages"]} for r in conversations(docs, 80, seed=6)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    template = trl_template("qwen3_training")
    for strategy in ("multipack", "knapsack"):
        out = tmp_path / strategy
        assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages",
                     "--chat-template", str(template), "--full", "--packing", strategy, "--max-length", "384",
                     "--out", str(out), "--quiet", "--no-cache"]) == 0
        s = json.loads((out / "report.json").read_text())["packing"]["splits"][0]
        html = visible_text((out / "report.html").read_text(), "packing")
        if strategy == "knapsack":  # LLaMA-Factory does not cut a row's end: no figure, and the page says why
            assert s["trained_tokens_lost"] is None and "trained tokens lost: not simulated" in html.lower()
            continue
        masks = [chat_tok.apply_chat_template(r["messages"], chat_template=template.read_text(), tokenize=True,
                                              return_dict=True, return_assistant_tokens_mask=True)["assistant_masks"]
                 for r in rows]
        dropped = [sum(m) for m in masks if len(m) > 384 or len(m) == 1]  # axolotl drops them whole
        assert dropped and s["trained_tokens_lost"] == sum(dropped)
        assert s["rows_losing_every_trained_token"] == sum(1 for n in dropped if n)
