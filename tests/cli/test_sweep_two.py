"""The second hardening sweep: empty names, paths a source names for itself, outputs that are links
or mount points or overlap, a stale cache, embedded audio without a file, a closed stderr, SIGTERM,
terminal escapes in names, native decoders' chatter, impossible model sizes. Each: exit 2 with one
line (or a documented outcome), nothing lost, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.audio_files import write_audio

pytestmark = pytest.mark.slow  # the second sweep's cases run the CLI as a user would, mostly in subprocesses

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _jsonl(path: Path, n: int, text: str = "row {i} with a few words") -> Path:
    path.write_text("".join(json.dumps({"text": text.format(i=i)}) + "\n" for i in range(n)), encoding="utf-8")
    return path


def _cli(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kwargs)


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("case", ["out", "source", "tokenizer", "model"])
def test_an_empty_name_is_refused_and_the_working_directory_untouched(tmp_path, bpe_dir, case):
    _jsonl(tmp_path / "keep.jsonl", 3)
    args = {"source": "keep.jsonl", "tokenizer": bpe_dir, "out": "o"}
    args[case] = ""
    extra = ["--model", ""] if case == "model" else []
    proc = _cli("clean", args["source"], "--tokenizer", args["tokenizer"], "--input", "text", "--out", args["out"],
                "--overwrite", *extra, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr)
    assert "empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]


@pytest.mark.parametrize("where", ["split", "data_file"])
def test_a_saved_dataset_naming_paths_outside_itself_is_refused(tmp_path, bpe_dir, where):
    from datasets import Dataset, DatasetDict

    outside = tmp_path / "outside"
    Dataset.from_dict({"text": ["secret data"] * 3}).save_to_disk(str(outside))
    crafted = tmp_path / "crafted"
    DatasetDict({"train": Dataset.from_dict({"text": ["a", "b"]})}).save_to_disk(str(crafted))
    if where == "split":
        (crafted / "dataset_dict.json").write_text(json.dumps({"splits": ["../outside"]}))
    else:
        state = crafted / "train" / "state.json"
        data = json.loads(state.read_text())
        data["_data_files"] = [{"filename": "../../outside/data-00000-of-00001.arrow"}]
        state.write_text(json.dumps(data))
    proc = _cli("clean", crafted, "--tokenizer", bpe_dir, "--input", "text", "--out", outside, "--overwrite")
    assert proc.returncode == 2
    _one_line(proc.stderr)
    assert "plain" in proc.stderr
    assert (outside / "state.json").exists()  # the data it pointed at is still there


def test_a_recursive_glob_skips_an_earlier_parquet_clean_but_its_own_files_can_be_named(tmp_path, bpe_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("".join(json.dumps({"text": "word " * i}) + "\n" for i in range(1, 10)))
    assert main(["clean", str(data / "a.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=5", "--format", "parquet", "--out", str(tmp_path / "c"), "--quiet"]) == 0
    (tmp_path / "c").rename(data / "c")
    pq.write_table(pa.table({"text": ["one more row"]}), data / "b.parquet")
    out = tmp_path / "audit"
    with pytest.warns(UserWarning, match="skipped files in 1 earlier lengthscan output"):
        assert main(["audit", str(data / "**" / "*.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                     "--full", "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 1
    kept = pq.read_metadata(next((data / "c" / "dataset").glob("*.parquet"))).num_rows
    assert main(["audit", str(data / "c" / "dataset" / "*.parquet"), "--tokenizer", str(bpe_dir), "--input",
                 "text", "--full", "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == kept


def test_the_cache_folder_inside_a_source_folder_is_not_data(tmp_path, bpe_dir, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    _jsonl(data / "a.jsonl", 5)
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(data / "cache"))
    args = ["audit", str(data), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0  # writes the cache (and its manifests) into data/
    assert (data / "cache").is_dir()
    with pytest.warns(UserWarning, match="output or cache folder"):
        assert main([*args, "--out", str(tmp_path / "two")]) == 0
    assert json.loads((tmp_path / "two" / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 5


def test_a_rewrite_keeping_size_and_mtime_is_measured_again(tmp_path, bpe_dir):
    src = _jsonl(tmp_path / "s.jsonl", 4, "aaaaaaaaa {i}")
    args = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    stat = src.stat()
    time.sleep(0.05)
    _jsonl(src, 4, "a b c d e {i}")  # same byte count, more tokens
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert src.stat().st_size == stat.st_size and src.stat().st_mtime_ns == stat.st_mtime_ns
    assert main([*args, "--out", str(tmp_path / "two")]) == 0
    one, two = (pq.read_table(tmp_path / d / "lengths.parquet").column("input_tokens").to_pylist()
                for d in ("one", "two"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    assert two == [len(tok(f"a b c d e {i}")["input_ids"]) for i in range(4)] != one


def test_tokenize_refuses_a_length_column_it_writes_itself(tmp_path, bpe_dir, corpus_jsonl):
    proc = _cli("clean", corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--tokenize",
                "--length-column", "input_ids", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "--tokenize writes that column" in proc.stderr
    _one_line(proc.stderr)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dangling", [True, False])
def test_an_out_that_is_a_symbolic_link_is_refused(tmp_path, bpe_dir, corpus_jsonl, dangling):
    target = tmp_path / "target"
    if not dangling:
        target.mkdir()
        (target / "precious.txt").write_text("x")
    (tmp_path / "link").symlink_to(target)
    for command in ("audit", "clean"):
        proc = _cli(command, corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out",
                    tmp_path / "link", "--overwrite")
        assert proc.returncode == 2 and "symbolic link" in proc.stderr
        _one_line(proc.stderr)
    assert (tmp_path / "link").is_symlink()
    assert not target.exists() if dangling else sorted(os.listdir(target)) == ["precious.txt"]


@pytest.mark.skipif(not ROOT, reason="mounting a file system needs root")
def test_an_out_that_is_a_mount_point_is_refused(tmp_path, bpe_dir, corpus_jsonl):
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        proc = _cli("clean", corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out", disk,
                    "--overwrite")
        assert proc.returncode == 2 and "mount point" in proc.stderr
        _one_line(proc.stderr)
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_memory_refuses_an_export_inside_its_out(tmp_path, bpe_dir, corpus_jsonl):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                  "vocab_size": 1000, "n_positions": 512}))
    proc = _cli("memory", corpus_jsonl, "--model", config, "--tokenizer", bpe_dir, "--input", "text",
                "--batch-size", 4, "--out", tmp_path / "m", "--export-worst-batch", tmp_path / "m" / "worst")
    assert proc.returncode == 2 and "overlap" in proc.stderr
    _one_line(proc.stderr)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("field,value", [("n_embd", -5), ("n_layer", 0), ("n_head", 2.5)])
def test_memory_refuses_model_sizes_that_are_no_size(tmp_path, field, value):
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000}
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = _cli("memory", "--model", tmp_path / "config.json", "--batch-size", 2, "--input-len", 16)
    assert proc.returncode == 2 and field in proc.stderr
    _one_line(proc.stderr)


def test_embed_audio_with_values_holding_no_file(tmp_path):
    """An Audio value with neither bytes nor path, and one whose file is gone, are rejects (with
    their reason) and the clean publishes: kept rows' files embedded, rejects as they were."""
    from datasets import load_from_disk

    wav = write_audio(tmp_path / "a.wav", 16000, 16000)
    features = {"audio": {"_type": "Audio", "decode": False}, "text": {"_type": "Value", "dtype": "string"}}
    audio = pa.array([{"bytes": None, "path": str(wav)}, {"bytes": None, "path": None}, None,
                      {"bytes": None, "path": str(tmp_path / "gone.wav")}],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"audio": audio, "text": list("abcd")})
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})}),
                   tmp_path / "au.parquet")
    out = tmp_path / "o"
    proc = _cli("clean", tmp_path / "au.parquet", "--audio", "audio", "--sampling-rate", 16000, "--embed-audio",
                "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    kept = load_from_disk(str(out / "dataset")).data.column("audio").to_pylist()
    assert kept == [{"bytes": wav.read_bytes(), "path": "a.wav"}]
    rejects = load_from_disk(str(out / "rejects")).data.to_pylist()
    assert [r["row"] for r in rejects] == [1, 2, 3]
    assert [r["audio"] for r in rejects] == [None, None, {"bytes": None, "path": str(tmp_path / "gone.wav")}]
    assert [r["reason"] for r in rejects] == ["input_missing", "input_missing", "input_missing_file"]


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_usage_error_exits_2_when_stderr_cannot_be_written(tmp_path, bpe_dir, stderr):
    src = _jsonl(tmp_path / "s.jsonl", 2)
    redirect = "2>&-" if stderr == "closed" else "2>/dev/full"
    for args in ([str(src), "--bogus"], [str(src), "--tokenizer", str(bpe_dir), "--input", "nope"]):
        command = " ".join([sys.executable, "-m", "lengthscan", "audit", *args, "--out", str(tmp_path / "o")])
        proc = subprocess.run(f"{command} {redirect}", shell=True, capture_output=False, stdout=subprocess.PIPE,
                              timeout=120)
        assert proc.returncode == 2 and proc.stdout == b""


def test_sigterm_is_handled_as_ctrl_c(tmp_path, bpe_dir):
    src = _jsonl(tmp_path / "big.jsonl", 200_000, "word {i} " * 3)
    proc = subprocess.Popen([sys.executable, "-m", "lengthscan", "clean", str(src), "--tokenizer", str(bpe_dir),
                             "--input", "text", "--no-cache", "--out", str(tmp_path / "o")],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob(".o.tmp-*")):
        time.sleep(0.05)  # measuring has started once the staging folder exists
    assert list(tmp_path.glob(".o.tmp-*")), "the clean never started writing"
    proc.send_signal(signal.SIGTERM)
    code, err = proc.wait(timeout=60), proc.stderr.read()
    assert code == 143 and "terminated; no output was published" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]  # no staging, no lock, no output


