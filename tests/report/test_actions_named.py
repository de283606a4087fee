"""What cleaning did, named as it was done where the user reads it (the terminal, report.html's
limit-rules tables, tags and worst rows): turns dropped and audio cropped are not "truncated"; and
the worst rows show each kept row's length after cleaning, as the written dataset holds it."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import conversations, trl_template, write_jsonl
from tests.support.pages import tables, visible_text


def _terminal(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


def _dataset_index(out) -> dict:
    """source row -> its position in dataset/ (kept rows, in source order)."""
    t = pq.read_table(out / "lengths.parquet").sort_by("row").to_pydict()
    kept = [r for r, d in zip(t["row"], t["decision"]) if d != "drop"]
    return {r: k for k, r in enumerate(kept)}


def _worst(html: str) -> list[dict]:
    """The worst-rows tables' rows as {header: cell}."""
    out = []
    for table in tables(html, "worst"):
        head = table[0]
        out += [dict(zip(head, row)) for row in table[1:]]
    return out


def test_drop_turns_is_named_and_the_length_after_is_the_datasets(tmp_path, chat_tok_dir, chat_tok, docs, capsys):
    from datasets import load_from_disk

    rows = [{"messages": r["messages"]} for r in conversations(docs, 80, seed=7)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    template = trl_template("qwen3_training")
    out = tmp_path / "o"
    assert main(["clean", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(template), "--limit", "sequence_tokens<=600:drop-turns", "--out", str(out), "--no-cache"]) == 0
    terminal = _terminal(capsys)
    data = json.loads((out / "report.json").read_text())
    split = data["decisions"]["splits"][0]
    n = split["truncated"]
    assert n > 3
    assert f"{n:,} turns dropped," in terminal and f"{n:,} drop-turns: sequence_tokens<=600:drop-turns" in terminal
    assert f"dropped turns of {n:,} (" in terminal and "truncated" not in terminal.split("limits (")[1]
    html = (out / "report.html").read_text()
    limits = tables(html, "limits")
    assert limits[1][0][4] == "turns dropped" and limits[1][1][4].startswith(f"{n:,} ")
    assert ["train", "drop-turns", "sequence_tokens<=600:drop-turns", f"{n:,}"] in limits[2]
    assert "truncate" not in " ".join(c for table in limits[1:] for row in table for c in row)
    # the worst rows: the action, and the length after cleaning, which the written conversation has
    dataset, index = load_from_disk(str(out / "dataset")), _dataset_index(out)
    shown = {int(r["row"]): r for r in _worst(html)}
    cut = [e for e in data["clean"]["worst_rows"] if e["decision"] == "truncate"]
    assert cut
    for e in cut:
        written = dataset[index[e["row"]]]["messages"]
        n_after = len(chat_tok.apply_chat_template(written, chat_template=template.read_text(), tokenize=True,
                                                   return_dict=True)["input_ids"])
        assert e["after"]["sequence_tokens"] == n_after < e["lengths"]["sequence_tokens"]
        assert e["after"]["turns"] == len(written)
        cell = shown[e["row"]]
        assert cell["decision"] == "drop-turns" and f"sequence_tokens {n_after:,}" in cell["after cleaning"]
    kept = [e for e in data["clean"]["worst_rows"] if e["decision"] == "keep"]
    assert all(shown[e["row"]]["after cleaning"] == "unchanged" for e in kept)


def test_crop_is_named_and_the_length_after_is_the_files(tmp_path, capsys):
    import soundfile as sf

    from tests.support import audio_files as af

    seconds = (0.7, 1.3, 2.2, 3.1, 4.0, 5.5, 7.9)
    for i, s in enumerate(seconds):
        af.write_audio(tmp_path / f"clip{i}.wav", int(16000 * s), 16000)
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"path": f"clip{i}.wav"}) + "\n"
                                              for i in range(len(seconds))))
    out = tmp_path / "o"
    assert main(["clean", str(tmp_path / "m.jsonl"), "--audio", "path", "--sampling-rate", "16000", "--limit",
                 "input_seconds<=3", "--crop-audio", "--out", str(out)]) == 0
    terminal = _terminal(capsys)
    over = sum(s > 3 for s in seconds)
    assert f"{over} cropped," in terminal and f"{over} crop: input_seconds<=3" in terminal
    assert f"cropped {over} (" in terminal and "truncat" not in terminal.split("limits (")[1]
    html = (out / "report.html").read_text()
    limits = tables(html, "limits")
    assert limits[1][0][4] == "cropped" and ["train", "crop", "input_seconds<=3", str(over)] in limits[2]
    data = json.loads((out / "report.json").read_text())
    from datasets import load_from_disk

    dataset, index = load_from_disk(str(out / "dataset")), _dataset_index(out)
    shown = {int(r["row"]): r for r in _worst(html)}
    for e in data["clean"]["worst_rows"]:
        path = dataset[index[e["row"]]]["path"]
        info = sf.info(path)
        assert e["after"]["input_samples"] == info.frames
        assert e["after"]["input_seconds"] == pytest.approx(info.frames / info.samplerate)
        cell = shown[e["row"]]
        if e["decision"] == "truncate":
            assert cell["decision"] == "crop" and cell["after cleaning"].startswith("input_seconds 3")
            assert f"input_samples {info.frames:,}" in cell["after cleaning"]
    chart = re.findall(r'"decision":"([^"]+)"', html)
    assert "cropped" in chart and "truncated" not in chart
    assert np.isclose(sum(float(r["after"]["input_seconds"]) for r in data["clean"]["worst_rows"]),
                      sum(min(s, 3) for s in seconds))
    assert "cropped" in visible_text(html, "findings")
