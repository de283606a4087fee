"""What the terminal summary and report.html say, checked where the user reads them: the packing
finding's two efficiencies; a remote source's bytes-read line; an audio folder's summary without a
tokenizer line; worker processes' counting methods added up; long id values shortened in the report
but not in lengths.parquet; conversations' batches are padded sequences, not "inputs" and "labels",
and a part of a sequence does not pad a batch to itself; a clean's worst rows list the measurements
and the id column, as the audit's do; the fields line names a conversation's columns; a failed
--fail-over gate says once that it failed and what would have been done; rules that keep every row
say so in words; memory with packing says which batch fits. (The second new-user trial's findings.)"""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl
from tests.support.pages import parse, tables, visible_text
from tests.support.reference import proven_first


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
    proven_first(bpe_dir)  # the one-process run's tallies then cover every text, as the workers' do
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


def _terminal(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


def _chats(docs, n=200, long_at=7):
    """``n`` short conversations, one with a long answer (``long_at``): completion and sequence
    tokens with a long tail."""
    rows = []
    for i in range(n):
        answer = " ".join(docs[:30]) if i == long_at else docs[i % len(docs)][:120]
        rows.append({"id": i, "messages": [{"role": "user", "content": f"question {i}"},
                                           {"role": "assistant", "content": answer}]})
    return rows


def test_conversation_batches_are_sequences_and_parts_do_not_pad(tmp_path, chat_tok_dir, docs, capsys):
    src = write_jsonl(tmp_path / "chats.jsonl", _chats(docs))
    out = tmp_path / "audit"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(trl_template("qwen3_training")), "--out", str(out), "--no-cache"]) == 0
    terminal = _terminal(capsys)
    data = json.loads((out / "report.json").read_text())
    seq, comp = (data["splits"][0]["fields"][k] for k in ("sequence_tokens", "completion_tokens"))
    assert comp["max"] >= 2.5 * comp["percentiles"]["p99"] and seq["max"] >= 2.5 * seq["percentiles"]["p99"]
    # the finding of each tail: only the sequence pads a batch to its length
    tails = {m.group(1): m.group(0) for m in re.finditer(r"(\w+) has a long tail: [^.]*\.", terminal)}
    assert f"a batch holding it pads every row to {seq['max']:,} tokens" in tails["sequence_tokens"]
    assert "pads" not in tails["completion_tokens"] and f"the longest is {comp['max']:,} tokens" in tails[
        "completion_tokens"]
    # one padded side: its share said once, not as "inputs"
    padding = data["batches"]["by_batch_size"][0]["strategies"]["random"]["padding_share"]
    assert re.search(rf"Random batches of 8 are {round(100 * padding)}% padding; group_by_length", terminal)
    assert "inputs" not in terminal and "labels" not in terminal
    html = (out / "report.html").read_text()
    page = visible_text(html)
    for text in (page, terminal):
        assert "pads every row to" not in text.split("completion_tokens has a long tail")[1].split(".")[0]
    batches = tables(html, "batches")[0]
    assert batches[0][:3] == ["batch size", "order", "padding"] and "input padding" not in batches[0]
    assert f"{round(100 * padding)}%" == batches[1][2]
    assert "Cells read sequence positions" in visible_text(html, "batches")
    assert "longest sequence (row" in visible_text(html, "batches") and "longest input" not in page
    # the chart's axis too
    charts = json.loads(parse(html).find("script", id="lengthscan-charts").text())
    titles = [c["encoding"]["y"].get("title") for c in charts["charts"].values() if "xOffset" in c.get("encoding", {})]
    assert titles == ["sequence padding"]
    # the fields line: the conversation column, not "text"
    assert ("sequence_tokens, prompt_tokens, completion_tokens, turns, assistant_turns, longest_message_tokens "
            "← column messages (conversations)") in page
    assert "(text)" not in visible_text(html, "details")


def test_prompt_completion_fields_name_both_columns(tmp_path, chat_tok_dir, docs, capsys):
    rows = [{"prompt": [m for m in r["messages"] if m["role"] == "user"],
             "completion": [m for m in r["messages"] if m["role"] == "assistant"]} for r in _chats(docs, 20)]
    src = write_jsonl(tmp_path / "pc.jsonl", rows)
    out = tmp_path / "pc"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--prompt", "prompt", "--completion",
                 "completion", "--chat-template", str(trl_template("qwen3")), "--out", str(out), "--no-cache"]) == 0
    assert "longest_message_tokens <- prompt, completion" in _terminal(capsys)
    assert "← columns prompt, completion (conversations)" in visible_text((out / "report.html").read_text())


def test_a_cleans_worst_rows_list_the_measurements(tmp_path, chat_tok_dir, docs, capsys):
    src = write_jsonl(tmp_path / "chats.jsonl", _chats(docs, 60))
    out = tmp_path / "clean"
    assert main(["clean", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(trl_template("qwen3_training")), "--limit", "sequence_tokens<=200", "--out", str(out),
                 "--no-cache", "--quiet"]) == 0
    data = json.loads((out / "report.json").read_text())
    measures = [f["name"] for f in data["fields"]]
    assert all(list(e["lengths"]) == measures for e in data["clean"]["worst_rows"])
    cells = [row[table[0].index("lengths")] for table in tables((out / "report.html").read_text(), "worst")
             for row in table[1:]]
    assert cells and all("sequence_tokens" in c for c in cells)
    for side in ("trained_from", "final_eot_at", "ends_with_eot", "from_sharegpt", "assistant_tokens"):
        assert not any(side in c for c in cells)


