"""The baseline: what users write today to get token lengths (one whole process).

    python bench/naive_map.py SRC.jsonl TOKENIZER_DIR [--num-proc N]

load_dataset, AutoTokenizer, then ``Dataset.map`` with the tokenizer and ``len()`` per row, for the
input (``text``) and the target (``summary``, tokenized with ``text_target=``), and the usual
percentiles. Prints one JSON line (phase timings) for ``bench/run.py``.
"""

import argparse
import json
import os
import time

T0 = time.perf_counter()

import numpy as np
from datasets import load_dataset
from transformers import AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("tokenizer")
ap.add_argument("--num-proc", type=int, default=None)
args = ap.parse_args()

t_import = time.perf_counter()
ds = load_dataset("json", data_files=args.src, split="train")
tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
t_load = time.perf_counter()

ds = ds.map(
    lambda b: {
        "input_tokens": [len(ids) for ids in tokenizer(b["text"])["input_ids"]],
        "target_tokens": [len(ids) for ids in tokenizer(text_target=b["summary"])["input_ids"]],
    },
    batched=True,
    num_proc=args.num_proc,
)
t_map = time.perf_counter()

stats = {}
for col in ("input_tokens", "target_tokens"):
    n = np.asarray(ds[col])
    stats[col] = {f"p{q}": int(np.percentile(n, q, method="inverted_cdf")) for q in (50, 90, 99, 99.9)}
    stats[col]["max"] = int(n.max())
t_end = time.perf_counter()

print(json.dumps({"rows": len(ds), "import_s": t_import - T0, "load_s": t_load - t_import,
                  "map_s": t_map - t_load, "stats_s": t_end - t_map, "stats": stats,
                  "num_proc": args.num_proc, "pid": os.getpid()}))
