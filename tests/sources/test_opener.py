"""Every source kind opens with a defined row order; scans stream exactly the source's rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.sources.opener import load_source, open_source
from lengthscan.sources.scan import iter_batches
from lengthscan.sources.source import SourceError


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [{"text": f"row {i} " + "word " * (i % 7), "summary": f"s{i}"} for i in range(50)]


def _texts(split, column="text", indices=None):
    return [t for b in iter_batches(split, [column], indices=indices, batch_rows=7)
            for t in b.table.column(column).to_pylist()]


def test_jsonl_single_file(tmp_path):
    src = open_source(_write_jsonl(tmp_path / "a.jsonl", ROWS))
    (split,) = src.splits
    assert split.num_rows == 50 and not src.has_splits and not split.multi_file
    assert _texts(split) == [r["text"] for r in ROWS]


def test_glob_is_read_in_sorted_path_order_with_file_rows(tmp_path):
    # written out of order; names sort as part-0, part-1, part-2
    _write_jsonl(tmp_path / "part-2.jsonl", ROWS[30:])
    _write_jsonl(tmp_path / "part-0.jsonl", ROWS[:10])
    _write_jsonl(tmp_path / "part-1.jsonl", ROWS[10:30])
    src = open_source(str(tmp_path / "part-*.jsonl"))
    (split,) = src.splits
    assert split.multi_file
    assert _texts(split) == [r["text"] for r in ROWS]
    files, file_rows = split.locate(np.asarray([0, 9, 10, 29, 30, 49]))
    assert [f.rsplit("/", 1)[1] for f in files] == ["part-0.jsonl", "part-0.jsonl", "part-1.jsonl",
                                                   "part-1.jsonl", "part-2.jsonl", "part-2.jsonl"]
    assert file_rows.tolist() == [0, 9, 0, 19, 0, 19]
    # a directory of data files is the same source
    assert _texts(open_source(str(tmp_path)).splits[0]) == [r["text"] for r in ROWS]


def test_sampled_reads_take_exactly_those_rows(tmp_path):
    _write_jsonl(tmp_path / "p0.jsonl", ROWS[:25])
    _write_jsonl(tmp_path / "p1.jsonl", ROWS[25:])
    (split,) = open_source(str(tmp_path / "*.jsonl")).splits
    idx = np.asarray([0, 3, 24, 25, 26, 49])
    batches = list(iter_batches(split, ["text"], indices=idx, batch_rows=4))
    assert np.concatenate([b.rows for b in batches]).tolist() == idx.tolist()
    assert _texts(split, indices=idx) == [ROWS[i]["text"] for i in idx]


def test_csv_tsv_parquet_json(tmp_path):
    import csv

    with open(tmp_path / "d.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, ["text", "summary"])
        w.writeheader()
        w.writerows(ROWS)
        w.writerow({"text": "NA", "summary": ""})
    with open(tmp_path / "d.tsv", "w", newline="") as fh:
        w = csv.DictWriter(fh, ["text", "summary"], delimiter="\t")
        w.writeheader()
        w.writerows(ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    csv_split = open_source(tmp_path / "d.csv").splits[0]
    texts = _texts(csv_split)
    assert texts[:50] == [r["text"] for r in ROWS]
    assert texts[50] == "NA"  # kept as text, not turned into a missing value
    assert _texts(csv_split, "summary")[50] is None  # an empty cell is missing
    for name in ("d.tsv", "d.parquet", "d.json"):
        assert _texts(open_source(tmp_path / name).splits[0]) == [r["text"] for r in ROWS], name


def test_save_to_disk_dict_all_splits_or_one(tmp_path):
    from datasets import Dataset, DatasetDict

    dd = DatasetDict({"train": Dataset.from_list(ROWS[:40]), "validation": Dataset.from_list(ROWS[40:])})
    dd.save_to_disk(str(tmp_path / "dd"))
    src = open_source(str(tmp_path / "dd"))
    assert src.has_splits and [s.name for s in src.splits] == ["train", "validation"]
    assert _texts(src.splits[1]) == [r["text"] for r in ROWS[40:]]
    one = open_source(str(tmp_path / "dd"), split="validation")
    assert [s.name for s in one.splits] == ["validation"] and one.has_splits
    with pytest.raises(SourceError, match="no split 'test'; splits are train, validation"):
        open_source(str(tmp_path / "dd"), split="test")
    assert isinstance(load_source(str(tmp_path / "dd")), DatasetDict)


def test_in_memory_and_transformed_datasets(tmp_path):
    from datasets import Dataset

    ds = Dataset.from_list(ROWS)
    assert _texts(open_source(ds).splits[0]) == [r["text"] for r in ROWS]
    ds.save_to_disk(str(tmp_path / "one"))
    from datasets import load_from_disk

    shuffled = load_from_disk(str(tmp_path / "one")).shuffle(seed=3)  # an indices mapping on top
    assert _texts(open_source(shuffled).splits[0]) == shuffled["text"]
    renamed = load_from_disk(str(tmp_path / "one")).rename_column("text", "body")
    assert _texts(open_source(renamed).splits[0], "body") == [r["text"] for r in ROWS]


def test_full_scan_reads_arrow_files_without_memory_map(tmp_path, monkeypatch):
    from datasets import Dataset, load_from_disk

    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    ds = load_from_disk(str(tmp_path / "one"))
    from lengthscan.sources import scan

    assert scan.plain_arrow_files(ds) == [c["filename"] for c in ds.cache_files]
    opened = []
    real = pa.OSFile
    monkeypatch.setattr(pa, "OSFile", lambda p, m: opened.append(p) or real(p, m))  # the readers' pyarrow
    assert _texts(open_source(ds).splits[0]) == [r["text"] for r in ROWS]
    assert opened == [c["filename"] for c in ds.cache_files]


@pytest.mark.parametrize("spec, message", [
    ("missing.jsonl", "no such file"),
    ("./nope/", "no such file"),
    ("nothing-*.jsonl", "matches no file"),
])
def test_missing_sources_name_themselves(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match=message):
        open_source(spec)


def test_unknown_and_broken_files(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(SourceError, match="unknown file type"):
        open_source(tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(SourceError, match="bad.jsonl"):
        open_source(tmp_path / "bad.jsonl")


def test_hub_id_is_tried_and_fails_clearly_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SourceError, match="hub dataset"):
        open_source("lengthscan-test/surely-not-a-dataset")


def test_jsonl_and_parquet_are_read_without_datasets(tmp_path):
    """Streaming readers: auditing JSON Lines or Parquet never imports datasets (nor converts)."""
    import subprocess
    import sys

    _write_jsonl(tmp_path / "a.jsonl", ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    (tmp_path / "arr.json").write_text(json.dumps(ROWS))  # a JSON array: datasets reads it
    code = ("import sys; from lengthscan.sources.opener import open_source\n"
            "from lengthscan.sources.scan import iter_batches\n"
            "for name in ('a.jsonl', 'a.parquet'):\n"
            "    s = open_source(sys.argv[1] + '/' + name).splits[0]\n"
            "    n = sum(b.rows.size for b in iter_batches(s, ['text']))\n"
            "    assert n == 50, n\n"
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    arr = open_source(tmp_path / "arr.json").splits[0]
    assert arr.parts[0].jsonl_schema is None and _texts(arr) == [r["text"] for r in ROWS]
