"""Hardening of --out (one writer at a time, unwritable places, a full disk) and of sources (literal
names with glob characters, earlier outputs inside a source folder, special files, a CSV header
alone, AIFF headers whose sample rate is no rate): exit 2 with one line, or a per-row reason, and
nothing lost or left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from lengthscan.cli.main import main

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _write_jsonl(path, n, text="row {i} with a few words"):
    path.write_text("".join(json.dumps({"text": text.format(i=i)}) + "\n" for i in range(n)), encoding="utf-8")
    return path


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
def test_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(tmp_path, bpe_dir, corpus_jsonl, kind):
    disk = tmp_path / "disk"
    _mount(disk, "size=256k" if kind == "full" else "ro,size=1m")
    try:
        for command in ("clean", "audit"):
            proc = subprocess.run(_clean(corpus_jsonl, disk / "o", bpe_dir)[:3] + [command]
                                  + _clean(corpus_jsonl, disk / "o", bpe_dir)[4:]
                                  + (["--full"] if command == "audit" else []), capture_output=True, text=True)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert {"full": "no space left", "read_only": "read-only"}[kind] in proc.stderr
            assert proc.stderr.count("\n") == 1
            assert os.listdir(disk) == []  # no staging folder, no lock file, no partial output
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_literal_name_with_glob_characters_is_read_as_the_file(tmp_path, bpe_dir):
    src = _write_jsonl(tmp_path / "train[2024].jsonl", 7)
    _write_jsonl(tmp_path / "train2.jsonl", 5)  # what the name matches as a glob: not read
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--out", str(out),
                 "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 7


def test_earlier_outputs_inside_a_source_folder_are_not_data(tmp_path, bpe_dir):
    data = tmp_path / "data"
    data.mkdir()
    _write_jsonl(data / "a.jsonl", 9)
    first = tmp_path / "first"
    args = ["--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet"]
    assert main(["clean", str(data), *args[:-2], "--limit", "input_tokens<=6", "--format", "parquet",
                 "--out", str(first), "--quiet"]) in (0, 1)
    first.rename(data / "cleaned")  # a user moves it in (an --out inside the source is refused)
    (data / ".a.jsonl.tmp-1-abc").mkdir()  # hidden folders (a staging folder) are not data either
    _write_jsonl(data / ".a.jsonl.tmp-1-abc" / "x.jsonl", 4)
    with pytest.warns(UserWarning, match="skipped 1 earlier lengthscan output or cache folder"):
        assert main(["audit", str(data), *args, "--out", str(tmp_path / "second")]) == 0
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert report["splits"][0]["sample"]["rows_total"] == 9


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_special_file_as_the_source_is_refused_without_blocking(tmp_path, bpe_dir, capsys):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert main(["audit", str(fifo), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "not a regular file" in err and str(fifo) in err


def test_a_csv_header_alone_is_zero_rows(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.csv").write_text("text,label\n")
    (tmp_path / "b.csv").write_text("text,label\nhello there,1\nsecond row,0\n")
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "*.csv"), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 2
    assert main(["audit", str(tmp_path / "a.csv"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds no rows" in err and "header alone" in err and "Traceback" not in err


def _aiff_with_rate(path, raw: bytes):
    sf.write(path, np.zeros(1600, dtype="float32"), 16000, format="AIFF", subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.index(b"COMM") + 8 + 2 + 4 + 2
    data[at:at + 10] = raw
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("raw,words", [
    (bytes(10), "(0)"),
    (bytes.fromhex("7fffc000000000000000"), "(NaN)"),
    (bytes.fromhex("7fff8000000000000000"), "(inf)"),
    (bytes.fromhex("00000000000000000001"), "(a denormal)"),
    (bytes.fromhex("3fff8000000000000000"), "(1 Hz)"),
])
def test_an_aiff_rate_that_is_no_rate_is_an_unreadable_header(tmp_path, raw, words):
    from lengthscan.measure.audio.durations import FLAG_UNREADABLE, read_info

    good = read_info(str(_aiff_with_rate(tmp_path / "good.aiff", bytes.fromhex("400cfa00000000000000"))))
    assert (good.frames, good.samplerate, good.flag) == (1600, 16000, None)
    info = read_info(str(_aiff_with_rate(tmp_path / "bad.aiff", raw)))
    assert info.flag == FLAG_UNREADABLE and info.seconds is None
    assert "unreadable header" in info.error and words in info.error


@pytest.mark.parametrize("env,why", [({"HF_HUB_OFFLINE": "1"}, "offline mode is on"),
                                     ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "cannot be reached")])
@pytest.mark.parametrize("flag", ["--tokenizer", "--model"])
def test_hub_names_fail_fast_offline(tmp_path, corpus_jsonl, env, why, flag):
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    environ.update(env, HF_HOME=str(tmp_path / "hf"))  # an empty hub cache
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(corpus_jsonl), flag, "someorg/somemodel",
                           "--input", "text", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          env=environ, timeout=120)
    assert time.monotonic() - started < 30
    assert proc.returncode == 2 and why in proc.stderr and "someorg/somemodel" in proc.stderr
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--tokenizer", "--model"])
def test_a_missing_local_path_is_said_as_such(tmp_path, corpus_jsonl, capsys, flag):
    assert main(["audit", str(corpus_jsonl), flag, str(tmp_path / "no-such-dir"), "--input", "text",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no such" in err and "no-such-dir" in err and "Repo id" not in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("kind", ["fifo", "broken_link"])
@pytest.mark.parametrize("how", ["glob", "folder"])
def test_a_special_file_among_the_files_read_is_named_not_skipped(tmp_path, bpe_dir, capsys, kind, how):
    data = tmp_path / "data"
    data.mkdir()
    _write_jsonl(data / "a.jsonl", 3)
    odd = data / "b.jsonl"
    os.mkfifo(odd) if kind == "fifo" else odd.symlink_to(tmp_path / "gone.jsonl")
    source = str(data / "*.jsonl") if how == "glob" else str(data)
    started = time.monotonic()
    assert main(["audit", source, "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert str(odd) in err and {"fifo": "not a regular file", "broken_link": "broken symbolic link"}[kind] in err
