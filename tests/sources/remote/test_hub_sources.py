"""Hub dataset ids and ``hf://`` paths, read from the range server laid out as the hub serves files
(``HF_ENDPOINT``): the repository's own Parquet files, else the hub's conversion, at one commit sha;
each audit against the same audit of the local files.

huggingface_hub refuses every request while ``HF_HUB_OFFLINE`` is set (tests/conftest.py sets it; the
library reads it at import), so the audits through the hub run as ``lengthscan`` processes started
with ``hub_env(srv)``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan import audit
from tests.support.range_server import RangeServer, hub_env

pytestmark = pytest.mark.slow  # lengthscan processes (the hub needs a fresh huggingface_hub import)

SHA_A = "a" * 40
SHA_B = "b" * 40
SHA_C = "c" * 40
SHA_CONV = "d" * 40
SCHEMA = pa.schema([("text", pa.string()), ("summary", pa.string())])


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=100)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, corpus_rows):
    root = tmp_path_factory.mktemp("hub")
    main = root / "main"
    _write(main / "data" / "train-00000-of-00002.parquet", corpus_rows[:900])
    _write(main / "data" / "train-00001-of-00002.parquet", corpus_rows[900:2000])
    _write(main / "data" / "test-00000-of-00001.parquet", corpus_rows[2000:])
    (main / "README.md").write_text("# corpus\n")
    newer = root / "newer"
    shutil.copytree(main, newer)
    _write(newer / "data" / "train-00000-of-00002.parquet", corpus_rows[:300])  # a later push
    plain = root / "plain"
    plain.mkdir()
    (plain / "corpus.txt").write_text("no parquet here\n")
    conv = root / "conv"
    _write(conv / "default" / "train" / "0000.parquet", corpus_rows[:1500])
    _write(conv / "default" / "partial-test" / "0000.parquet", corpus_rows[1500:1800])
    configs = root / "configs"
    _write(configs / "en" / "train.parquet", corpus_rows[:400])
    _write(configs / "fr" / "part-0.parquet", corpus_rows[400:700])
    _write(configs / "fr" / "part-1.parquet", corpus_rows[700:1000])
    lines = root / "lines"
    lines.mkdir()
    (lines / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus_rows[:50]))
    card = {"configs": [{"config_name": "en", "data_files": [{"split": "train", "path": "en/*.parquet"}]},
                        {"config_name": "fr", "data_files": "fr/*.parquet"}]}
    with RangeServer(root) as srv:
        srv.add_dataset("lsc/corpus", {"main": (main, SHA_A)})
        srv.add_dataset("lsc/configs", {"main": (configs, "e" * 40)}, card_data=card)
        srv.add_dataset("lsc/lines", {"main": (lines, "f" * 40)})
        srv.add_dataset("lsc/converted", {"main": (plain, SHA_C), "refs/convert/parquet": (conv, SHA_CONV)})
        yield srv, root


def _cli(srv, tmp_path, *args) -> subprocess.CompletedProcess:
    env = hub_env(srv, tmp_path / "hf-home")
    env["LENGTHSCAN_CACHE"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-m", "lengthscan", "audit", *args, "--quiet"], env=env, text=True,
                          capture_output=True, timeout=300)


def _lengths(out, split=None) -> list[dict]:
    table = pq.read_table(out / "lengths.parquet")
    if split is not None:
        table = table.filter(pa.compute.equal(table["split"], split)).drop_columns(["split"])
    return table.drop_columns([c for c in ("source_file",) if c in table.column_names]).to_pylist()


def test_a_hub_id_reads_its_parquet_files_by_block_at_one_commit(tmp_path, hub, bpe_dir):
    srv, root = hub
    srv.reset_counts()
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary", "--sample", "25%",
            "--sample-unit", "block", "--seed", "4", "--no-cache"]
    run = _cli(srv, tmp_path, "lsc/corpus", "--split", "train", *args, "--out", str(tmp_path / "hub"))
    assert run.returncode == 0, run.stderr
    local = audit(str(root / "main" / "data" / "train-*.parquet"), tokenizer=str(bpe_dir), input="text",
                  target="summary", sample="25%", sample_unit="block", seed=4, cache=False, out=tmp_path / "local")
    assert local.splits[0].sample.unit == "block"
    assert _lengths(tmp_path / "hub", "train") == _lengths(tmp_path / "local")
    report = json.loads((tmp_path / "hub" / "report.json").read_text())
    source = report["source"]
    assert source["revision"] == SHA_A and "repository's Parquet files" in source["resolved"]
    assert source["bytes_read"] == srv.bytes_served and source["bytes_read"] < 0.6 * source["bytes_total"]
    assert "token" not in json.dumps(source).lower()
    assert report["splits"][0]["fields"] == local.to_dict()["splits"][0]["fields"]


def test_a_push_during_the_run_cannot_mix_versions_and_revision_pins_a_commit(tmp_path, hub, bpe_dir, corpus_rows):
    srv, root = hub
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache"]
    srv.set_revision_sha("lsc/corpus", "main", SHA_B, root / "newer")
    try:
        old = _cli(srv, tmp_path, "lsc/corpus", "--revision", SHA_A, *args, "--out", str(tmp_path / "old"))
        new = _cli(srv, tmp_path, "hf://datasets/lsc/corpus/data/train-*.parquet", *args, "--out",
                   str(tmp_path / "new"))
    finally:
        srv.set_revision_sha("lsc/corpus", "main", SHA_A, root / "main")
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    old_report = json.loads((tmp_path / "old" / "report.json").read_text())
    assert old_report["source"]["revision"] == SHA_A
    assert [(s["split"], s["sample"]["rows_total"]) for s in old_report["splits"]] == \
        [("train", 2000), ("test", len(corpus_rows) - 2000)]
    new_report = json.loads((tmp_path / "new" / "report.json").read_text())
    assert new_report["source"]["revision"] == SHA_B
    assert new_report["splits"][0]["sample"]["rows_total"] == 300 + 1100  # the files of commit B, all of them
    files = pq.read_table(tmp_path / "new" / "lengths.parquet")["source_file"].to_pylist()
    assert all(f"@{SHA_B}/" in f for f in files)


def test_the_hubs_conversion_is_read_and_a_partial_split_said_so(tmp_path, hub, bpe_dir):
    srv, root = hub
    run = _cli(srv, tmp_path, "lsc/converted", "--tokenizer", str(bpe_dir), "--input", "text", "--full",
               "--no-cache", "--out", str(tmp_path / "conv"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "conv" / "report.json").read_text())
    assert report["source"]["revision"] == SHA_CONV and "refs/convert/parquet" in report["source"]["resolved"]
    assert [s["split"] for s in report["splits"]] == ["train", "test"]
    assert any("partial-test" in n and "first part" in n for n in report["source"]["notes"])
    local = audit(str(root / "conv" / "default" / "train" / "0000.parquet"), tokenizer=str(bpe_dir), input="text",
                  full=True, cache=False, out=tmp_path / "local")
    assert local.splits[0].sample.rows_total == 1500
    assert _lengths(tmp_path / "conv", "train") == _lengths(tmp_path / "local")


def test_an_unknown_dataset_or_revision_exits_2(tmp_path, hub, bpe_dir):
    srv, _ = hub
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--full"]
    missing = _cli(srv, tmp_path, "lsc/nothing", *args)
    assert missing.returncode == 2 and "lsc/nothing" in missing.stderr and "Traceback" not in missing.stderr
    bad_rev = _cli(srv, tmp_path, "lsc/corpus", "--revision", "no-such-branch", *args)
    assert bad_rev.returncode == 2 and "no-such-branch" in bad_rev.stderr and "Traceback" not in bad_rev.stderr


def test_a_config_of_the_dataset_card_picks_its_files(tmp_path, hub, bpe_dir):
    srv, root = hub
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache"]
    run = _cli(srv, tmp_path, "lsc/configs", "--config", "fr", *args, "--out", str(tmp_path / "fr"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "fr" / "report.json").read_text())
    assert report["source"]["files"] == 2 and report["splits"][0]["sample"]["rows_total"] == 600
    assert "config fr" in report["source"]["resolved"]
    several = _cli(srv, tmp_path, "lsc/configs", *args)
    assert several.returncode == 2 and "--config" in several.stderr and "en, fr" in several.stderr


def test_a_dataset_without_parquet_goes_through_load_dataset_and_says_so(tmp_path, hub, bpe_dir):
    srv, _ = hub
    run = _cli(srv, tmp_path, "lsc/lines", "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
               "--out", str(tmp_path / "lines"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "lines" / "report.json").read_text())
    assert report["source"]["resolved"].startswith("load_dataset") and report["source"]["bytes_read"] is None
    assert report["splits"][0]["sample"]["rows_total"] == 50
