"""Preference pairs against TRL's own DPOTrainer, built on CPU with a tiny random Llama: per row,
the lengths of the ``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` its dataset preparation makes
(string rows with the tokenizer's BOS and the EOS text it appends; conversations through a chat
template TRL ships; explicit and implicit prompts), the rows it drops under ``max_length`` and the
pairs its collator leaves identical (``DataCollatorForPreference`` with ``keep_start`` and
``keep_end``)."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl
from tests.support.trainers import cpu_config, tiny_llama, trainer_tokenizer, with_row_ids

pytest.importorskip("trl")
pytest.importorskip("torch")


def _trainer(tokenizer_dir, rows: list[dict], template: str | None, max_length: int | None, mode: str):
    """DPOTrainer's prepared dataset and collator for ``rows`` (a ``row`` column keeps their order)."""
    from trl import DPOConfig, DPOTrainer

    tok = trainer_tokenizer(tokenizer_dir, template)
    model = tiny_llama(tok)
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), train_dataset=with_row_ids(rows),
                         args=cpu_config(DPOConfig, max_length=max_length, truncation_mode=mode), processing_class=tok)
    return trainer.train_dataset, trainer.data_collator


def _collapsed(collator, prepared_row) -> bool:
    """Whether the collator's chosen and rejected sequences of the row are the same."""
    batch = collator([prepared_row])
    ids, mask = batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    chosen = [t for t, m in zip(ids[0], mask[0]) if m]
    rejected = [t for t, m in zip(ids[1], mask[1]) if m]
    return chosen == rejected


def _string_rows(docs: list[str]) -> list[dict]:
    rows = []
    for k in range(12):
        text = docs[k * 3][:160] or "An empty document."
        cut = max(1, len(text) // 2)
        prompt, answer = text[:cut], text[cut:] or " done."
        other = (docs[k * 3 + 1][:40] or "no") if k % 4 else answer[: len(answer) // 2] + " but otherwise."
        rows.append({"prompt": prompt, "chosen": answer, "rejected": " " + other})
    rows.append({"prompt": "Same answers:", "chosen": " yes", "rejected": " yes"})  # equal: collapsed as given
    long = " ".join(d for d in docs[60:80] if d)[:400]
    rows.append({"prompt": long, "chosen": " yes", "rejected": " no"})  # the prompt alone fills 48 tokens
    rows.append({"prompt": "Q:", "chosen": " " + long + " A", "rejected": " " + long + " B"})  # differ at the end
    rows.append({"prompt": "Q:", "chosen": " A " + long, "rejected": " B " + long})  # differ at the start
    return rows


@pytest.mark.parametrize("max_length,mode", [(None, "keep_start"), (48, "keep_start"), (40, "keep_end")])
def test_string_pairs_equal_dpotrainers_ids(tmp_path, mistral_spm_dir, docs, max_length, mode):
    rows = _string_rows(docs)
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "out"
    extra = ["--pair-max-length", str(max_length), "--truncation-mode", mode] if max_length else []
    assert main(["audit", str(src), "--tokenizer", str(mistral_spm_dir), "--prompt", "prompt", "--chosen", "chosen",
                 "--rejected", "rejected", "--full", "--quiet", "--no-cache", "--out", str(out), *extra]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    prepared, collator = _trainer(mistral_spm_dir, rows, None, max_length, mode)
    kept = {r["row"]: r for r in prepared}
    for i in range(len(rows)):
        assert table["pair_error"][i] is None, table["pair_error"][i]
        assert table["trainer_drops"][i] == (i not in kept), i
        if i not in kept:
            continue
        r = kept[i]
        assert (table["prompt_tokens"][i], table["chosen_tokens"][i], table["rejected_tokens"][i]) == \
            (len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])), i
        longer = len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"]))
        assert (table["sequence_tokens"][i], table["pair_tokens"][i]) == (longer, 2 * longer)
        assert table["pair_collapsed"][i] == _collapsed(collator, r), i
    assert table["pair_collapsed"][12]
    if max_length == 48:
        assert table["trainer_drops"][13] and table["pair_collapsed"][14] and not table["pair_collapsed"][15]
    if max_length == 40:  # keep_end
        assert table["prompt_cut"][13] and table["pair_collapsed"][15] and not table["pair_collapsed"][14]
    report = json.loads((out / "report.json").read_text())
    assert report["preference"]["trainer"] == "DPOTrainer"


def test_implicit_prompts_and_conversations(tmp_path, chat_tok_dir, docs):
    """Rows without a prompt column: TRL's extract_prompt finds it (strings by characters, with its
    trailing space rule; conversations by messages); conversations rendered by TRL's qwen3 template."""
    template = trl_template("qwen3").read_text()
    convs = []
    for k in range(8):
        q = docs[k][:80] or "Why?"
        user = {"role": "user", "content": q}
        convs.append({"chosen": [user, {"role": "assistant", "content": docs[k + 20][:90]}],
                      "rejected": [user, {"role": "assistant", "content": docs[k + 40][:30]}]})
    src = write_jsonl(tmp_path / "conv.jsonl", convs)
    out = tmp_path / "conv"
    path = tmp_path / "qwen3.jinja"
    path.write_text(template)
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(path), "--chosen",
                 "chosen", "--rejected", "rejected", "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    prepared, _ = _trainer(chat_tok_dir, convs, template, None, "keep_start")
    for r in prepared:
        i = r["row"]
        assert table["pair_error"][i] is None, table["pair_error"][i]
        assert (table["prompt_tokens"][i], table["chosen_tokens"][i], table["rejected_tokens"][i]) == \
            (len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])), i
        assert table["implicit_prompt"][i]
    strings = [{"chosen": "The answer is blue", "rejected": "The answer is green"},
               {"chosen": "Same start, then x", "rejected": "Same start, then y"}]
    src = write_jsonl(tmp_path / "implicit.jsonl", strings)
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chosen", "chosen", "--rejected", "rejected",
                 "--full", "--quiet", "--no-cache", "--out", str(tmp_path / "implicit")]) == 0
    table = pq.read_table(tmp_path / "implicit" / "lengths.parquet").to_pydict()
    prepared, _ = _trainer(chat_tok_dir, strings, None, None, "keep_start")
    for r in prepared:
        i = r["row"]
        assert (table["prompt_tokens"][i], table["chosen_tokens"][i], table["rejected_tokens"][i]) == \
            (len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])), i


