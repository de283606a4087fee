"""--out and the outputs it holds: empty names, links, mount points, files and the source itself are
refused as --out; one writer at a time (a held lock, two cleans at once); an --out that cannot be
made, a full or read-only disk; a dead run's staging folder swept; a clean that would overwrite its
own columns refused. Each is exit 2 with one line, nothing lost and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lengthscan.cli.main import main
from tests.factories import numbered_jsonl, write_jsonl
from tests.support.cli import ROOT, in_process, one_line, one_line_text


@pytest.mark.parametrize("case", ["out", "source", "tokenizer", "model"])
def test_an_empty_name_is_refused_and_the_working_directory_untouched(tmp_path, bpe_dir, case, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    numbered_jsonl(tmp_path / "keep.jsonl", 3)
    args = {"source": "keep.jsonl", "tokenizer": bpe_dir, "out": "o"}
    args[case] = ""
    extra = ["--model", ""] if case == "model" else []
    proc = in_process(capsys, "clean", args["source"], "--tokenizer", args["tokenizer"], "--input", "text", "--out",
                      args["out"], "--overwrite", *extra)
    assert proc.returncode == 2, proc.stderr
    one_line_text(proc.stderr)
    assert "empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]


def test_tokenize_refuses_a_length_column_it_writes_itself(tmp_path, bpe_dir, corpus_jsonl, capsys):
    proc = in_process(capsys, "clean", corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--tokenize",
                      "--length-column", "input_ids", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "--tokenize writes that column" in proc.stderr
    one_line_text(proc.stderr)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dangling", [True, False])
def test_an_out_that_is_a_symbolic_link_is_refused(tmp_path, bpe_dir, corpus_jsonl, dangling, capsys):
    target = tmp_path / "target"
    if not dangling:
        target.mkdir()
        (target / "precious.txt").write_text("x")
    (tmp_path / "link").symlink_to(target)
    for command in ("audit", "clean"):
        proc = in_process(capsys, command, corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out",
                          tmp_path / "link", "--overwrite")
        assert proc.returncode == 2 and "symbolic link" in proc.stderr
        one_line_text(proc.stderr)
    assert (tmp_path / "link").is_symlink()
    assert not target.exists() if dangling else sorted(os.listdir(target)) == ["precious.txt"]


@pytest.mark.slow
@pytest.mark.skipif(not ROOT, reason="mounting a file system needs root")
def test_an_out_that_is_a_mount_point_is_refused(tmp_path, bpe_dir, corpus_jsonl, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        proc = in_process(capsys, "clean", corpus_jsonl, "--tokenizer", bpe_dir, "--input", "text", "--out", disk,
                          "--overwrite")
        assert proc.returncode == 2 and "mount point" in proc.stderr
        one_line_text(proc.stderr)
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_recleaning_rejects_names_the_columns_to_remove(tmp_path, bpe_dir, corpus_jsonl, capsys):
    first = tmp_path / "first"
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                 "input_tokens<=20", "--out", str(first), "--quiet"]) == 0
    proc = in_process(capsys, "clean", first / "rejects", "--tokenizer", bpe_dir, "--input", "text", "--out",
                      tmp_path / "second")
    assert proc.returncode == 2 and "earlier clean's rejects" in proc.stderr and "remove_columns" in proc.stderr
    one_line_text(proc.stderr)


def test_clean_never_turns_a_file_into_its_out(tmp_path, bpe_dir, corpus_jsonl, capsys):
    (tmp_path / "notes.txt").write_text("precious")
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                 str(tmp_path / "notes.txt"), "--overwrite", "--quiet"]) == 2
    one_line(capsys, "exists and is not a directory")
    assert (tmp_path / "notes.txt").read_text() == "precious" and sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_a_dead_runs_staging_folder_is_swept_by_the_next_run(tmp_path, bpe_dir, corpus_jsonl):
    out = tmp_path / "o"
    (tmp_path / f".o.tmp-{os.getpid()}-deadbeef").mkdir()  # even a live pid: under the lock it is a leftover
    (tmp_path / ".o.old-cafe").mkdir()
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                 "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["o"]


def _clean(src, out, bpe_dir, *extra):
    return [sys.executable, "-m", "lengthscan", "clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text",
            "--limit", "input_tokens<=12", "--out", str(out), "--quiet", *extra]


@pytest.mark.slow
def test_two_cleans_into_one_out_exactly_one_publishes(tmp_path, bpe_dir, corpus_jsonl):
    out = tmp_path / "cleaned"
    runs = [subprocess.Popen(_clean(corpus_jsonl, out, bpe_dir), stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    codes, errs = zip(*[(p.wait(timeout=300), p.stderr.read()) for p in runs])
    assert sorted(codes) == [0, 2], errs
    loser = errs[codes.index(2)]
    assert ("another lengthscan run" in loser or "exists" in loser) and "Traceback" not in loser
    assert loser.count("\n") == 1
    report = json.loads((out / "report.json").read_text())
    split = report["decisions"]["splits"][0]
    assert split["kept"] + split["truncated"] + split["dropped"] == split["rows"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleaned"]  # no staging folder, no lock left


def test_a_held_lock_refuses_a_second_writer_and_is_released(tmp_path, bpe_dir, corpus_jsonl, capsys):
    from lengthscan.write.staging import discard, staging_dir

    out = tmp_path / "o"
    staging = staging_dir(out)  # this process holds --out now
    try:
        holder = subprocess.run(_clean(corpus_jsonl, out, bpe_dir), capture_output=True, text=True, timeout=300)
        assert holder.returncode == 2 and f"pid {os.getpid()}" in holder.stderr and not out.exists()
    finally:
        discard(staging)
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                 "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


@pytest.mark.parametrize("case", ["under_a_file", "name_too_long"])
def test_an_out_that_cannot_be_made_is_one_line(tmp_path, bpe_dir, corpus_jsonl, capsys, case):
    (tmp_path / "afile").write_text("x")
    out = {"under_a_file": tmp_path / "afile" / "o", "name_too_long": tmp_path / ("x" * 250)}[case]
    for command in ("clean", "audit"):
        code = main([command, str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                     "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert {"under_a_file": "is a file", "name_too_long": "too long"}[case] in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _mount(path, *options):
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.decode().strip()}")


@pytest.mark.skipif(not ROOT, reason="mounting a small or read-only file system needs root")
@pytest.mark.parametrize("kind", [pytest.param("full", marks=pytest.mark.slow), "read_only"])
def test_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(tmp_path, bpe_dir, corpus_jsonl, kind, capsys):
    disk = tmp_path / "disk"
    _mount(disk, "size=256k" if kind == "full" else "ro,size=1m")
    try:
        for command in ("clean", "audit"):
            proc = in_process(capsys, command, *_clean(corpus_jsonl, disk / "o", bpe_dir)[4:],
                              *(["--full"] if command == "audit" else []), warnings_on_stderr=True)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert {"full": "no space left", "read_only": "read-only"}[kind] in proc.stderr
            assert proc.stderr.count("\n") == 1
            assert os.listdir(disk) == []  # no staging folder, no lock file, no partial output
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_out_never_is_contains_or_lies_in_the_source(tmp_path, bpe_dir, capsys, where):
    data = tmp_path / "data"
    data.mkdir()
    src = write_jsonl(data / "s.jsonl", [{"text": f"row {i}"} for i in range(20)])
    before = src.read_bytes()
    source, out = {"same": (data, data), "parent": (src, data), "inside": (data, data / "cleaned")}[where]
    code = main(["clean", str(source), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", "input_tokens<=8",
                 "--out", str(out), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "the source path" in err and "Traceback" not in err
    assert src.read_bytes() == before and sorted(p.name for p in data.iterdir()) == ["s.jsonl"]
    assert main(["audit", str(source), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                 "--overwrite", "--quiet"]) == 2
    assert src.read_bytes() == before
