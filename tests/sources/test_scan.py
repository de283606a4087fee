"""Reading rows: sampled Parquet reads across many row groups, the read-ahead thread, and the
console script's process, which leaves torch unimported for audit and clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.measure.cache import cache_root
from lengthscan.sources.opener import open_source
from lengthscan.sources.scan import iter_batches, read_ahead


@pytest.fixture()
def small_groups(tmp_path, corpus_rows):
    rows = corpus_rows[:1500]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    return path, rows


@pytest.mark.parametrize("batch_rows", [1, 50, 4096])
def test_sampled_parquet_rows_equal_the_full_read(small_groups, batch_rows):
    path, rows = small_groups
    split = open_source(str(path)).splits[0]
    rng = np.random.default_rng(3)
    for size in (0, 1, 37, 400, len(rows)):
        indices = np.sort(rng.choice(len(rows), size, replace=False)).astype(np.int64)
        got_rows, got_text = [], []
        for batch in iter_batches(split, ["text"], indices=indices, batch_rows=batch_rows):
            assert batch.rows.size == batch.table.num_rows <= batch_rows
            got_rows += batch.rows.tolist()
            got_text += batch.table.column("text").to_pylist()
        assert got_rows == indices.tolist()
        assert got_text == [rows[i]["text"] for i in indices]


def test_read_ahead_keeps_order_raises_and_stops():
    assert list(read_ahead(lambda x: x * x, range(100), depth=3)) == [x * x for x in range(100)]

    def bad(x):
        if x == 5:
            raise ValueError("row 5 is bad")
        return x

    seen = []
    with pytest.raises(ValueError, match="row 5 is bad"):
        for v in read_ahead(bad, range(10)):
            seen.append(v)
    assert seen == [0, 1, 2, 3, 4]
    before = threading.active_count()
    gen = read_ahead(lambda x: x, range(10_000), depth=2)
    assert next(gen) == 0
    gen.close()  # the consumer stops early: the producer thread ends too
    assert threading.active_count() <= before


@pytest.mark.slow  # four audits, each in a fresh interpreter
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_console_script_audits_without_importing_torch(tmp_path, corpus_jsonl, corpus_rows, bpe_dir, fmt):
    pytest.importorskip("torch", reason="torch is not installed: nothing to hide")
    src = corpus_jsonl
    if fmt == "csv":  # read through datasets' csv builder, whose pickling probes for torch
        import pandas as pd

        src = tmp_path / "c.csv"
        pd.DataFrame(corpus_rows[:300]).to_csv(src, index=False)
    code = ("import sys; from lengthscan.cli.main import run; rc = run(); "
            "print(json.dumps({'rc': rc, 'torch': sys.modules.get('torch') is not None}))")
    argv = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
            "--sample", "200", "--out", str(tmp_path / "a"), "--quiet"]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "LENGTHSCAN_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", "import json; " + code, *argv],
                          capture_output=True, text=True, env=env, timeout=300)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"rc": 0, "torch": False}, proc.stderr[-2000:]
    # a later run (the engine proven, counting from the first row): rows recounted by transformers in the command
    proc = subprocess.run([sys.executable, "-c", "import json; " + code, *argv, "--overwrite", "--verify-counts", "20"],
                          capture_output=True, text=True, timeout=300, env={**env, "LENGTHSCAN_IMPORT_TORCH": "1"})
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"rc": 0, "torch": True}, proc.stderr[-2000:]


@pytest.mark.slow  # five audits, each in a fresh interpreter
def test_audits_of_jsonl_and_parquet_never_import_pandas(tmp_path, corpus_jsonl, corpus_rows, bpe_dir):
    """pyarrow's pa.array and to_numpy import pandas on first use (0.2 s or more a run): the audit
    builds its arrays from buffers instead (lengthscan/sources/arrays.py)."""
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(corpus_rows[:2000]), parquet, row_group_size=300)
    code = ("import json, sys; from lengthscan.cli.main import run; rc = run(); "
            "print(json.dumps({'rc': rc, 'pandas': 'pandas' in sys.modules}))")
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "LENGTHSCAN_CACHE": str(tmp_path / "cache")}
    runs = [(corpus_jsonl, "--full"), (corpus_jsonl, "--full"),  # cold, then from the length cache
            (corpus_jsonl, "--sample"), (parquet, "--sample"), (parquet, "--full")]
    for k, (src, how) in enumerate(runs):
        argv = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
                *([how, "500"] if how == "--sample" else [how]), "--out", str(tmp_path / f"a{k}"), "--quiet"]
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out == {"rc": 0, "pandas": False}, (src, how, proc.stderr[-2000:])
    assert any((tmp_path / "cache" / "lengths").iterdir())


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 65, 1000])
def test_arrays_from_buffers_equal_pa_array(n):
    from lengthscan.sources import arrays

    rng = np.random.default_rng(n)
    ints = rng.integers(-3, 1 << 40, n)
    mask = rng.random(n) < 0.3
    assert arrays.numeric(ints, pa.int64(), mask=mask).equals(pa.array(ints, pa.int64(), mask=mask))
    assert arrays.numeric(ints, pa.int64()).equals(pa.array(ints, pa.int64()))
    small = (ints % 100).astype(np.int8)
    assert arrays.numeric(small, pa.int8()).equals(pa.array(small, pa.int8()))
    floats = np.where(mask, np.nan, rng.random(n) * 30)
    assert arrays.numeric(floats, pa.float64(), mask=~(floats >= 0)).equals(
        pa.array(floats, pa.float64(), mask=~(floats >= 0)))
    texts = [None if m else "".join(rng.choice(list("aé€𝄞 \n"), int(rng.integers(0, 6)))) for m in mask]
    assert arrays.strings(texts).equals(pa.array(texts, pa.string()))
    assert arrays.strings(np.array(texts, dtype=object)).equals(pa.array(texts, pa.string()))
    assert arrays.strings([None] * n).equals(pa.array([None] * n, pa.string()))
    whole = pa.array(ints, pa.int64())
    for start in (0, n // 3):
        piece = whole.slice(start, n // 2)
        assert arrays.to_numpy(piece).tolist() == piece.to_pylist()


def test_sampled_rows_of_a_huge_row_group_are_streamed(tmp_path, corpus_rows, monkeypatch):
    import lengthscan.sources.formats.parquet as scan

    rows = corpus_rows[:900]
    path = tmp_path / "one_group.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=len(rows))
    monkeypatch.setattr(scan, "LARGE_ROW_GROUP", 64)  # 900 rows in one group: 15 streamed pieces
    split = open_source(str(path)).splits[0]
    indices = np.array([0, 5, 63, 64, 65, 300, 301, 899], dtype=np.int64)
    batches = list(iter_batches(split, ["text", "summary"], indices=indices, batch_rows=3))
    assert np.concatenate([b.rows for b in batches]).tolist() == indices.tolist()
    assert [t for b in batches for t in b.table.column("summary").to_pylist()] == [rows[i]["summary"] for i in indices]


def test_jsonl_row_counts_are_remembered_until_the_file_changes(tmp_path, corpus_rows):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus_rows[:50]))
    first = open_source(str(path)).splits[0]
    assert first.num_rows == 50
    assert list(cache_root().rglob("*-jsonl-pyarrow*.json")), "no row-count manifest written"
    again = open_source(str(path)).splits[0]
    assert again.num_rows == 50 and again.parts[0].jsonl_schema == first.parts[0].jsonl_schema
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in corpus_rows[50:80]))
    changed = open_source(str(path)).splits[0]
    assert changed.num_rows == 80
    assert [b.rows.size for b in iter_batches(changed, ["text"])] == [80]


@pytest.mark.slow
def test_clean_after_an_audit_does_not_load_the_tokenizer(tmp_path, corpus_jsonl, bpe_dir):
    """Everything a clean needs from the tokenizer (lengths, the special tokens' count) is cached."""
    code = ("import sys, json; from lengthscan.cli.main import run; rc = run(); "
            "print(json.dumps({'rc': rc, 'transformers': 'transformers' in sys.modules}))")
    fields = ["--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary"]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    runs = [["audit", str(corpus_jsonl), *fields, "--full", "--out", str(tmp_path / "a"), "--quiet"],
            ["clean", str(corpus_jsonl), *fields, "--limit", "input_tokens<=64", "--limit", "target_tokens<=16",
             "--out", str(tmp_path / "c"), "--quiet"]]
    seen = []
    for argv in runs:
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                              timeout=300)
        seen.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    # the audit (a first run) proves the fast path in a prover process: neither command imports transformers
    assert seen == [{"rc": 0, "transformers": False}, {"rc": 0, "transformers": False}]