def test_bad_rows_and_options(tmp_path, chat_tok_dir, capsys):
    rows = [{"prompt": "p", "chosen": "a", "rejected": None},
            {"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}]
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "bad"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--prompt", "prompt", "--chosen", "chosen",
                 "--rejected", "rejected", "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    assert table["pair_flag"] == ["missing", "invalid_conversation"]
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chosen", "chosen", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2
    assert "need both --chosen COL and --rejected COL" in capsys.readouterr().err
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chosen", "chosen", "--rejected", "rejected",
                 "--messages", "m", "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "leave out --messages" in capsys.readouterr().err


def _reward_prepared(tokenizer_dir, rows: list[dict], template: str | None, max_length: int | None):
    """RewardTrainer's prepared dataset (a tiny random Llama scoring model; a ``row`` column)."""
    from trl import RewardConfig, RewardTrainer

    tok = trainer_tokenizer(tokenizer_dir, template)
    return RewardTrainer(model=tiny_llama(tok, scoring=True), args=cpu_config(RewardConfig, max_length=max_length),
                         train_dataset=with_row_ids(rows), processing_class=tok).train_dataset


@pytest.mark.parametrize("conversational", [False, True])
def test_reward_pairs_equal_rewardtrainers_ids(tmp_path, chat_tok_dir, mistral_spm_dir, docs, conversational):
    """--pair-trainer reward: each side tokenized whole (the prompt prepended), EOS text on string
    sides; the pairs RewardTrainer drops over max_length (it filters, never cuts)."""
    if conversational:
        tok_dir, template = chat_tok_dir, trl_template("qwen3").read_text()
        rows = [{"prompt": [{"role": "user", "content": docs[k][:90] or "Why?"}],
                 "chosen": [{"role": "assistant", "content": docs[k + 30][:150] or "Yes."}],
                 "rejected": [{"role": "assistant", "content": docs[k + 50][:40] or "No."}]} for k in range(8)]
    else:
        tok_dir, template = mistral_spm_dir, None
        rows = [{"prompt": docs[k][:80] or "Q", "chosen": " " + (" ".join(docs[k + 30:k + 34])[:k * 60] or "yes"),
                 "rejected": " " + (docs[k + 50][:40] or "no")} for k in range(8)]
    src = write_jsonl(tmp_path / "reward.jsonl", rows)
    extra = ["--chat-template", str(tmp_path / "t.jinja")] if template else []
    if template:
        (tmp_path / "t.jinja").write_text(template)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(tok_dir), "--prompt", "prompt", "--chosen", "chosen",
                 "--rejected", "rejected", "--pair-trainer", "reward", "--pair-max-length", "60", "--full", "--quiet",
                 "--no-cache", "--out", str(out), *extra]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    every = {r["row"]: r for r in _reward_prepared(tok_dir, rows, template, None)}
    kept = {r["row"] for r in _reward_prepared(tok_dir, rows, template, 60)}
    for i in range(len(rows)):
        r = every[i]
        assert (table["chosen_tokens"][i], table["rejected_tokens"][i]) == (len(r["chosen_ids"]),
                                                                          len(r["rejected_ids"])), i
        assert table["trainer_drops"][i] == (i not in kept), i
    assert 0 < len(kept) < len(rows)
    assert json.loads((out / "report.json").read_text())["preference"]["trainer"] == "RewardTrainer"


@pytest.mark.parametrize("trainer,limit", [("dpo", "p50"), ("reward", "p50"), ("dpo", "1000"), ("reward", "1000")])
def test_tokenize_writes_the_trainers_prepared_ids(tmp_path, chat_tok_dir, docs, trainer, limit):
    """clean --tokenize writes the ids the trainer's own preparation makes (DPO: prompt_ids,
    chosen_ids, rejected_ids; reward: chosen_ids, rejected_ids, which RewardTrainer takes as
    prepared), for the kept pairs; a pair over the limit is dropped with its reason."""
    from datasets import load_from_disk

    template = trl_template("qwen3").read_text()
    (tmp_path / "t.jinja").write_text(template)
    rows = [{"prompt": [{"role": "user", "content": docs[k][:90] or "Why?"}],
             "chosen": [{"role": "assistant", "content": docs[k + 30][:40 + 30 * k] or "Yes."}],
             "rejected": [{"role": "assistant", "content": docs[k + 50][:40] or "No."}]} for k in range(6)]
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "clean"
    assert main(["clean", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(tmp_path / "t.jinja"),
                 "--prompt", "prompt", "--chosen", "chosen", "--rejected", "rejected", "--pair-trainer", trainer,
                 "--tokenize", "--limit", f"sequence_tokens<={limit}", "--quiet", "--no-cache", "--out", str(out)]) == 0
    kept = load_from_disk(str(out / "dataset"))
    rejects = load_from_disk(str(out / "rejects"))
    assert len(kept) and len(kept) + len(rejects) == len(rows) and (len(rejects) > 0) == (limit == "p50")
    if trainer == "dpo":
        prepared = {r["row"]: r for r in _trainer(chat_tok_dir, rows, template, None, "keep_start")[0]}
        names = ("prompt_ids", "chosen_ids", "rejected_ids")
    else:
        prepared = {r["row"]: r for r in _reward_prepared(chat_tok_dir, rows, template, None)}
        names = ("chosen_ids", "rejected_ids")
    kept_rows = sorted(set(range(len(rows))) - set(rejects["row"]))
    for k, i in enumerate(kept_rows):
        for name in names:
            assert kept[k][name] == prepared[i][name], (i, name)


def test_truncate_cuts_pairs_and_drops_the_ones_it_would_collapse(tmp_path, mistral_spm_dir, docs):
    """--action truncate with --tokenize: each kept pair's sequences are DPOTrainer's, cut to the
    limit as its collator cuts them (keep_start); a pair the cut would collapse, or whose prompt
    fills the limit, is dropped with that reason."""
    from datasets import load_from_disk

    rows = _string_rows(docs)
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "clean"
    assert main(["clean", str(src), "--tokenizer", str(mistral_spm_dir), "--prompt", "prompt", "--chosen", "chosen",
                 "--rejected", "rejected", "--tokenize", "--limit", "sequence_tokens<=48", "--action", "truncate",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    prepared, collator = _trainer(mistral_spm_dir, rows, None, 48, "keep_start")
    prepared = {r["row"]: r for r in prepared}
    kept, rejects = load_from_disk(str(out / "dataset")), load_from_disk(str(out / "rejects"))
    reasons = dict(zip(rejects["row"], rejects["reason"]))
    assert reasons[13].startswith("prompt_fills_limit") and reasons[14].startswith("pair_collapsed")
    assert reasons[12] == "pair_collapsed"  # equal answers: dropped whatever the limit (--keep-empty-targets keeps)
    kept_rows = [i for i in range(len(rows)) if i not in reasons]
    assert len(kept_rows) == len(kept)
    for k, i in enumerate(kept_rows):
        r = prepared[i]
        assert kept[k]["prompt_ids"] + kept[k]["chosen_ids"] == (r["prompt_ids"] + r["chosen_ids"])[:48], i
        assert kept[k]["prompt_ids"] + kept[k]["rejected_ids"] == (r["prompt_ids"] + r["rejected_ids"])[:48], i
        assert not _collapsed(collator, r), i
    for i, reason in reasons.items():
        if reason.startswith("pair_collapsed"):
            assert i not in prepared or _collapsed(collator, prepared[i]), i


def test_pairs_with_tools_and_reasoning(tmp_path, chat_tok_dir, docs):
    """Conversational pairs with each row's tools (a JSON string, as TRL parses it) and reasoning in
    the answers: the ids DPOTrainer prepares through TRL's qwen3 template."""
    from tests.support.chat import TOOLS

    template = trl_template("qwen3").read_text()
    (tmp_path / "t.jinja").write_text(template)
    rows = []
    for k in range(6):
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
        rows.append({"prompt": [{"role": "user", "content": docs[k][:80] or "Weather?"}],
                     "chosen": [call] if k % 2 else [{"role": "assistant", "content": docs[k + 40][:60] or "Sun.",
                                                      "reasoning_content": docs[k + 60][:120] or "Think."}],
                     "rejected": [{"role": "assistant", "content": docs[k + 20][:50] or "Rain."}],
                     "tools": json.dumps(TOOLS)})
    src = write_jsonl(tmp_path / "tools.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(tmp_path / "t.jinja"),
                 "--prompt", "prompt", "--chosen", "chosen", "--rejected", "rejected", "--tools", "tools", "--full",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for r in _trainer(chat_tok_dir, rows, template, None, "keep_start")[0]:
        i = r["row"]
        assert table["pair_error"][i] is None, table["pair_error"][i]
        assert (table["prompt_tokens"][i], table["chosen_tokens"][i], table["rejected_tokens"][i]) == \
            (len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])), i


def test_empty_answers_images_and_refused_options(tmp_path, chat_tok_dir, capsys):
    """A pair with an empty answer is dropped with its reason (kept with --keep-empty-targets); an
    image part is the row's unsupported_content; truncating keep_end pairs and a max prompt length
    of 0 are exit 2."""
    from datasets import load_from_disk

    user = [{"role": "user", "content": "Hi"}]
    rows = [{"prompt": user, "chosen": [{"role": "assistant", "content": "Hello there."}],
             "rejected": [{"role": "assistant", "content": "Go away."}]},
            {"prompt": user, "chosen": [], "rejected": [{"role": "assistant", "content": "No."}]},
            {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
             "chosen": [{"role": "assistant", "content": "A cat."}],
             "rejected": [{"role": "assistant", "content": "A dog."}]}]
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    base = ["--tokenizer", str(chat_tok_dir), "--chat-template", "qwen3", "--prompt", "prompt", "--chosen", "chosen",
            "--rejected", "rejected", "--quiet", "--no-cache"]
    assert main(["clean", str(src), *base, "--out", str(tmp_path / "c")]) == 0
    rejects = load_from_disk(str(tmp_path / "c" / "rejects"))
    reasons = dict(zip(rejects["row"], rejects["reason"]))
    assert reasons[1] == "empty_answer" and "unsupported_content" in reasons[2] and 0 not in reasons
    assert main(["clean", str(src), *base, "--keep-empty-targets", "--out", str(tmp_path / "k")]) == 0
    assert 1 not in load_from_disk(str(tmp_path / "k" / "rejects"))["row"]
    assert main(["clean", str(src), *base, "--tokenize", "--limit", "sequence_tokens<=10", "--action", "truncate",
                 "--truncation-mode", "keep_end", "--out", str(tmp_path / "t")]) == 2
    assert "keep_end cut gives each side its own prompt" in capsys.readouterr().err
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--prompt", "prompt", "--rl", "grpo",
                 "--max-prompt-length", "0", "--quiet", "--out", str(tmp_path / "r")]) == 2
    assert "give positive numbers" in capsys.readouterr().err


