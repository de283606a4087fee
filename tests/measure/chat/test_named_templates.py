"""``--chat-template NAME``: the templates TRL ships, by name, counting exactly as the same file
given by path; a name that is none gets the closest shipped names (exit 2)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from lengthscan.cli.main import main
from tests.support.chat import trl_template
from tests.support.wheels import required_wheel_file


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


def test_a_wheel_shipped_tokenizer_json_with_a_named_template(tmp_path, capsys):
    """The new user's path, no script: DeepSeek's tokenizer.json (shipped in litellm's wheel) with
    TRL's deepseekv3 template. Alone, the file does not say which token ``{{ bos_token }}`` is, so
    rendering would be a token short: exit 2 saying what to add. With a tokenizer_config.json naming
    it, the counts equal ``apply_chat_template`` on that folder."""
    from transformers import AutoTokenizer

    shipped = required_wheel_file("litellm", "litellm_core_utils/tokenizers/deepseek_tokenizer.json")
    src = _rows(tmp_path / "c.jsonl")
    args = ["audit", str(src), "--messages", "messages", "--chat-template", "deepseekv3", "--full", "--quiet"]
    assert main([*args, "--tokenizer", str(shipped), "--out", str(tmp_path / "lone")]) == 2
    err = capsys.readouterr().err
    assert "{{ bos_token }}" in err and "tokenizer_config.json" in err and "Traceback" not in err
    folder = tmp_path / "deepseek"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(shipped.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>"}))
    out = tmp_path / "out"
    assert main([*args, "--tokenizer", str(folder / "tokenizer.json"), "--out", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(folder)
    template = trl_template("deepseekv3").read_text()
    want = [len(tok.apply_chat_template(json.loads(line)["messages"], chat_template=template, tokenize=True,
                                        return_dict=True)["input_ids"]) for line in src.read_text().splitlines()]
    assert pq.read_table(out / "lengths.parquet").to_pydict()["sequence_tokens"] == want
