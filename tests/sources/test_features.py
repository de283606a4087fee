"""Features read and written without ``datasets`` equal what ``datasets`` itself reads and writes."""

import json

import datasets
import pyarrow as pa
import pytest
from datasets import Audio, ClassLabel, Features, Value

from lengthscan.sources import features as feats
from lengthscan.write.arrow_dataset import DatasetWriter

PLAIN = [
    pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.bool_(), pa.null(),
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float16(), pa.float32(), pa.float64(), pa.date32(), pa.date64(),
    pa.timestamp("s"), pa.timestamp("us", "UTC"), pa.timestamp("ns", "Europe/Paris"),
    pa.list_(pa.int32()), pa.list_(pa.string(), 3), pa.large_list(pa.float64()),
    pa.list_(pa.list_(pa.int64())),
    pa.struct([("a", pa.string()), ("b", pa.list_(pa.struct([("c", pa.int8())])))]),
]


@pytest.mark.parametrize("kind", PLAIN, ids=str)
def test_plain_types_match_datasets(kind):
    schema = pa.schema([("x", kind), ("text", pa.string())])
    ours = feats.from_schema(schema)
    assert ours == Features.from_arrow_schema(schema).to_dict()
    assert feats.arrow_schema(ours).remove_metadata() == Features.from_dict(ours).arrow_schema.remove_metadata()


def test_stored_features_win_and_rich_ones_are_left_to_datasets():
    stored = Features({"label": ClassLabel(names=["a", "b"]), "text": Value("string")})
    with pytest.raises(feats.NotPlain):
        feats.from_schema(stored.arrow_schema)
    audio = Features({"audio": Audio(decode=False)})
    with pytest.raises(feats.NotPlain):
        feats.from_schema(audio.arrow_schema)
    assert not feats.is_plain(audio.to_dict())
    # a stored plain feature whose type still matches is kept as stored (here: a fixed-length list)
    fixed = Features({"v": datasets.List(Value("int16"), length=2)})
    assert feats.from_schema(fixed.arrow_schema) == fixed.to_dict()
    for kind in (pa.dictionary(pa.int8(), pa.string()), pa.decimal128(5, 2), pa.duration("s")):
        with pytest.raises(feats.NotPlain):
            feats.from_arrow_type(kind)


def _write(path, features, table, *, plain=True):
    w = DatasetWriter(path, features)
    assert (w._schema is not None) == plain
    for start in range(0, table.num_rows, 1700):
        w.write(table.slice(start, 1700))
    w.write(table.slice(0, 0))
    w.close("f1")
    return datasets.load_from_disk(str(path))


def test_plain_writer_equals_datasets_writer(tmp_path):
    table = pa.table({
        "text": [f"row {i} " * (i % 7) for i in range(2500)],
        "ids": [list(range(i % 5)) for i in range(2500)],
        "score": [i / 3 if i % 11 else None for i in range(2500)],
        "meta": [{"lang": "en", "n": i} for i in range(2500)],
    })
    features = feats.from_schema(table.schema)
    ours = _write(tmp_path / "ours", features, table)
    # the same through datasets' own writer (forced by a non-plain feature dict object)
    theirs = datasets.Dataset.from_dict(table.to_pydict(), features=Features.from_dict(features))
    theirs.save_to_disk(str(tmp_path / "theirs"))
    theirs = datasets.load_from_disk(str(tmp_path / "theirs"))
    assert ours.features == theirs.features
    assert ours.to_dict() == theirs.to_dict()
    assert ours.data.table.schema.metadata == theirs.data.table.schema.metadata
    assert max(b.num_rows for b in ours.data.table.to_batches()) == DatasetWriter.BATCH_ROWS
    info = json.loads((tmp_path / "ours" / "dataset_info.json").read_text())
    assert datasets.DatasetInfo.from_dict(info).features == theirs.features


def test_empty_and_rich_writers_load(tmp_path):
    empty = _write(tmp_path / "empty", {"text": feats.value("string")}, pa.table({"text": pa.array([], pa.string())}))
    assert len(empty) == 0 and empty.features == Features({"text": Value("string")})
    rich = Features({"label": ClassLabel(names=["neg", "pos"]), "text": Value("string")})
    table = pa.table({"label": pa.array([0, 1, 1], pa.int64()), "text": ["a", "b", "c"]})
    loaded = _write(tmp_path / "rich", rich.to_dict(), table, plain=False)
    assert loaded.features == rich and loaded["label"] == [0, 1, 1]
