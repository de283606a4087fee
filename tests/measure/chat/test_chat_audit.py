"""``lengthscan audit --messages``: every count equals a direct ``apply_chat_template`` call (and
TRL's common-prefix rule), for real templates with and without ``{% generation %}`` blocks."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import conversations, not_trls, reference, trl_template, trl_training_text, write_jsonl

#: TRL's templates: with generation blocks (qwen3_training, llama3_training, gptoss_training) and
#: without: originals SFTTrainer(assistant_only_loss=True) swaps for their training templates (qwen2_5,
#: qwen3, gemma3, gptoss), one it has none for (llama3_1: the common-prefix rule), and a copy of qwen3
#: that is not TRL's to the character (no swap; <think> only on the last turn rewrites history).
TEMPLATES = ["qwen3_training", "llama3_training", "gptoss_training", "qwen2_5", "qwen3", "llama3_1", "gemma3",
             "gptoss", "qwen3-copy"]


def _template(name: str, tmp_path):
    """TRL's template ``name``; ``NAME-copy``: the same with a comment added (not TRL's any more)."""
    return not_trls(name[:-len("-copy")], tmp_path) if name.endswith("-copy") else trl_template(name)


def _audit(*args) -> int:
    return main(["audit", *map(str, args), "--quiet", "--no-cache"])


@pytest.fixture(scope="module")
def rows(docs):
    return conversations(docs, 160, seed=3)


# the fast loop keeps one training template (generation blocks) and one plain; the full run all of them
@pytest.mark.parametrize("name", [n if n in ("llama3_training", "qwen2_5") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in TEMPLATES])
def test_counts_equal_apply_chat_template(tmp_path, chat_tok_dir, chat_tok, rows, name):
    template = _template(name, tmp_path)
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--tools", "tools", "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    rendered = counted = 0
    for i, row in enumerate(rows):
        seq, comp = reference(chat_tok, template, row["messages"], row.get("tools"))
        assert table["sequence_tokens"][i] == seq, (name, i, table["chat_error"][i])
        assert table["completion_tokens"][i] == comp, (name, i)
        if seq is not None:
            rendered += 1
            assert table["prompt_tokens"][i] == (seq - comp if comp is not None else None)
            assert table["turns"][i] == len(row["messages"])
            assert table["assistant_turns"][i] == sum(m["role"] == "assistant" for m in row["messages"])
            assert table["rewrites_history"][i] == (comp is None)
        else:
            assert table["chat_flag"][i] == "template_error" and table["chat_error"][i]
        counted += comp is not None
    assert rendered > len(rows) // 2
    report = json.loads((out / "report.json").read_text())
    chat = report["splits"][0]["chat"]
    assert chat["measured"] == rendered and chat["counted"] == counted
    if name == "qwen3-copy":  # renders <think> only on the last assistant turn: multi-turn rows are not counted
        assert counted < rendered
    rendered_with = trl_training_text(chat_tok, template.read_text())  # what SFTTrainer renders with
    got = report["chat"]["template"]
    assert got["generation_blocks"] == bool(re.search(r"\{%-?\s*generation\s*-?%\}", rendered_with))
    swapped = rendered_with != template.read_text()
    assert ("trl_training_swap" in got) == swapped
    if swapped:
        assert got["trl_training_swap"] == {"original": name, "training": f"{name}_training"}
        assert f"TRL's {name}_training template" in report["chat"]["trained_tokens"]


@pytest.mark.parametrize("train_on", ["last", "all"])
@pytest.mark.parametrize("name", ["qwen3_training", "qwen2_5"])
def test_train_on(tmp_path, chat_tok_dir, chat_tok, rows, name, train_on):
    template = trl_template(name)
    src = write_jsonl(tmp_path / "chat.jsonl", rows[:60])
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--tools", "tools", "--train-on", train_on, "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows[:60]):
        seq, comp = reference(chat_tok, template, row["messages"], row.get("tools"), train_on=train_on)
        assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == (seq, comp), (i, train_on)


def test_end_of_turn_and_side_columns(tmp_path, chat_tok_dir, chat_tok, rows):
    src = write_jsonl(tmp_path / "chat.jsonl", rows[:40])
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", trl_template("qwen3_training"),
                  "--messages", "messages", "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    eot = chat_tok.convert_tokens_to_ids("<|im_end|>")
    for i, row in enumerate(rows[:40]):
        ids = chat_tok.apply_chat_template(row["messages"], chat_template=trl_template("qwen3_training").read_text(),
                                           tokenize=True)["input_ids"]
        assert table["ends_with_eot"][i] is True and ids[table["final_eot_at"][i]] == eot
        first = table["trained_from"][i]
        assert ids[:first] == chat_tok.apply_chat_template(
            row["messages"][:[m["role"] for m in row["messages"]].index("assistant")],
            chat_template=trl_template("qwen3_training").read_text(), tokenize=True,
            add_generation_prompt=True)["input_ids"][:first]
        # a message's tokens: the rendering's tokens overlapping its text (found in order)
        text = chat_tok.apply_chat_template(row["messages"], chat_template=trl_template("qwen3_training").read_text(),
                                            tokenize=False)
        offsets = chat_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        counts, cursor = [], 0
        for m in row["messages"]:
            if not m.get("content"):
                continue
            needle = m["content"] if m["content"] in text[cursor:] else m["content"].strip()
            start = text.index(needle, cursor)
            cursor = start + len(needle)
            counts.append((m["role"], sum(1 for a, b in offsets if b > start and a < cursor)))
        assert table["longest_message_tokens"][i] == max(n for _, n in counts)
        for r in ("system", "user", "assistant", "tool"):
            assert table[f"{r}_tokens"][i] == sum(n for role, n in counts if role == r)


def test_sharegpt_prompt_completion_and_bad_rows(tmp_path, chat_tok_dir, chat_tok):
    template = trl_template("qwen2_5")
    rows = [
        {"conversations": [{"from": "system", "value": "Be short."}, {"from": "human", "value": "Hi"},
                           {"from": "gpt", "value": "Hello."}]},
        {"conversations": [{"from": "human", "value": "Weather?"},
                           {"from": "function_call", "value": json.dumps({"name": "get_weather",
                                                                          "arguments": {"city": "Oslo"}})},
                           {"from": "observation", "value": "rain"}, {"from": "gpt", "value": "It rains."}]},
        {"conversations": "not a list"},
        {"conversations": [{"from": "human", "value": "x"}, {"from": "wizard", "value": "y"}]},
        {"conversations": [{"value": "no role"}]},
        {"conversations": [{"from": "human", "value": [{"type": "image", "url": "a.png"}]}]},
        {"conversations": None},
    ]
    src = write_jsonl(tmp_path / "share.jsonl", rows)
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "conversations",
                  "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    converted = [
        [{"role": "system", "content": "Be short."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}],
        [{"role": "user", "content": "Weather?"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
         {"role": "tool", "content": "rain"}, {"role": "assistant", "content": "It rains."}]]
    for i, messages in enumerate(converted):
        assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == reference(chat_tok, template, messages)
    assert table["chat_flag"][2:] == ["invalid_conversation", "invalid_conversation", "invalid_conversation",
                                      "unsupported_content", "missing"]
    assert "not a list" in table["chat_error"][2] and "'wizard'" in table["chat_error"][3]
    assert "no 'role'" in table["chat_error"][4]
    assert "image part" in table["chat_error"][5] and "--processor" in table["chat_error"][5]
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["sharegpt_converted"] is True

    pc = [{"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]},
          {"prompt": "The sky is", "completion": " blue."}]
    src = write_jsonl(tmp_path / "pc.jsonl", pc)
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--prompt", "prompt",
                  "--completion", "completion", "--full", "--out", out, "--overwrite") == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    text = template.read_text()
    p = chat_tok.apply_chat_template(pc[0]["prompt"], chat_template=text, add_generation_prompt=True)["input_ids"]
    pcids = chat_tok.apply_chat_template(pc[0]["prompt"] + pc[0]["completion"], chat_template=text)["input_ids"]
    from trl.data_utils import common_prefix_length

    assert table["sequence_tokens"][0] == len(pcids)
    assert table["completion_tokens"][0] == len(pcids) - common_prefix_length(p, pcids)
    full = chat_tok("The sky is blue." + chat_tok.eos_token)["input_ids"]
    assert table["sequence_tokens"][1] == len(full)
    assert table["completion_tokens"][1] == len(full) - common_prefix_length(chat_tok("The sky is")["input_ids"], full)


def test_content_parts(tmp_path, chat_tok_dir, chat_tok):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is in the text?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Nothing much."}]}]
    plain = [{"role": "user", "content": "What is in the text?"}, {"role": "assistant", "content": "Nothing much."}]
    # a plain row beside it: a source whose every row the template fails on is exit 2 (test_validity)
    src = write_jsonl(tmp_path / "parts.jsonl", [{"messages": parts}, {"messages": plain}])
    expect = {"qwen2_5": "template_error", "qwen3": "parts_not_rendered", "llama3_1": "parts_not_rendered",
              "qwen3_training": "parts_not_rendered", "gemma3": None, "qwen3_6": None}
    for name, what in expect.items():
        out = tmp_path / name
        assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", trl_template(name), "--messages",
                      "messages", "--full", "--out", out) == 0
        table = pq.read_table(out / "lengths.parquet").to_pydict()
        seq, _ = reference(chat_tok, trl_template(name), parts)
        assert table["sequence_tokens"][0] == seq
        if what == "template_error":
            assert table["chat_flag"][0] == "template_error"
        else:
            assert table["parts_not_rendered"][0] is (what == "parts_not_rendered"), name


def test_string_prompt_completion_needs_no_template(tmp_path, bpe_dir, capsys):
    """TRL tokenizes string prompt-completion rows as they are (the completion with the EOS text
    appended): a base model's tokenizer without a chat template measures them, the end of turn being
    EOS; rows of messages in the same columns are refused with the fix (a row's reason; all of them:
    exit 2)."""
    from transformers import AutoTokenizer
    from trl.data_utils import common_prefix_length

    tok = AutoTokenizer.from_pretrained(bpe_dir)
    assert not tok.chat_template
    pc = [{"prompt": "The sky is", "completion": " blue."}, {"prompt": "Two and two make", "completion": " four</s>"},
          {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]}]
    src = write_jsonl(tmp_path / "pc.jsonl", pc)
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", bpe_dir, "--prompt", "prompt", "--completion", "completion", "--full",
                  "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(pc[:2]):
        completion = row["completion"] if row["completion"].endswith("</s>") else row["completion"] + "</s>"
        prompt_ids, ids = tok(row["prompt"])["input_ids"], tok(row["prompt"] + completion)["input_ids"]
        assert table["sequence_tokens"][i] == len(ids)
        assert table["completion_tokens"][i] == len(ids) - common_prefix_length(prompt_ids, ids)
        assert ids[table["final_eot_at"][i]] == tok.eos_token_id  # the end of turn: EOS
    assert table["chat_flag"][2] == "template_error" and "--chat-template" in table["chat_error"][2]
    src = write_jsonl(tmp_path / "messages.jsonl", pc[2:])
    assert _audit(src, "--tokenizer", bpe_dir, "--prompt", "prompt", "--completion", "completion", "--full",
                  "--out", tmp_path / "o2") == 2
    assert "has no chat template" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["no_template", "bad_file", "syntax", "target_too", "no_offsets", "drop_turns_pc"])
def test_usage_errors_exit_2(request, tmp_path, chat_tok_dir, capsys, case):
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "t": "x"}])
    tok = request.getfixturevalue("marian_dir") if case == "no_offsets" else chat_tok_dir
    args = ["--tokenizer", tok, "--messages", "messages", "--out", tmp_path / "o"]
    if case == "no_offsets":  # a Python-only tokenizer: no offsets for the generation spans
        args += ["--chat-template", trl_template("qwen3_training")]
    if case == "drop_turns_pc":
        args = ["--tokenizer", tok, "--prompt", "t", "--completion", "t", "--chat-template", trl_template("qwen2_5"),
                "--limit", "sequence_tokens<=10", "--action", "drop-turns", "--out", tmp_path / "o"]
    if case == "bad_file":
        args += ["--chat-template", tmp_path / "missing.jinja"]
    elif case == "syntax":
        (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }")
        args += ["--chat-template", tmp_path / "bad.jinja"]
    elif case == "target_too":
        args += ["--chat-template", trl_template("qwen2_5"), "--target", "t"]
    assert _audit(src, *args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("lengthscan: error:")
    assert {"no_template": "--chat-template FILE", "bad_file": "cannot read", "syntax": "does not compile",
            "target_too": "not both", "no_offsets": "no character offsets",
            "drop_turns_pc": "needs --messages"}[case] in err


def test_lengths_cache(tmp_path, chat_tok_dir, rows):
    """A second audit of the same conversations reads the cached measurements; a clean with
    --tokenize after it writes the ids TRL's rule gives (measured again only for the kept rows)."""
    from datasets import load_from_disk

    src = write_jsonl(tmp_path / "chat.jsonl", [{"id": r["id"], "messages": r["messages"]} for r in rows[:50]])
    template = trl_template("qwen3_training")
    args = ["--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages"]
    outs = []
    for k in range(2):
        out = tmp_path / f"a{k}"
        assert main(["audit", str(src), *map(str, args), "--full", "--quiet", "--out", str(out)]) == 0
        outs.append(out)
    first, second = (pq.read_table(o / "lengths.parquet") for o in outs)
    assert first.equals(second)
    assert json.loads((outs[0] / "report.json").read_text())["cache_hits"] == 0
    assert json.loads((outs[1] / "report.json").read_text())["cache_hits"] == 1
    other = tmp_path / "a2"  # another template is another measurement: not read from the cache
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(trl_template("qwen2_5")),
                 "--messages", "messages", "--full", "--quiet", "--out", str(other)]) == 0
    assert json.loads((other / "report.json").read_text())["cache_hits"] == 0
    out = tmp_path / "clean"
    assert main(["clean", str(src), *map(str, args), "--limit", "sequence_tokens<=400", "--tokenize", "--quiet",
                 "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["cache_hits"] == 1
    tok_text = template.read_text()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_tok_dir)
    for row in load_from_disk(out / "dataset"):
        ref = tok.apply_chat_template(rows[row["id"]]["messages"], chat_template=tok_text,
                                      return_assistant_tokens_mask=True)
        assert row["input_ids"] == ref["input_ids"]
        assert row["labels"] == [t if m else -100 for t, m in zip(ref["input_ids"], ref["assistant_masks"])]


def test_jsonl_values_as_the_file_holds_them(tmp_path, chat_tok_dir, chat_tok):
    """pyarrow's JSON reader unifies a column's types across rows (1 -> 1.0 beside 1.5, a date string
    -> a timestamp, keys in first-seen order, missing keys as null); the template must see what the
    file holds, as apply_chat_template does on json.loads of each line."""
    def call(args):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": args}}]}

    tools = json.dumps([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "number", "default": None}}}}}])
    rows = [{"messages": [{"role": "user", "content": "x"}, call({"a": 1, "b": "x"}),
                          {"role": "tool", "content": "1"}, {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user", "content": "y"}, call({"b": "y", "a": 1.5, "when": "2024-05-01", "z": None}),
                          {"role": "tool", "content": "2"}, {"role": "assistant", "content": "done"}],
             "tools": tools}]
    typed = write_jsonl(tmp_path / "typed.jsonl", rows)
    # a column whose type changes between rows sends the file through datasets' reader instead
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [dict(r, meta=v) for r, v in zip(rows, [1, "x"])])
    for src, name in ((typed, "qwen2_5"), (typed, "qwen3_training"), (mixed, "qwen2_5")):
        out = tmp_path / f"{src.stem}-{name}"
        assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", trl_template(name), "--messages",
                      "messages", "--tools", "tools", "--full", "--out", out) == 0
        table = pq.read_table(out / "lengths.parquet").to_pydict()
        for i, row in enumerate(rows):
            assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == \
                reference(chat_tok, trl_template(name), row["messages"], row.get("tools")), (name, i)


