"""``--id COL`` in lengths.parquet, and the audit report's longest rows with their text previews."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main


@pytest.fixture
def parquet_source(tmp_path, corpus_rows):
    rows = corpus_rows[:1500]
    table = pa.table({"uid": [f"doc-{i:05d}" for i in range(len(rows))], "text": [r["text"] for r in rows],
                      "summary": [r["summary"] for r in rows], "meta": [{"n": i} for i in range(len(rows))]})
    path = tmp_path / "data.parquet"
    pq.write_table(table, path, row_group_size=200)  # the previews read a few row groups back
    return path, table


def test_an_audit_carries_the_id_and_previews_its_longest_rows(tmp_path, bpe_dir, parquet_source):
    path, table = parquet_source
    out = tmp_path / "o"
    assert main(["audit", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
                 "--full", "--id", "uid", "--out", str(out), "--quiet"]) == 0
    lengths = pq.read_table(out / "lengths.parquet").to_pandas()
    assert list(lengths.columns[:2]) == ["row", "uid"]
    assert (lengths["uid"] == [table["uid"][int(r)].as_py() for r in lengths["row"]]).all()
    report = json.loads((out / "report.json").read_text())
    longest = report["longest_rows"]
    for metric, column in (("input_tokens", "text"), ("target_tokens", "summary")):
        mine = [r for r in longest if r["field"] == metric]
        expected = lengths.sort_values([metric, "row"], ascending=[False, True]).head(20)
        assert [r["row"] for r in mine] == expected["row"].tolist()
        for r in mine:
            assert r["lengths"][metric] == int(lengths.loc[lengths["row"] == r["row"], metric].iloc[0])
            assert r["id"] == table["uid"][r["row"]].as_py()
            assert r["preview"][column] == table[column][r["row"]].as_py()[:160]
    html = (out / "report.html").read_text()
    top = next(r for r in longest if r["field"] == "input_tokens")
    assert "Worst rows" in html and top["id"] in html


def test_redact_keeps_ids_and_texts_out_of_the_report(tmp_path, bpe_dir, parquet_source):
    path, table = parquet_source
    out = tmp_path / "o"
    assert main(["audit", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--id", "uid",
                 "--redact", "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["longest_rows"] and all("preview" not in r and "id" not in r for r in report["longest_rows"])
    html = (out / "report.html").read_text()
    assert "doc-0" not in html
    assert pq.read_table(out / "lengths.parquet").column_names[1] == "uid"  # the lengths file is not the report


def test_a_clean_carries_the_id_into_lengths_and_rejects(tmp_path, bpe_dir, parquet_source):
    path, table = parquet_source
    out = tmp_path / "c"
    assert main(["clean", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
                 "--limit", "target_tokens<=p90", "--id", "uid", "--out", str(out), "--quiet"]) == 0
    lengths = pq.read_table(out / "lengths.parquet").to_pandas()
    assert (lengths["uid"] == [f"doc-{r:05d}" for r in lengths["row"]]).all()
    from datasets import load_from_disk

    rejects = load_from_disk(str(out / "rejects")).to_pandas()
    kept = load_from_disk(str(out / "dataset")).to_pandas()
    assert len(rejects) > 0 and (rejects["uid"] == [f"doc-{r:05d}" for r in rejects["row"]]).all()
    assert sorted(pd.concat([kept["uid"], rejects["uid"]])) == table["uid"].to_pylist()


@pytest.mark.parametrize("column,words", [("meta", "not a plain value"), ("nope", "no column 'nope'"),
                                          ("input_tokens", "has a column of that name")])
def test_a_bad_id_column_is_one_line(tmp_path, bpe_dir, parquet_source, capsys, column, words):
    path, _ = parquet_source
    assert main(["audit", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--id", column,
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
