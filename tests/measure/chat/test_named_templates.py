"""``--chat-template NAME``: the templates TRL ships, by name, counting exactly as the same file
given by path; a name that is none gets the closest shipped names (exit 2)."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import write_jsonl
from tests.support.chat import has_generation, trl_template
from tests.support.cli import one_line
from tests.support.wheels import required_wheel_file


def _rows(path):
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                          {"role": "assistant", "content": "An answer. " * (i + 1)}]} for i in range(6)]
    return write_jsonl(path, rows)


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


@pytest.mark.slow  # imports trl's chat_template_utils (and torch)
def test_the_training_swap_is_trls_for_every_shipped_template(chat_tok):
    """``SFTTrainer(assistant_only_loss=True)`` renders a template without generation blocks with
    the training template ``get_training_chat_template`` gives (or refuses it): lengthscan's swap is
    TRL's own for every template TRL ships, and for none that differs from them by a character."""
    from trl.chat_template_utils import get_training_chat_template

    from lengthscan.measure.chat.named import shipped_folder, training_swap

    saved, swapped = chat_tok.chat_template, 0
    try:
        for path in sorted(shipped_folder().glob("*.jinja")):
            text = path.read_text(encoding="utf-8")
            if has_generation(path):
                continue
            chat_tok.chat_template = text
            try:
                want = get_training_chat_template(chat_tok)
            except ValueError:  # TRL refuses it: no training template
                want = None
            got = training_swap(text)
            assert (got[2] if got else None) == want, path.name
            if got:
                assert (got[0], got[1]) == (path.stem, f"{path.stem}_training")
                swapped += 1
            assert training_swap(text + "\n") is None
    finally:
        chat_tok.chat_template = saved
    assert swapped >= 30


def test_an_original_is_counted_as_sftrainer_renders_it(tmp_path, chat_tok_dir, capsys):
    """``--chat-template llama3`` (TRL's original, no generation blocks): with ``--train-on
    assistant`` the counts are those of llama3_training and its assistant mask, which
    SFTTrainer(assistant_only_loss=True) trains on, and the terminal says so; with ``--train-on all``
    (assistant_only_loss=False) llama3's own rendering."""
    import shutil

    from transformers import AutoTokenizer

    tok_dir = tmp_path / "tok"  # the chat tokenizer with Llama 3's BOS
    shutil.copytree(chat_tok_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|begin_of_text|>"}))
    chat_tok = AutoTokenizer.from_pretrained(tok_dir)
    src = _rows(tmp_path / "c.jsonl")
    messages = [json.loads(line)["messages"] for line in src.read_text().splitlines()]
    for train_on, name in (("assistant", "llama3_training"), ("all", "llama3")):
        out = tmp_path / train_on
        assert main(["audit", str(src), "--messages", "messages", "--tokenizer", str(tok_dir), "--chat-template",
                     "llama3", "--train-on", train_on, "--full", "--no-cache", "--out", str(out)]) == 0
        terminal = " ".join(capsys.readouterr().out.split())
        table = pq.read_table(out / "lengths.parquet").to_pydict()
        refs = [chat_tok.apply_chat_template(m, chat_template=trl_template(name).read_text(), tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=train_on == "assistant")
                for m in messages]
        assert table["sequence_tokens"] == [len(r["input_ids"]) for r in refs]
        if train_on == "assistant":
            assert table["completion_tokens"] == [sum(r["assistant_masks"]) for r in refs]
            assert "assistant mask of TRL's llama3_training template" in terminal
        else:
            assert "llama3_training" not in terminal


def test_a_tokenizer_without_a_template_is_told_of_trls_names(tmp_path, bpe_dir, docs, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": d[:50]},
                                                           {"role": "assistant", "content": d[:80]}]}
                                             for d in docs[:5]], ensure_ascii=False)
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--messages", "messages",
                 "--out", str(tmp_path / "o")]) == 2
    err = one_line(capsys, "--chat-template FILE|NAME", "qwen3")
    name = re.search(r"TRL ships: (\w+)", err).group(1)
    assert trl_template(name).is_file()  # the name it offers is one that --chat-template takes
