"""KTO's unpaired rows (prompt, completion, label) are TRL's prompt-completion form: lengthscan's
``--prompt --completion`` audit gives, per row, the lengths of the ``prompt_ids`` and
``completion_ids`` TRL's own KTOTrainer prepares (built on CPU with a tiny random Llama), for
conversations through TRL's qwen3 template and for strings (the EOS text on the completion)."""

from __future__ import annotations

import copy

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import trl_template, write_jsonl
from tests.support.trainers import cpu_config, tiny_llama, trainer_tokenizer, with_row_ids

pytest.importorskip("trl")
pytest.importorskip("torch")


def _kto_prepared(tokenizer_dir, rows: list[dict], template: str | None):
    from trl import KTOConfig, KTOTrainer

    tok = trainer_tokenizer(tokenizer_dir, template)
    model = tiny_llama(tok)
    args = cpu_config(KTOConfig, max_length=None, per_device_train_batch_size=2)
    return KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=with_row_ids(rows),
                      processing_class=tok).train_dataset


@pytest.mark.parametrize("conversational", [True, False])
def test_kto_rows_equal_ktotrainers_ids(tmp_path, chat_tok_dir, mistral_spm_dir, docs, conversational):
    if conversational:
        tok_dir, template = chat_tok_dir, trl_template("qwen3").read_text()
        rows = [{"prompt": [{"role": "user", "content": docs[k][:100] or "Why?"}],
                 "completion": [{"role": "assistant", "content": docs[k + 20][:120] or "Because."}],
                 "label": k % 3 != 0} for k in range(10)]
    else:
        tok_dir, template = mistral_spm_dir, None
        rows = [{"prompt": docs[k][:100] or "Q", "completion": " " + (docs[k + 20][:120] or "A"), "label": k % 2 == 0}
                for k in range(10)]
    src = write_jsonl(tmp_path / "kto.jsonl", rows)
    extra = []
    if template:
        (tmp_path / "t.jinja").write_text(template)
        extra = ["--chat-template", str(tmp_path / "t.jinja")]
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(tok_dir), "--prompt", "prompt", "--completion", "completion",
                 "--train-on", "assistant", "--full", "--quiet", "--no-cache", "--out", str(out), *extra]) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    for r in _kto_prepared(tok_dir, rows, template):
        i = r["row"]
        assert (table["prompt_tokens"][i], table["completion_tokens"][i]) == \
            (len(r["prompt_ids"]), len(r["completion_ids"])), i
