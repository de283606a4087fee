"""RL prompts against TRL's own GRPOTrainer, built on CPU with a tiny random Llama: per row, the
length of the ids its ``_tokenize_prompts`` makes (conversations through TRL's qwen3 template with
the generation prompt, strings through the tokenizer's call), and the budgets lengthscan adds to
them from GRPOConfig's ``max_completion_length`` and ``num_generations``."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl
from tests.support.trainers import cpu_config, tiny_llama, trainer_tokenizer, with_row_ids

pytest.importorskip("trl")
pytest.importorskip("torch")


def _tokenized(tokenizer_dir, template: str, prompts: list) -> list[int]:
    from trl import GRPOConfig, GRPOTrainer

    tok = trainer_tokenizer(tokenizer_dir, template)
    args = cpu_config(GRPOConfig, per_device_train_batch_size=2, num_generations=2, max_completion_length=8)
    trainer = GRPOTrainer(model=tiny_llama(tok), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=with_row_ids([{"prompt": "x"}, {"prompt": "y"}]),
                          processing_class=tok)
    out = []
    for prompt in prompts:  # one at a time: a batch is all conversations or all strings
        ids, _, _ = trainer._tokenize_prompts([prompt])
        out.append(len(ids[0]))
    return out


@pytest.mark.parametrize("chunk", [None, 3], ids=["one-chunk", "rendered-while-tokenizing"])
def test_grpo_prompts_equal_grpotrainers_ids(tmp_path, chat_tok_dir, docs, chunk, monkeypatch):
    if chunk:  # rows rendered 3 at a time while the chunk before is tokenized (render.overlapped)
        from lengthscan.measure.preference import render

        monkeypatch.setattr(render, "OVERLAP_ROWS", chunk)
    template = trl_template("qwen3").read_text()
    prompts = [[{"role": "user", "content": docs[k][:150] or "Why?"}] for k in range(6)]
    prompts += [[{"role": "system", "content": "Think step by step."}, {"role": "user", "content": docs[9][:60]}]]
    prompts += [docs[k][:120] or "plain" for k in range(10, 14)]  # string prompts
    rows = [{"prompt": p} for p in prompts]
    src = write_jsonl(tmp_path / "rl.jsonl", rows)
    path = tmp_path / "qwen3.jinja"
    path.write_text(template)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--chat-template", str(path), "--prompt",
                 "prompt", "--rl", "grpo", "--max-completion-length", "300", "--num-generations", "4", "--full",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    expected = _tokenized(chat_tok_dir, template, prompts)
    assert table["prompt_tokens"] == expected
    assert table["sequence_tokens"] == [n + 300 for n in expected]
    assert table["group_tokens"] == [4 * (n + 300) for n in expected]
    report = json.loads((out / "report.json").read_text())
    assert report["preference"]["trainer"] == "GRPOTrainer" and report["preference"]["max_prompt_length"] is None
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--rl", "grpo", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2


def test_a_max_prompt_length_cuts_from_the_left(tmp_path, chat_tok_dir, docs):
    """--max-prompt-length (earlier TRL releases, the experimental trainers): the budgets count the
    prompt's last N tokens; the finding counts the prompts cut, exactly, from the lengths."""
    from lengthscan.report.findings import findings

    rows = [{"prompt": docs[k][:40 * (k + 1)] or "plain"} for k in range(8)]
    src = write_jsonl(tmp_path / "rl.jsonl", rows)
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(chat_tok_dir), "--prompt", "prompt", "--rl", "grpo",
                 "--max-completion-length", "100", "--max-prompt-length", "20", "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    assert table["sequence_tokens"] == [min(n, 20) + 100 for n in table["prompt_tokens"]]
    over = sum(n > 20 for n in table["prompt_tokens"])
    assert 0 < over < len(rows)
    said = findings(json.loads((out / "report.json").read_text()))
    assert any(f.startswith(f"{over:,} of {len(rows)} prompts") and "cut from the left" in f for f in said)