def test_a_prefix_the_template_refuses_keeps_the_length(tmp_path, chat_tok_dir, chat_tok):
    # qwen3_5_nothink raises "No user query found in messages." on [system, assistant]: the whole
    # conversation still renders, so it has a length (and no per-turn count)
    messages = [{"role": "system", "content": "Be kind."}, {"role": "assistant", "content": "Hello, how can I help?"},
                {"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a time."}]
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": messages}])
    template = _template("qwen3_5_nothink-copy", tmp_path)  # TRL's own would be swapped for its training one
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", chat_tok_dir, "--chat-template", template, "--messages", "messages",
                  "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    seq = len(chat_tok.apply_chat_template(messages, chat_template=template.read_text())["input_ids"])
    assert table["sequence_tokens"][0] == seq
    assert table["completion_tokens"][0] is None and "does not render" in table["chat_error"][0]


def test_named_templates_pick_tool_use_for_rows_with_tools(tmp_path, chat_tok_dir):
    import shutil

    from transformers import AutoTokenizer

    tok_dir = tmp_path / "tok"
    shutil.copytree(chat_tok_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": trl_template("qwen2_5").read_text()},
                               {"name": "tool_use", "template": trl_template("qwen3").read_text()}]
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert isinstance(tok.chat_template, dict) and "tool_use" in tok.chat_template
    messages = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": "Rain."}]
    rows = [{"messages": messages}, {"messages": messages, "tools": json.dumps([{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}])}]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "out"
    # --train-on all (SFTTrainer's default, assistant_only_loss=False): apply_chat_template's own pick
    assert _audit(src, "--tokenizer", tok_dir, "--messages", "messages", "--tools", "tools", "--full",
                  "--train-on", "all", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows):
        tools = json.loads(row["tools"]) if row.get("tools") else None
        assert table["sequence_tokens"][i] == len(tok.apply_chat_template(row["messages"], tools=tools)["input_ids"])
    assert table["sequence_tokens"][0] != table["sequence_tokens"][1]
    # assistant_only_loss=True: TRL swaps the default (qwen2_5) for its training template, for every row
    training = trl_training_text(tok, tok.chat_template["default"])
    assert training == trl_template("qwen2_5_training").read_text()
    assert _audit(src, "--tokenizer", tok_dir, "--messages", "messages", "--tools", "tools", "--full",
                  "--out", tmp_path / "swapped") == 0
    table = pq.read_table(tmp_path / "swapped" / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows):
        tools = json.loads(row["tools"]) if row.get("tools") else None
        assert table["sequence_tokens"][i] == len(
            tok.apply_chat_template(row["messages"], tools=tools, chat_template=training)["input_ids"])


