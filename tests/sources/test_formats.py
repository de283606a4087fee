"""Source formats as objects (``sources.formats``): each part read by its format's reader, and a
split cut into read tasks (the Ray engine's unit of work) whose reads, put end to end, are the
split's full read, row for row, also for a sample; on real Parquet, JSON Lines, CSV, JSON array,
Arrow and ``save_to_disk`` sources."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.sources.formats import READERS, read_part, read_tasks, reader_for
from lengthscan.sources.opener import open_source
from lengthscan.sources.scan import iter_batches


def _sources(folder, rows) -> dict:
    """name -> source spec of the same rows in several formats."""
    cuts = [0, 300, 1100, len(rows)]
    (folder / "pq").mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(rows[cuts[i]:cuts[i + 1]]), folder / "pq" / f"part-{i}.parquet",
                       row_group_size=64)
    pq.write_table(pa.Table.from_pylist(rows), folder / "one-group.parquet", row_group_size=len(rows))
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rows.json").write_text(json.dumps(rows))
    pa.csv.write_csv(pa.Table.from_pylist(rows), folder / "rows.csv")
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(folder / "disk"))
    return {"parquet-shards": str(folder / "pq" / "*.parquet"), "one-row-group": str(folder / "one-group.parquet"),
            "jsonl": str(folder / "rows.jsonl"), "json-array": str(folder / "rows.json"),
            "csv": str(folder / "rows.csv"), "save_to_disk": str(folder / "disk")}


@pytest.fixture(scope="module")
def sources(tmp_path_factory, corpus_rows):
    import pyarrow.csv  # noqa: F401 (pa.csv)

    return _sources(tmp_path_factory.mktemp("formats"), corpus_rows[:1500])


@pytest.mark.parametrize("name", ["parquet-shards", "one-row-group", "jsonl", "json-array", "csv", "save_to_disk"])
def test_read_tasks_end_to_end_are_the_full_read(sources, name):
    split = open_source(sources[name]).splits[0]
    columns = ["text", "summary"]
    whole = [(b.rows.tolist(), b.table.to_pylist()) for b in iter_batches(split, columns, batch_rows=100)]
    want_rows = [r for rows, _ in whole for r in rows]
    want = [t for _, table in whole for t in table]
    assert want_rows == list(range(split.num_rows)) and len(want) == 1500
    rng = np.random.default_rng(5)
    sample = np.sort(rng.choice(split.num_rows, 211, replace=False)).astype(np.int64)
    for pieces in (1, 3, 10):
        tasks = read_tasks(split, pieces, 100)
        assert tasks and all(t.rows >= 1 for t in tasks)
        spans = [(split.parts[t.part].start + t.lo, split.parts[t.part].start + t.hi) for t in tasks]
        assert spans[0][0] == 0 and spans[-1][1] == split.num_rows
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, in row order
        got_rows, got = [], []
        for t in tasks:
            for b in read_part(split.name, split.parts[t.part], columns, batch_rows=100, span=(t.lo, t.hi)):
                assert b.rows.size == b.table.num_rows <= 100
                got_rows += b.rows.tolist()
                got += b.table.to_pylist()
        assert got_rows == want_rows and got == want, (name, pieces)
        sampled_rows, sampled = [], []
        for t in tasks:
            for b in read_part(split.name, split.parts[t.part], columns, indices=sample, batch_rows=100,
                               span=(t.lo, t.hi)):
                sampled_rows += b.rows.tolist()
                sampled += b.table.to_pylist()
        assert sampled_rows == sample.tolist() and sampled == [want[i] for i in sample]


def test_each_part_has_one_reader_and_parquet_tasks_keep_row_groups_whole(sources):
    names = {name: {reader_for(p).name for s in open_source(spec).splits for p in s.parts}
             for name, spec in sources.items()}
    assert names == {"parquet-shards": {"parquet"}, "one-row-group": {"parquet"}, "jsonl": {"jsonl"},
                     "json-array": {"dataset"}, "csv": {"dataset"}, "save_to_disk": {"dataset"}}
    assert [r.name for r in READERS] == ["parquet", "jsonl", "csv", "dataset"]
    split = open_source(sources["parquet-shards"]).splits[0]
    for t in read_tasks(split, 6, 100):
        part = split.parts[t.part]
        bounds = np.concatenate([[0], np.cumsum(part.groups)]).tolist()
        assert t.lo in bounds and t.hi in bounds  # whole row groups
    one = open_source(sources["one-row-group"]).splits[0]
    assert len(read_tasks(one, 6, 100)) == 6  # one huge row group: cut in row spans


def test_a_task_of_a_stream_file_stops_after_its_span(tmp_path, corpus_rows, monkeypatch):
    """A JSON Lines task reads its file up to its span's end, not to the end of the file."""
    import pyarrow.json as pj

    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus_rows * 20))
    split = open_source(str(path)).splits[0]
    part = split.parts[0]
    read = []
    real = pj.open_json

    def counting(*args, **kwargs):
        for rb in real(*args, **kwargs):
            read.append(rb.num_rows)
            yield rb

    monkeypatch.setattr(pj, "open_json", counting)
    assert sum(b.rows.size for b in read_part(split.name, part, ["text"], batch_rows=50)) == part.rows
    assert sum(read) == part.rows and len(read) > 2  # the whole file: several blocks
    read.clear()
    rows = [r for b in read_part(split.name, part, ["text"], batch_rows=50, span=(0, 10)) for r in b.rows.tolist()]
    assert rows == list(range(10))
    assert 10 <= sum(read) < part.rows // 2


