"""What the terminal summary (and the report beside it) says, checked as the user reads it: the
packing finding's two efficiencies, a remote source's bytes-read line, an audio folder's summary
without a tokenizer line, worker processes' counting methods added up, and long id values shortened
in the report but not in lengths.parquet."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl


def test_the_packing_finding_gives_both_efficiencies(tmp_path, chat_tok_dir, docs, capsys):
    rows = [{"messages": [{"role": "user", "content": f"q {i}"},
                          {"role": "assistant", "content": " ".join(docs[i:i + 1 + i % 9])[:3000]}]}
            for i in range(300)]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "p"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(trl_template("qwen3_training")), "--packing", "bfd", "--max-length", "256",
                 "--out", str(out), "--no-cache"]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    s = json.loads((out / "report.json").read_text())["packing"]["splits"][0]
    assert s["tokens_lost"] > 0
    assert (f"bfd_split keeps them, its packs {s['bfd_split_efficiency']:.1%} full (bfd's {s['efficiency']:.1%})"
            in terminal)
    from tests.support.pages import visible_text

    panel = visible_text((out / "report.html").read_text(), "packing")
    assert re.search(r"gradient accumulation 1\. Simulated from trl", panel), panel


@pytest.mark.slow
def test_a_remote_files_line_counts_in_words(tmp_path, bpe_dir, docs, capsys):
    from tests.support.range_server import RangeServer

    folder = tmp_path / "served"
    folder.mkdir()
    write_jsonl(folder / "t.jsonl", [{"text": d} for d in docs[:50]])
    lines = []
    with RangeServer(folder) as srv:
        for _ in range(2):  # the first run counts the file's rows (a stream), the second reads them from the cache
            assert main(["audit", f"{srv.url}/files/t.jsonl", "--tokenizer", str(bpe_dir), "--input", "text",
                         "--full", "--out", str(tmp_path / "o")]) == 0
            lines.append(" ".join(capsys.readouterr().out.split()))
    assert re.search(r"read [\d.]+ [KM]iB of [\d.]+ [KM]iB \(200\.0%\) in 1 file, 2 requests; every row", lines[0])
    assert re.search(r"read [\d.]+ [KM]iB of [\d.]+ [KM]iB \(100\.0%\) in 1 file, 1 request; every row", lines[1])


def test_an_audio_folder_has_no_tokenizer_line_and_grouping_that_does_not_help_says_so(tmp_path, capsys):
    """Audio alone: no "tokenizer None (None; )" line. Ten clips whose length-grouped batches pad
    more than random ones (the Trainer's sampler on few rows): the finding does not say it "brings"
    the padding down."""
    from tests.support import audio_files as af

    folder = tmp_path / "clips"
    folder.mkdir()
    for i, seconds in enumerate((5.19, 1.89, 42.4, 1.72, 50.12, 1.14, 3.62, 3.12, 16.04, 50.83)):
        af.write_audio(folder / f"clip{i}.wav", round(8000 * seconds), 8000)
    out = tmp_path / "o"
    assert main(["audit", str(folder), "--audio", "audio", "--sampling-rate", "16000", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    assert "tokenizer" not in terminal.split("findings")[0]
    entry = json.loads((out / "report.json").read_text())["batches"]["by_batch_size"][0]["strategies"]
    rnd, grouped = entry["random"]["padding_share"], entry["group_by_length"]["padding_share"]
    assert grouped > rnd
    from tests.support.pages import visible_text

    for text in (terminal, visible_text((out / "report.html").read_text())):
        assert (f"Random batches of 8 are {round(100 * rnd)}% padding; group_by_length does not lower it here "
                f"({round(100 * grouped)}%).") in text


@pytest.mark.slow  # two full audits, one in worker processes (spawned, each loading the tokenizer)
def test_worker_processes_report_how_they_counted(tmp_path, corpus_jsonl, bpe_dir, capsys):
    """--num-proc 2: the tokenizer line and report.json say how the workers counted (methods, the
    count-only engine's texts and --verify-counts recounts, added up over the processes), as one
    process says it; before, they said nothing ("(TokenizersBackend; )") or one split's share."""
    args = ["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
            "--full", "--no-cache", "--verify-counts", "20"]
    reports, terminals = [], []
    for name, extra in (("one", []), ("two", ["--num-proc", "2"])):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        terminals.append(" ".join(capsys.readouterr().out.split()))
        reports.append(json.loads((tmp_path / name / "report.json").read_text())["tokenizer"])
    one, two = reports
    assert two["methods"] == one["methods"] == {"input": "backend.encode_batch_fast",
                                                 "target": "backend.encode_batch_fast"}
    for role in ("input", "target"):
        a, b = one["counting"][role], two["counting"][role]
        assert (b["texts"], b["by_tokenizer"]) == (a["texts"], a["by_tokenizer"]) and a["texts"] > 2048
        assert b["verified"] >= 2 * 20  # each worker recounts its own sample
        assert f"({b['texts']:,} texts, {b['by_tokenizer']:,} left to the tokenizer, {b['verified']:,} recounted" \
            in terminals[1]
    assert "input: backend.encode_batch_fast, target: backend.encode_batch_fast" in terminals[1]


@pytest.mark.slow
def test_long_id_values_are_shortened_in_the_report_not_in_lengths(tmp_path, bpe_dir):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"id": f"{i}" + "x" * 1_000_000, "text": "w " * (i + 1)}) + "\n"
                           for i in range(3)))
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--id", "id", "--full",
                 "--out", str(out), "--quiet"]) == 0
    assert (out / "report.json").stat().st_size < 200_000
    shown = [r["id"] for r in json.loads((out / "report.json").read_text())["longest_rows"]]
    assert shown and all(len(s) < 300 and s.endswith("(1,000,001 characters)") for s in shown)
    assert {len(v) for v in pq.read_table(out / "lengths.parquet").column("id").to_pylist()} == {1_000_001}
