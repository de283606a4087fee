"""Conversations whose messages mix string content and part lists (``"content": "text"`` beside
``"content": [{"type": "text", ...}]``), as TRL's vision datasets and hand-made files do: ``datasets``
reads such a column as ``Json`` content, which ``clean`` keeps as it is (nothing lost: every row kept,
cut or rejected with its reason), ``datasets`` loads back, and lengthscan measures again exactly
(``apply_chat_template`` and the processor called directly are the references)."""

from __future__ import annotations

import glob
import random

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl

TEMPLATE = trl_template("qwen2_5_vl")  # renders string content and text parts alike


def _run(command: str, *args) -> int:
    return main([command, *map(str, args), "--quiet", "--no-cache"])


def _mixed_rows(docs: list[str], n: int, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages = []
        for t in range(rng.choice([1, 2, 3, 4])):
            for role in ("user", "assistant"):
                text = docs[(i * 7 + t * 2 + (role == "assistant")) % len(docs)][:rng.choice([40, 150, 400])] or "ok"
                content = text if rng.random() < 0.5 else [{"type": "text", "text": text}]
                messages.append({"role": role, "content": content})
        rows.append({"id": i, "messages": messages})
    return rows


def _load(folder):
    from datasets import load_dataset, load_from_disk

    files = sorted(glob.glob(str(folder / "*.parquet")))
    return load_dataset("parquet", data_files=files, split="train") if files else load_from_disk(folder)


def _length(tok, messages) -> int:
    return len(tok.apply_chat_template(messages, chat_template=TEMPLATE.read_text())["input_ids"])


@pytest.mark.slow
@pytest.mark.parametrize("action,fmt", [("drop", "arrow"), ("drop-turns", "arrow"), ("truncate", "parquet"),
                                        ("drop-turns", "parquet")])
def test_clean_keeps_mixed_content_as_written_and_it_loads_back(tmp_path, docs, chat_tok_dir, chat_tok, action,
                                                                fmt):
    rows = _mixed_rows(docs, 40)
    src = write_jsonl(tmp_path / "mixed.jsonl", rows)
    args = ["--tokenizer", chat_tok_dir, "--chat-template", TEMPLATE, "--messages", "messages"]
    assert _run("audit", src, *args, "--full", "--out", tmp_path / "a") == 0
    audited = pq.read_table(tmp_path / "a" / "lengths.parquet").to_pydict()
    want = [_length(chat_tok, r["messages"]) for r in rows]
    assert audited["sequence_tokens"] == want
    limit = sorted(want)[len(want) // 2]
    out = tmp_path / "c"
    assert _run("clean", src, *args, "--limit", f"sequence_tokens<={limit}", "--action", action, "--format", fmt,
                "--out", out) == 0
    kept, rejects = _load(out / "dataset"), _load(out / "rejects")
    assert sorted(list(kept["id"]) + list(rejects["id"])) == list(range(len(rows)))  # nothing lost
    if action == "drop":
        assert len(rejects) == sum(w > limit for w in want)
    cut = 0
    for row in kept:
        source = rows[row["id"]]["messages"]
        messages = row["messages"]
        assert messages == source[:len(messages)]  # strings stay strings, part lists stay part lists
        if action == "drop-turns":
            cut += len(messages) < len(source)
            assert _length(chat_tok, messages) == row["length"] <= limit
        elif action == "truncate":
            assert len(messages) == len(source) and row["length"] == min(limit, want[row["id"]])
        else:
            assert len(messages) == len(source) and row["length"] == want[row["id"]] <= limit
    assert action != "drop-turns" or cut > 0
    # the written dataset is measured again as the source was (not its content's JSON text)
    again = tmp_path / "again"
    assert _run("audit", out / "dataset", *args, "--full", "--out", again) == 0
    measured = pq.read_table(again / "lengths.parquet").to_pydict()
    assert measured["chat_error"] == [None] * len(kept)
    assert measured["sequence_tokens"] == [_length(chat_tok, m) for m in kept["messages"]]


def test_clean_with_no_rejects_writes_loadable_empty_rejects(tmp_path, docs, chat_tok_dir):
    """The crash of the issue: every row kept, an empty ``rejects/`` of a ``Json`` column."""
    from datasets import load_from_disk

    rows = _mixed_rows(docs, 6)
    src = write_jsonl(tmp_path / "mixed.jsonl", rows)
    out = tmp_path / "c"
    assert _run("clean", src, "--tokenizer", chat_tok_dir, "--chat-template", TEMPLATE, "--messages", "messages",
                "--out", out) == 0
    assert [r["messages"] for r in load_from_disk(out / "dataset")] == [r["messages"] for r in rows]
    rejects = load_from_disk(out / "rejects")
    assert len(rejects) == 0 and "messages" in rejects.column_names


@pytest.mark.slow
def test_mixed_content_with_images(tmp_path, docs, qwen2_vl_dir):
    """String content beside image and text parts, with the images column: audit equals the
    processor, clean keeps or rejects every row, and the cleaned dataset measures the same."""
    from datasets import load_from_disk
    from PIL import Image

    from tests.support.vision import reference, reference_processor, template_of

    folder = qwen2_vl_dir
    pics = tmp_path / "data"
    pics.mkdir()
    sizes = [(320, 240), (64, 900), (1200, 800)]
    for k, size in enumerate(sizes):
        Image.new("RGB", size, (40 * k, 90, 160)).save(pics / f"p{k}.png")
    rows = []
    for i in range(12):
        k = i % 4
        user = {"role": "user", "content": [{"type": "image"}] * min(k, 2) + [{"type": "text", "text": docs[i][:80]}]}
        if k == 3:
            user = {"role": "user", "content": docs[i][:60] or "hi"}
        answer = docs[i + 1][:100] or "yes"
        reply = {"role": "assistant", "content": answer if i % 2 else [{"type": "text", "text": answer}]}
        rows.append({"id": i, "messages": [user, reply], "images": [f"p{(i + j) % 3}.png" for j in range(min(k, 2))]
                     if k != 3 else []})
    src = write_jsonl(pics / "rows.jsonl", rows)
    args = ["--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages", "--images",
            "images", "--processor", folder]
    assert _run("audit", src, *args, "--full", "--out", tmp_path / "a") == 0
    audited = pq.read_table(tmp_path / "a" / "lengths.parquet").to_pydict()
    processor = reference_processor(folder, "qwen2_vl")
    want = [reference(processor, r["messages"], [pics / p for p in r["images"]])[0] for r in rows]
    assert audited["sequence_tokens"] == want
    limit = sorted(want)[len(want) * 2 // 3]
    out = tmp_path / "c"
    assert _run("clean", src, *args, "--limit", f"sequence_tokens<={limit}", "--out", out) == 0
    kept, rejects = load_from_disk(out / "dataset"), load_from_disk(out / "rejects")
    assert sorted(kept["id"]) == [i for i, w in enumerate(want) if w <= limit]
    assert sorted(rejects["id"]) == [i for i, w in enumerate(want) if w > limit]
    for row in kept:
        assert row["messages"] == rows[row["id"]]["messages"]
        assert row["images"] == [str(pics / p) for p in rows[row["id"]]["images"]]
    assert _run("audit", out / "dataset", *args, "--full", "--out", tmp_path / "again") == 0
    again = pq.read_table(tmp_path / "again" / "lengths.parquet").to_pydict()
    assert again["sequence_tokens"] == [want[i] for i in kept["id"]]
    assert again["chat_error"] == [None] * len(kept)
