"""The per-row length cache: a cached file whose content is not what lengthscan wrote (a value
changed in a sound Parquet file, or a file without its checksum) is never read: measured again,
with a warning, and the numbers stay the tokenizer's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
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
    import sys

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