def test_control_and_bidi_characters_in_names_are_escaped(tmp_path, bpe_dir):
    name = "a\x1b[31mred\u202e\nx.jsonl"
    _jsonl(tmp_path / name, 2)
    proc = _cli("audit", tmp_path / name, "--tokenizer", bpe_dir, "--input", "nope", "--out", tmp_path / "o")
    assert proc.returncode == 2
    _one_line(proc.stderr)
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert "\\x1b[31mred\\u202e\\nx.jsonl" in proc.stderr


def test_native_decoder_notes_stay_off_the_terminal(tmp_path):
    good = write_audio(tmp_path / "good.mp3", 48000, 16000, format="MP3", subtype="MPEG_LAYER_III")
    data = good.read_bytes()
    (tmp_path / "junk.mp3").write_bytes(data[:2000] + b"\x00garbage" * 50 + data[2000:])
    (tmp_path / "m.csv").write_text("path,text\ngood.mp3,a\njunk.mp3,b\n")
    proc = _cli("audit", tmp_path / "m.csv", "--audio", "path", "--sampling-rate", 16000, "--out", tmp_path / "o",
                "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert pq.read_table(tmp_path / "o" / "lengths.parquet").num_rows == 2


def test_the_demo_builds_elsewhere_when_the_cache_cannot_be_written(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = _cli("demo", "--out", tmp_path / "demo", env={**os.environ, "LENGTHSCAN_CACHE": str(tmp_path / "afile")})
    assert proc.returncode == 0, proc.stderr
    assert "cannot be written" in proc.stderr and "--out" not in proc.stderr
    assert (tmp_path / "demo" / "report.html").exists()


def test_long_id_values_are_shortened_in_the_report_not_in_lengths(tmp_path, bpe_dir):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"id": f"{i}" + "x" * 1_000_000, "text": "w " * (i + 1)}) + "\n"
                           for i in range(3)))
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--id", "id", "--full",
                 "--out", str(out), "--quiet"]) == 0
    assert (out / "report.json").stat().st_size < 200_000
    shown = [r["id"] for r in json.loads((out / "report.json").read_text())["longest_rows"]]
    assert shown and all(len(s) < 300 and s.endswith("(1,000,001 characters)") for s in shown)
    assert {len(v) for v in pq.read_table(out / "lengths.parquet").column("id").to_pylist()} == {1_000_001}


def test_recleaning_rejects_names_the_columns_to_remove(tmp_path, bpe_dir, corpus_jsonl):
    first = tmp_path / "first"
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=20", "--out", str(first), "--quiet"]) == 0
    proc = _cli("clean", first / "rejects", "--tokenizer", bpe_dir, "--input", "text", "--out",
                tmp_path / "second")
    assert proc.returncode == 2 and "earlier clean's rejects" in proc.stderr and "remove_columns" in proc.stderr
    _one_line(proc.stderr)