@pytest.mark.parametrize("tok,name", [("claude_bpe_dir", "qwen3_training"), ("mistral_spm_dir", "llama3_training"),
                                      ("mistral_spm_dir", "qwen2_5")])
def test_tokenizers_from_wheels(request, tmp_path, rows, tok, name):
    """Real tokenizers shipped in PyPI wheels (Anthropic's byte-level BPE, Mistral-7B's SentencePiece
    with byte fallback): their control tokens are not the template's, which then tokenizes as text;
    counts still equal apply_chat_template's, spans included (byte-fallback tokens share offsets)."""
    from transformers import AutoTokenizer

    tok_dir = request.getfixturevalue(tok)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    template = trl_template(name)
    src = write_jsonl(tmp_path / "chat.jsonl", rows[:60])
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", tok_dir, "--chat-template", template, "--messages", "messages",
                  "--tools", "tools", "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for i, row in enumerate(rows[:60]):
        assert (table["sequence_tokens"][i], table["completion_tokens"][i]) == \
            reference(tokenizer, template, row["messages"], row.get("tools")), (tok, name, i)


def test_num_proc_gives_identical_results(tmp_path, chat_tok_dir, rows):
    """``num_proc=2`` (the parent measures beside one worker process, rendering being Python): every
    row's values, flags and side columns, and the report's splits, as in one process."""
    import lengthscan

    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    kw = dict(tokenizer=str(chat_tok_dir), messages="messages", tools="tools", chat_template=trl_template("qwen3"),
              full=True, cache=False, batch_rows=16)
    one = lengthscan.audit(str(src), out=str(tmp_path / "one"), **kw)
    two = lengthscan.audit(str(src), out=str(tmp_path / "two"), num_proc=2, **kw)
    lengths = [pq.read_table(tmp_path / name / "lengths.parquet") for name in ("one", "two")]
    assert lengths[0].equals(lengths[1])
    assert one.to_dict()["splits"] == two.to_dict()["splits"]


