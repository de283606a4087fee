"""The same with ``datasets``: ``load_dataset("json")`` and ``Dataset.map`` of ``apply_chat_template``
(``NUM_PROC`` worker processes; 1: in process).

    python bench/chat_map.py CORPUS.jsonl TOKENIZER_DIR TEMPLATE.jinja OUT.json NUM_PROC
"""

import json
import sys
import time

T0 = time.perf_counter()
from datasets import load_dataset
from transformers import AutoTokenizer

src, tok_dir, template, out, num_proc = sys.argv[1:6]
tok = AutoTokenizer.from_pretrained(tok_dir)
chat_template = open(template, encoding="utf-8").read()


def measure(row):
    enc = tok.apply_chat_template(row["messages"], chat_template=chat_template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return {"sequence_tokens": len(enc["input_ids"]), "completion_tokens": sum(enc["assistant_masks"])}


ds = load_dataset("json", data_files=src, split="train")
ds = ds.map(measure, remove_columns=ds.column_names, num_proc=int(num_proc) if int(num_proc) > 1 else None)
with open(out, "w") as fh:
    json.dump([[a, b] for a, b in zip(ds["sequence_tokens"], ds["completion_tokens"])], fh)
print(json.dumps({"rows": len(ds), "seconds": time.perf_counter() - T0}))
