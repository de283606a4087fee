"""A column that is not of the kind its flag asks for (plain text given as --messages, paths that
are all missing given as --audio) is exit 2 naming the column and the first reasons, in audit and
clean, on both sides of the threshold; nothing is published."""

from __future__ import annotations

import json

import pytest

from lengthscan.cli.main import main
from lengthscan.engines.validity import INVALID_SHARE
from tests.factories import write_jsonl
from tests.support import audio_files as af
from tests.support.chat import trl_template


@pytest.mark.parametrize("command", ["audit", "clean"])
def test_plain_text_given_as_conversations_is_exit_2(tmp_path, chat_tok_dir, docs, command, capsys):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"document": d} for d in docs[:300]])
    out = tmp_path / "out"
    sample = ["--full"] if command == "audit" else []
    code = main([command, str(src), "--messages", "document", "--tokenizer", str(chat_tok_dir), "--chat-template",
                 str(trl_template("qwen3")), *sample, "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "column 'document'" in err and "every row measured is invalid_conversation" in err
    assert "row 0: the conversation is a str, not a list of messages" in err and "Traceback" not in err
    assert not out.exists()


def test_a_few_bad_rows_are_row_reasons_not_a_refusal(tmp_path, chat_tok_dir, capsys):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    n_bad = 3
    rows = [good] * 20 + [{"messages": "not a conversation"}] * n_bad
    assert n_bad / len(rows) < INVALID_SHARE
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir), "--chat-template",
                 str(trl_template("qwen3")), "--full", "--quiet", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["splits"][0]["roles"]["chat"]["flags"] == {"invalid_conversation": n_bad}


def test_an_audio_column_whose_files_are_nearly_all_missing_is_exit_2(tmp_path, capsys):
    af.write_audio(tmp_path / "here.wav", 8000, 8000)
    rows = [{"path": "here.wav"}] + [{"path": f"gone{i}.wav"} for i in range(40)]
    src = write_jsonl(tmp_path / "m.jsonl", rows)
    assert main(["audit", str(src), "--audio", "path", "--full", "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "column 'path' (--audio): 40 of 41 rows measured are missing_file" in err
    assert "relative to another folder" in err and "row 1:" in err


def test_the_report_does_not_call_rows_without_a_length_within_the_limits(tmp_path, chat_tok_dir):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    src = write_jsonl(tmp_path / "c.jsonl", [good] * 20 + [{"messages": 7}] * 3)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir), "--chat-template",
                 str(trl_template("qwen3")), "--full", "--quiet", "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "Every row is within" not in html
    assert "Every row with a length is within the known limits" in html
    assert "rows without a length are not in it" in html