def test_a_pickled_chat_counter_needs_no_tokenizer(chat_tok_dir, tmp_path, monkeypatch):
    """A worker's chat counter renders and tokenizes by the fast path the parent proved (remembered on
    disk), with the template and end-of-turn token the parent read: it never loads the tokenizer."""
    import pickle

    from lengthscan.measure.chat.conversations import ChatFormat
    from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
    from lengthscan.measure.chat.metrics import chat_metrics
    from lengthscan.measure.text import handle
    from lengthscan.measure.text.counter import TokenCounter

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    chat = ChatCounter(TokenCounter(str(chat_tok_dir)), ChatOptions(ChatFormat(messages="messages"),
                                                                   trl_template("qwen3_training")))
    chat.check()  # the parent: proves the chat role's fast path (remembered) and reads the template
    worker = pickle.loads(pickle.dumps(chat))

    def refuse(self):
        raise AssertionError("the worker loaded the tokenizer")

    monkeypatch.setattr(handle.TokenizerHandle, "_load", refuse)
    convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]] * 3
    spec_of = {m: m for m in chat_metrics()}
    got = worker.measure({"messages": convs}, spec_of)
    want = chat.measure({"messages": convs}, spec_of)
    assert {k: list(v) for k, v in got.values.items()} == {k: list(v) for k, v in want.values.items()}
    assert not worker.counter.loaded


