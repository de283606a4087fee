"""Audio that cannot be measured is a per-row reason, never a stopped run or noise on the terminal:
native decoders' notes stay off stderr, an AIFF sample rate that is no rate is an unreadable header,
and a FIFO in an audio column is flagged without being opened."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.factories import silent_wav
from tests.support.audio_files import write_audio
from tests.support.cli import in_process


def test_native_decoder_notes_stay_off_the_terminal(tmp_path, capfd, recwarn):
    """What libsndfile's MP3 decoder writes to file descriptor 2 (capfd sees it, as a terminal would), and
    any warning lengthscan or a library gives, stay off stderr."""
    good = write_audio(tmp_path / "good.mp3", 48000, 16000, format="MP3", subtype="MPEG_LAYER_III")
    data = good.read_bytes()
    (tmp_path / "junk.mp3").write_bytes(data[:2000] + b"\x00garbage" * 50 + data[2000:])
    (tmp_path / "m.csv").write_text("path,text\ngood.mp3,a\njunk.mp3,b\n")
    proc = in_process(capfd, "audit", tmp_path / "m.csv", "--audio", "path", "--sampling-rate", 16000, "--out",
                      tmp_path / "o", "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    shown = [w for w in recwarn if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert shown == [], [str(w.message) for w in shown]  # in a process of its own, these would be on stderr
    assert pq.read_table(tmp_path / "o" / "lengths.parquet").num_rows == 2


def _aiff_with_rate(path, raw: bytes):
    silent_wav(path, 1600, format="AIFF", subtype="PCM_16")
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


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs on this platform")
def test_special_files_in_an_audio_column_are_per_row_reasons(tmp_path):
    """A FIFO named where audio was expected is flagged without opening it for reading (which would
    block forever); the other rows are measured."""


    silent_wav(tmp_path / "ok.wav", 16000)
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "m.csv").write_text("path,text\nok.wav,a\npipe.wav,b\n")
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(tmp_path / "m.csv"), "--audio", "path",
                           "--full", "--no-cache", "--quiet", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    t = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pydict()
    assert t["input_seconds"] == [1.0, None]
    assert t["input_flag"] == [None, "unreadable"] and "not a regular file" in t["input_error"][1]
