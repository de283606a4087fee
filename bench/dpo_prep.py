"""TRL's own preparation of preference pairs, as a DPO run pays it before its first step: a
``DPOTrainer`` built (a tiny random Llama: the model does not take part in the preparation) over the
corpus loaded with ``load_dataset("json")``; the prepared ``prompt_ids``, ``chosen_ids`` and
``rejected_ids`` lengths written out (the preference line of ``bench/preference_bench.py``).

    python bench/dpo_prep.py CORPUS.jsonl TOKENIZER_DIR TEMPLATE.jinja OUT.json
"""

import copy
import json
import sys
import tempfile
import time

T0 = time.perf_counter()
from datasets import load_dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import DPOConfig, DPOTrainer

src, tok_dir, template, out = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(tok_dir)
tok.chat_template = open(template, encoding="utf-8").read()
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1))
args = DPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none",
                 gradient_checkpointing=False, max_length=None)
data = load_dataset("json", data_files=src, split="train")
prepared = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                      processing_class=tok).train_dataset
lengths = [[len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])]
           for r in prepared.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])]
with open(out, "w") as fh:
    json.dump(lengths, fh)
print(json.dumps({"rows": len(lengths), "seconds": time.perf_counter() - T0}))