@pytest.mark.parametrize("template", ["file", "the tokenizer's"])
def test_a_later_run_renders_without_loading_the_tokenizer(chat_tok_dir, chat_tok, tmp_path, monkeypatch, template):
    """The run that loads the tokenizer remembers what rendering reads off it (its template,
    special tokens and added tokens: ``measure/text/facts.py``) beside the proven fast path; a
    later run on the same files renders and counts as the first did without loading it (seconds,
    and a second copy of the backend, saved)."""
    from lengthscan.measure.chat.conversations import ChatFormat
    from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
    from lengthscan.measure.chat.metrics import chat_metrics
    from lengthscan.measure.text import handle
    from lengthscan.measure.text.counter import TokenCounter
    from lengthscan.measure.text.facts import TokenizerFacts

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    tok = chat_tok_dir
    if template != "file":  # a folder whose tokenizer_config.json holds the template
        tok = tmp_path / "tok"
        shutil.copytree(chat_tok_dir, tok)
        config = json.loads((tok / "tokenizer_config.json").read_text())
        config["chat_template"] = (Path(trl_template("qwen3_training"))).read_text()
        (tok / "tokenizer_config.json").write_text(json.dumps(config))
    options = ChatOptions(ChatFormat(messages="messages"), trl_template("qwen3_training") if template == "file"
                          else None)
    convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
              {"role": "assistant", "content": "6, as the last turn says"}]]
    spec_of = {m: m for m in chat_metrics()}
    first = ChatCounter(TokenCounter(str(tok)), options)
    want = first.measure({"messages": convs}, spec_of)
    assert first.counter.loaded
    assert TokenizerFacts.of(first.counter.tokenizer).special_tokens_map == first.counter.tokenizer.special_tokens_map

    def refuse(self):
        raise AssertionError("the later run loaded the tokenizer")

    monkeypatch.setattr(handle.TokenizerHandle, "_load", refuse)
    later = ChatCounter(TokenCounter(str(tok)), options)
    got = later.measure({"messages": convs}, spec_of)
    assert {k: list(v) for k, v in got.values.items()} == {k: list(v) for k, v in want.values.items()}
    assert later.to_dict() == first.to_dict()  # the report's template, end-of-turn token, trained-token rule
    assert later.eot_id == chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert not later.counter.loaded