class TextLines:
    """A format the package does not have: one row a line of a text file, column ``text``."""

    name = "text-lines"

    def claims(self, part) -> bool:
        return False  # given by its opener (``Part.reader``), never claimed

    def spans(self, part, pieces: int, least: int):
        from lengthscan.sources.formats.batch import even_spans

        return even_spans(part.rows, pieces, least)

    def read(self, part, columns, wanted, batch_rows, raw=(), *, stop=False):
        from lengthscan.sources.formats.batch import sliced

        with open(part.path, encoding="utf-8", newline="") as fh:
            lines = fh.read().removesuffix("\n").split("\n")
        table = pa.record_batch({"text": lines}).select(columns)
        yield from sliced(part, [table], wanted, batch_rows, stop=stop)


def test_a_new_format_is_a_reader_its_parts_name(tmp_path, corpus_rows):
    """A part whose opener names its reader is read by it, in tasks as any other (no other file changes)."""
    from lengthscan.sources.source import Part, SplitSource

    texts = [r["text"].replace("\n", " ") for r in corpus_rows if r["text"] and r["text"].strip()][:500]
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text("\n".join(texts[:200]) + "\n", newline="")
    paths[1].write_text("\n".join(texts[200:]) + "\n", newline="")
    schema = pa.schema([("text", pa.string())])
    parts = (Part(0, str(paths[0]), rows=200, columns=["text"], schema=schema, reader=TextLines()),
             Part(200, str(paths[1]), rows=300, columns=["text"], schema=schema, reader=TextLines()))
    split = SplitSource("train", parts, "fingerprint")
    assert [reader_for(p).name for p in parts] == ["text-lines", "text-lines"]
    assert parts[0].features() == {"text": {"dtype": "string", "_type": "Value"}}
    whole = [t for b in iter_batches(split, ["text"], batch_rows=64) for t in b.table.column("text").to_pylist()]
    assert whole == texts
    tasks = read_tasks(split, 5, 64)
    assert len(tasks) > 2
    got = [t for task in tasks for b in read_part("train", parts[task.part], ["text"], span=(task.lo, task.hi))
           for t in b.table.column("text").to_pylist()]
    assert got == texts