def test_a_prompt_column_left_unnamed_is_said(tmp_path, chat_tok_dir):
    """TRL's trainers take a column named ``prompt`` as the prompt: measuring the pairs without
    --prompt on such a source warns, naming the flag that measures what the trainer sees."""
    rows = [{"prompt": "Q: sky?", "chosen": "Q: sky? blue", "rejected": "Q: sky? red"}]
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.warns(UserWarning, match="pass --prompt prompt"):
        assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chosen", "chosen", "--rejected",
                     "rejected", "--quiet", "--no-cache", "--out", str(tmp_path / "o")]) == 0


def test_rows_rendered_in_chunks_while_the_last_chunk_tokenizes_measure_the_same(tmp_path, mistral_spm_dir, docs,
                                                                                 monkeypatch):
    """Rendering overlaps tokenizing (``render.overlapped``): chunks of 4 rows give the lengths one chunk gives."""
    from lengthscan.measure.preference import render

    rows = _string_rows(docs)
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    tables = []
    for chunk in (10_000, 4):
        monkeypatch.setattr(render, "OVERLAP_ROWS", chunk)
        out = tmp_path / f"out{chunk}"
        assert main(["audit", str(src), "--tokenizer", str(mistral_spm_dir), "--prompt", "prompt", "--chosen",
                     "chosen", "--rejected", "rejected", "--full", "--quiet", "--no-cache", "--out", str(out)]) == 0
        tables.append(pq.read_table(out / "lengths.parquet").to_pydict())
    assert tables[0] == tables[1] and max(tables[0]["sequence_tokens"]) > 0