def test_a_failed_gate_says_it_once_and_what_would_have_been_done(tmp_path, corpus_jsonl, bpe_dir, capsys):
    out = tmp_path / "gated"
    code = main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=20", "--fail-over", "1%", "--out", str(out), "--no-cache"])
    assert code == 1 and not out.exists()
    terminal = _terminal(capsys)
    assert "gate failed: gate failed" not in terminal
    finding = re.search(r"The --fail-over gate failed: [\d.]+% of [\d,]+ rows would be dropped or truncated "
                        r"\(--fail-over 1%\)\.", terminal)
    assert finding
    assert "The --limit rules would drop" in terminal and "Cleaning dropped" not in terminal
    assert "Had the clean been published, " in terminal and "After cleaning" not in terminal


def test_rules_that_change_no_row_say_so(tmp_path, docs, bpe_dir, capsys):
    src = write_jsonl(tmp_path / "texts.jsonl", [{"text": d} for d in docs[:300] if d.strip()])
    out = tmp_path / "all"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=100000", "--out", str(out), "--no-cache"]) == 0
    rows = json.loads((out / "report.json").read_text())["decisions"]["splits"][0]["measured"]
    sentence = f"The --limit rules would keep every row ({rows:,} rows) as it is."
    terminal = _terminal(capsys)
    assert sentence in terminal and sentence in visible_text((out / "report.html").read_text())


def test_a_cleans_worst_rows_show_the_id_column_as_the_audits_do(tmp_path, docs, bpe_dir):
    rows = [{"doc_id": f"doc-{i:04d}", "text": d} for i, d in enumerate(docs[:300]) if d.strip()]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    by_row = {i: r["doc_id"] for i, r in enumerate(rows)}
    for redact in (False, True):
        out = tmp_path / f"clean-{redact}"
        assert main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--id", "doc_id", "--limit",
                     "input_tokens<=64:truncate", "--out", str(out), "--no-cache", "--quiet",
                     *(["--redact"] if redact else [])]) == 0
        html = (out / "report.html").read_text()
        shown = [dict(zip(t[0], row)) for t in tables(html, "worst") for row in t[1:]]
        assert shown
        if redact:
            assert all("id" not in r for r in shown) and "doc-0" not in html
        else:
            assert all(r["id"] == by_row[int(r["row"])] for r in shown)


def test_memory_with_packing_says_which_batch_fits(tmp_path, chat_tok_dir, docs, capsys):
    """memory --packing --budget: the verdict is the packed batch's; the terminal and the memory
    panel no longer say the unpacked worst batch "fits" when its own peak is over the budget."""
    from transformers import LlamaConfig

    from tests.support.chat import conversations

    model = tmp_path / "llama"
    LlamaConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=3100, max_position_embeddings=4096).save_pretrained(model)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": r["messages"]} for r in conversations(docs, 120, seed=4)])
    args = ["memory", str(src), "--model", str(model), "--tokenizer", str(chat_tok_dir), "--messages", "messages",
            "--chat-template", str(trl_template("qwen3_training")), "--batch-size", "4", "--attention", "flash",
            "--packing", "bfd", "--max-length", "256", "--no-cache"]
    assert main([*args, "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    unpacked, packed = memory["worst_batch"]["peak_bytes"], memory["packing"]["worst_batch"]["peak_bytes"]
    assert packed < unpacked
    budget = int((packed + unpacked) / 2 / 0.9)  # usable (90%) between the two peaks
    out = tmp_path / "mem"
    assert main([*args, "--budget", str(budget), "--out", str(out)]) == 0  # the packed verdict: fits
    terminal = " ".join(capsys.readouterr().out.split())
    assert "the packed worst batch fits; unpacked, the worst batch does NOT fit" in terminal
    panel = parse((out / "report.html").read_text()).find(id="memory")
    paragraphs = [p.text() for p in panel.find_all("p")]
    worst = next(t for t in paragraphs if t.startswith(("fits The worst", "does not fit The worst")))
    assert worst.startswith("does not fit The worst")
    packed_line = next(t for t in paragraphs if "Packed (bfd, L 256)" in t)
    assert packed_line.startswith("fits Packed") and "the verdict against the budget is this packed one" in packed_line


def test_a_conversation_of_content_parts_is_previewed_by_its_text(tmp_path, chat_tok_dir, docs):
    rows = [{"messages": [{"role": "user", "content": [{"type": "text", "text": f"Question {i}: {docs[i][:40]}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": docs[i + 1][:300]}]}]}
            for i in range(40)]
    src = write_jsonl(tmp_path / "parts.jsonl", rows)
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
                 str(trl_template("qwen2_5_vl")), "--out", str(out), "--no-cache", "--quiet"]) == 0
    shown = [dict(zip(t[0], row)) for t in tables((out / "report.html").read_text(), "worst") for row in t[1:]]
    assert shown
    for r in shown:
        i = int(r["row"])
        assert "[parts]" not in r["preview"] and f"user: Question {i}: " in r["preview"]
