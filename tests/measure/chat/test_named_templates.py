"""``--chat-template NAME``: the templates TRL ships, by name, counting exactly as the same file
given by path; a name that is none gets the closest shipped names (exit 2)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from lengthscan.cli.main import main
from tests.support.chat import trl_template


def _rows(path):
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                          {"role": "assistant", "content": "An answer. " * (i + 1)}]} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_shipped_template_by_name_counts_as_its_file(tmp_path, chat_tok_dir):
    src = _rows(tmp_path / "c.jsonl")
    got = {}
    for how, template in (("name", "qwen3_training"), ("file", str(trl_template("qwen3_training"))),
                          ("name.jinja", "qwen3_training.jinja")):
        out = tmp_path / how
        assert main(["audit", str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir),
                     "--chat-template", template, "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
        table = pq.read_table(out / "lengths.parquet").to_pydict()
        got[how] = (table["sequence_tokens"], table["completion_tokens"])
    assert got["name"] == got["file"] == got["name.jinja"]
    assert all(n > 0 for n in got["name"][1])


def test_an_unknown_name_suggests_the_closest(tmp_path, chat_tok_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _rows(tmp_path / "c.jsonl")
    assert main(["audit", str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir),
                 "--chat-template", "qwen3_trainig", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "did you mean qwen3_training" in err and "Traceback" not in err