def test_a_later_run_renders_pairs_without_loading_the_tokenizer(tmp_path, chat_tok_dir, docs, monkeypatch):
    """The first run remembers what rendering reads off the tokenizer (its template, special tokens,
    EOS) with the proven fast path; a later run on the same files measures every pair as the first
    did without loading the tokenizer."""
    from lengthscan.measure.text import handle

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    rows = []
    for k in range(6):
        user = {"role": "user", "content": docs[k][:80] or "Why?"}
        rows.append({"chosen": [user, {"role": "assistant", "content": docs[k + 20][:90]}],
                     "rejected": [user, {"role": "assistant", "content": docs[k + 40][:30]}]})
    rows += [{"chosen": "The answer is blue", "rejected": "The answer is green"}]  # a string pair: EOS appended
    src = write_jsonl(tmp_path / "pairs.jsonl", rows[:6])
    strings = write_jsonl(tmp_path / "strings.jsonl", rows[6:])
    argv = ["--tokenizer", str(chat_tok_dir), "--chat-template", "qwen3", "--chosen", "chosen", "--rejected",
            "rejected", "--full", "--quiet", "--no-cache"]
    for name, path in (("first", src), ("first-strings", strings)):
        assert main(["audit", str(path), *argv, "--out", str(tmp_path / name)]) == 0

    def refuse(self):
        raise AssertionError("the later run loaded the tokenizer")

    monkeypatch.setattr(handle.TokenizerHandle, "_load", refuse)
    for name, path in (("later", src), ("later-strings", strings)):
        assert main(["audit", str(path), *argv, "--out", str(tmp_path / name)]) == 0
    for first, later in (("first", "later"), ("first-strings", "later-strings")):
        tables = [pq.read_table(tmp_path / n / "lengths.parquet") for n in (first, later)]
        assert tables[0].equals(tables[1])
        reports = [json.loads((tmp_path / n / "report.json").read_text())["preference"] for n in (first, later)]
        assert reports[0] == reports[1]
