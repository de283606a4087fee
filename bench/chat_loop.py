"""The script a user would write to measure conversations: a loop of ``apply_chat_template`` with
``return_assistant_tokens_mask=True`` (the chat baseline of ``bench/chat_bench.py``).

    python bench/chat_loop.py CORPUS.jsonl TOKENIZER_DIR TEMPLATE.jinja OUT.json
"""

import json
import sys
import time

T0 = time.perf_counter()
from transformers import AutoTokenizer

src, tok_dir, template, out = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(tok_dir)
chat_template = open(template, encoding="utf-8").read()
lengths = []
with open(src, encoding="utf-8") as fh:
    for line in fh:
        enc = tok.apply_chat_template(json.loads(line)["messages"], chat_template=chat_template, tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
        lengths.append([len(enc["input_ids"]), sum(enc["assistant_masks"])])
with open(out, "w") as fh:
    json.dump(lengths, fh)
print(json.dumps({"rows": len(lengths), "seconds": time.perf_counter() - T0}))
