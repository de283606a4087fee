"""``clean --format parquet`` on the local engine: the Arrow layout's rows, columns and features, as
Parquet shards that ``datasets.load_dataset("parquet", data_dir=...)`` loads."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from datasets import (
    ClassLabel,
    Dataset,
    DatasetDict,
    Features,
    Value,
    load_dataset,
    load_from_disk,
)

import lengthscan
from lengthscan.cli.main import main
from lengthscan.write.parquet import ParquetDatasetWriter


def _parquet(path, splits: bool):
    loaded = load_dataset("parquet", data_dir=str(path))
    return loaded if splits else loaded["train"]


def _report(out) -> dict:
    data = json.loads((out / "report.json").read_text())
    for key in ("created", "seconds", "command"):
        data.pop(key)
    data["clean"].pop("out_dir")
    return data


def test_parquet_holds_the_arrow_layouts_rows(tmp_path, corpus_jsonl, bpe_dir):
    kw = dict(tokenizer=str(bpe_dir), input="text", target="summary", action="truncate", tokenize=True,
              limits=["input_tokens<=96", "target_tokens<=12"], cache=False)
    lengthscan.clean(str(corpus_jsonl), out=tmp_path / "arrow", **kw)
    lengthscan.clean(str(corpus_jsonl), out=tmp_path / "parquet", format="parquet", **kw)
    for sub in ("dataset", "rejects"):
        want, got = load_from_disk(str(tmp_path / "arrow" / sub)), _parquet(tmp_path / "parquet" / sub, False)
        assert got.features == want.features  # input_ids/labels lists of int32, attention_mask of int8
        assert got.to_list() == want.to_list()
        assert sorted(p.name for p in (tmp_path / "parquet" / sub).iterdir()) == ["data-00000-of-00001.parquet"]
    assert len(want) and pq.read_table(tmp_path / "parquet" / "lengths.parquet").equals(
        pq.read_table(tmp_path / "arrow" / "lengths.parquet"))
    assert _report(tmp_path / "parquet") == _report(tmp_path / "arrow")


def test_parquet_splits_and_an_empty_rejects_split(tmp_path, corpus_rows, bpe_dir):
    source = tmp_path / "dd"
    DatasetDict({"train": Dataset.from_list(corpus_rows[100:900]),
                 "test": Dataset.from_list(corpus_rows[1000:1200])}).save_to_disk(str(source))
    assert main(["clean", str(source), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=100000", "--format", "parquet", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    dataset = _parquet(tmp_path / "out" / "dataset", True)
    assert sorted(dataset) == ["test", "train"] and len(dataset["test"]) == 200
    assert dataset["train"]["text"] == [r["text"] for r in corpus_rows[100:900] if r["text"] is not None]
    for split in ("train", "test"):  # nothing rejected: a file with the schema alone
        (empty,) = (tmp_path / "out" / "rejects" / split).iterdir()
        table = pq.read_table(empty)
        assert empty.name == "data-00000-of-00001.parquet" and table.num_rows == 0
        assert table.column_names == ["text", "summary", "row", "reason", "reasons"]
        assert b"huggingface" in table.schema.metadata


def test_rich_features_go_through_datasets(tmp_path):
    features = Features({"label": ClassLabel(names=["neg", "pos"]), "text": Value("string")})
    writer = ParquetDatasetWriter(tmp_path / "split", features)
    writer.write(Dataset.from_dict({"label": [1, 0], "text": ["a", "b"]}, features=features).data.table)
    writer.close("unused")
    assert writer.rows == 2
    got = load_dataset("parquet", data_dir=str(tmp_path / "split"), split="train")
    assert got.features == features and got["label"] == [1, 0]


def test_unknown_format_is_refused(tmp_path, corpus_jsonl, bpe_dir):
    from lengthscan.write.staging import OutputError

    with pytest.raises(OutputError, match="parquet"):
        lengthscan.clean(str(corpus_jsonl), out=tmp_path / "out", tokenizer=str(bpe_dir), input="text",
                         limits=["input_tokens<=10"], format="csv")
    assert not (tmp_path / "out").exists()
