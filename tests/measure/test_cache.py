"""The per-row length cache: a cached file whose content is not what lengthscan wrote (a value
changed in a sound Parquet file, or a file without its checksum) is never read: measured again,
with a warning, and the numbers stay the tokenizer's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import numbered_jsonl, write_jsonl
from tests.support.cli import in_process
from tests.support.reference import direct_counts


@pytest.mark.slow  # five audits
def test_a_tampered_length_cache_is_measured_again(tmp_path, bpe_dir, docs):
    texts = docs[:200]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet", "--overwrite"]
    truth = direct_counts(bpe_dir, texts, "input")

    def audit(name: str) -> tuple[list, int]:
        out = tmp_path / name
        assert main([*args, "--out", str(out)]) == 0
        report = json.loads((out / "report.json").read_text())
        return pq.read_table(out / "lengths.parquet")["input_tokens"].to_pylist(), report["cache_hits"]

    assert audit("a") == (truth, 0)
    assert audit("b") == (truth, 1)
    (cached,) = Path(os.environ["LENGTHSCAN_CACHE"], "lengths").glob("*.parquet")
    sound = pq.read_table(cached)
    # the same columns, types and rows, every length plausible: only the checksum tells
    pq.write_table(sound.set_column(0, "length", pc.add(sound["length"], pa.scalar(3, pa.int64()))), cached)
    with pytest.warns(RuntimeWarning, match=r"length cache not used: .*a checksum its content does not match"):
        assert audit("c") == (truth, 0)
    assert pq.read_table(cached).equals(sound)  # measured again and rewritten (the same bytes, the same name)
    assert audit("d") == (truth, 1)  # rewritten, verified, read

    (cached,) = Path(os.environ["LENGTHSCAN_CACHE"], "lengths").glob("*.parquet")
    key = cached.name.split(".")[0]
    cached.unlink()  # an unsealed file in its place (as an older lengthscan wrote them), values changed
    pq.write_table(sound.set_column(0, "length", pc.add(sound["length"], pa.scalar(3, pa.int64()))),
                   cached.with_name(f"{key}.parquet"))
    with pytest.warns(RuntimeWarning, match="length cache not used: .*no checksum"):
        assert audit("e") == (truth, 0)


@pytest.mark.slow  # four audits in child processes
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_special_file_or_folder_in_the_place_of_a_cache_file_is_not_read(tmp_path, claude_bpe_dir, docs):
    """Every cache file (the lengths, the sources' manifests, the tokenizer's memo and proofs, the
    count-only engine's rank table) replaced by a FIFO (a read blocks for ever), a link to
    /dev/zero (a read never ends) or a folder (a write cannot replace it): the run measures again,
    with warnings, and the numbers stay the tokenizer's."""
    import subprocess

    texts = docs[:100]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cache = tmp_path / "cache"
    env = {**os.environ, "LENGTHSCAN_CACHE": str(cache)}
    truth = direct_counts(claude_bpe_dir, texts, "input")

    def audit(name: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer",
                               str(claude_bpe_dir), "--input", "text", "--full", "--count-engine", "auto", "--out",
                               str(tmp_path / name), "--quiet"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert pq.read_table(tmp_path / name / "lengths.parquet")["input_tokens"].to_pylist() == truth
        return proc

    audit("first")
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    kinds = {p.relative_to(cache).parts[0] for p in files}
    assert {"lengths", "sources", "countbpe", "tokenizers"} <= kinds, kinds
    for kind in ("fifo", "device", "folder"):
        for p in files:
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink(missing_ok=True)
            {"fifo": os.mkfifo, "device": lambda q: q.symlink_to("/dev/zero"), "folder": os.mkdir}[kind](p)
        proc = audit(kind)
        assert "Traceback" not in proc.stderr and "not used" in proc.stderr


@pytest.mark.slow
def test_a_rewrite_keeping_size_and_mtime_is_measured_again(tmp_path, bpe_dir):
    src = numbered_jsonl(tmp_path / "s.jsonl", 4, "aaaaaaaaa {i}")
    args = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    stat = src.stat()
    time.sleep(0.05)
    numbered_jsonl(src, 4, "a b c d e {i}")  # same byte count, more tokens
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert src.stat().st_size == stat.st_size and src.stat().st_mtime_ns == stat.st_mtime_ns
    assert main([*args, "--out", str(tmp_path / "two")]) == 0
    one, two = (pq.read_table(tmp_path / d / "lengths.parquet").column("input_tokens").to_pylist()
                for d in ("one", "two"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    assert two == [len(tok(f"a b c d e {i}")["input_ids"]) for i in range(4)] != one


@pytest.mark.slow  # six damaged caches, each two audits
def test_a_damaged_cache_is_ignored_with_a_warning_and_the_numbers_stay_right(tmp_path, bpe_dir, monkeypatch,
                                                                               capsys):
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    src = write_jsonl(tmp_path / "s.jsonl", [{"text": f"row {i} " + "word " * i} for i in range(50)])
    args = [str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--json", "--overwrite",
            "--out", str(tmp_path / "o")]

    def audit():
        proc = in_process(capsys, "audit", *args, warnings_on_stderr=True)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout)["splits"][0]["fields"]["input_tokens"], proc.stderr

    truth, _ = audit()
    manifest = next((tmp_path / "cache" / "sources").glob("*.json"))
    lengths = next((tmp_path / "cache" / "lengths").glob("*.parquet"))
    good_manifest, good_lengths = manifest.read_bytes(), pq.read_table(lengths)
    edits = [lambda: manifest.write_text('{"a": 1}'),
             lambda: manifest.write_text(json.dumps({**json.loads(good_manifest), "entries": [{"path": str(src)}]})),
             lambda: manifest.write_text(good_manifest.decode().replace('"rows": 50', '"rows": 10')),
             lambda: pq.write_table(good_lengths.slice(0, 10), lengths),
             lambda: pq.write_table(pa.table({"foo": good_lengths["length"]}), lengths),
             lambda: pq.write_table(pa.table({"length": pa.array([-7] * 50, pa.int64()),
                                              "flag": good_lengths["flag"]}), lengths)]
    for edit in edits:
        edit()
        stats, err = audit()
        assert stats == truth and "lengthscan:" in err and ("damaged" in err or "cache not used" in err), err
        assert stats == audit()[0]  # rebuilt: the next run reads a sound cache
        manifest.write_bytes(good_manifest)
        pq.write_table(good_lengths, lengths)


def test_a_bad_length_cache_is_ignored_with_one_warning(tmp_path, bpe_dir, corpus_jsonl, monkeypatch, capsys):
    """The cache is an optimisation: a cache folder that is a file, or a corrupt cached file, never
    stops a run; the corrupt file is rebuilt."""
    args = ["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    (tmp_path / "not-a-dir").write_text("x")
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "not-a-dir"))
    with pytest.warns(RuntimeWarning, match="length cache not used"):
        assert main([*args, "--out", str(tmp_path / "a")]) == 0
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    for f in (tmp_path / "cache" / "lengths").glob("*.parquet"):
        f.write_bytes(b"not parquet")
    with pytest.warns(RuntimeWarning, match="length cache not used"):
        assert main([*args, "--out", str(tmp_path / "c")]) == 0
    assert main([*args, "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "report.json").read_text())["cache_hits"] == 1
    same = [pq.read_table(tmp_path / x / "lengths.parquet") for x in "abcd"]
    assert all(t.equals(same[0]) for t in same)
