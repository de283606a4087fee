"""The limit: ``tokenizers.Tokenizer.encode_batch_fast`` over the same texts (one whole process).

    python bench/raw_encode.py SRC.jsonl TOKENIZER_DIR

Reads the texts into Python lists first (``read_s``), then times only the tokenization
(``tokenize_s``): the backend's own threads over the whole list, no Arrow, no offsets, no per-row
Python beyond ``len()``. Special tokens are added as ``__call__`` adds them, so the counts are the
ones lengthscan reports. Prints one JSON line for ``bench/run.py``.
"""

import json
import sys
import time

T0 = time.perf_counter()

from tokenizers import Tokenizer

src, tok_dir = sys.argv[1], sys.argv[2]
t_import = time.perf_counter()
inputs, targets = [], []
with open(src, encoding="utf-8") as fh:
    for line in fh:
        row = json.loads(line)
        inputs.append(row["text"])
        targets.append(row["summary"])
tokenizer = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
t_read = time.perf_counter()

input_tokens = [len(e) for e in tokenizer.encode_batch_fast(inputs)]
target_tokens = [len(e) for e in tokenizer.encode_batch_fast(targets)]
t_tok = time.perf_counter()

print(json.dumps({"rows": len(inputs), "import_s": t_import - T0, "read_s": t_read - t_import,
                  "tokenize_s": t_tok - t_read, "tokens": sum(input_tokens) + sum(target_tokens)}))
