"""Sentences that must be true where the user reads them: the footer of report.html says what of the
data's own rows the page shows; a truncated audio file is measured (by the audio it holds), not a
row "without a length"."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import soundfile as sf

from lengthscan.cli.main import main
from tests.support import audio_files as af
from tests.support.pages import footer_text, tables, visible_text


def test_the_footer_says_what_of_the_rows_the_page_shows(tmp_path, corpus_jsonl, bpe_dir):
    from lengthscan.report.html import render_html

    src = tmp_path / "small.jsonl"
    src.write_text("".join(line + "\n" for line in corpus_jsonl.read_text().splitlines()[:40]))
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--out", str(out), "--quiet", "--no-cache"]) == 0
    html = (out / "report.html").read_text()
    data = json.loads((out / "report.json").read_text())
    # the longest rows' previews are the data's own text: the footer says so, and how to leave it out
    first = data["longest_rows"][0]["preview"]["text"].splitlines()[0]
    assert " ".join(first.split())[:40] in visible_text(html, "worst")
    footer = footer_text(html)
    assert "no raw rows" not in footer
    assert "the worst rows show text from the data's own rows (--redact leaves them out)" in footer
    redacted = render_html(data, redact=True)  # what --redact writes
    assert "redacted (--redact)" in footer_text(redacted) and "no previews of rows" in footer_text(redacted)
    assert " ".join(first.split())[:40] not in visible_text(redacted)


def test_audio_paths_shown_are_said(tmp_path):
    af.write_audio(tmp_path / "a.wav", 16000, 16000)
    (tmp_path / "m.csv").write_text("path\na.wav\n")
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "m.csv"), "--audio", "path", "--out", str(out), "--quiet"]) == 0
    html = (out / "report.html").read_text()
    assert "a.wav" in visible_text(html, "worst")
    assert "the worst rows show audio paths from the data's own rows" in footer_text(html)


def test_a_truncated_wav_has_its_length(tmp_path, capsys):
    """A WAV cut short (soundfile writes it, its bytes are cut): measured by the frames it holds, as
    libsndfile reads them, and said so; only the missing file is a row without a length."""
    af.write_audio(tmp_path / "whole.wav", int(16000 * 4.14), 16000)
    af.truncate(tmp_path / "whole.wav", tmp_path / "cut.wav", 0.5)
    af.write_audio(tmp_path / "ok.wav", 16000, 16000)
    frames = sf.info(tmp_path / "cut.wav").frames  # libsndfile: the frames the data chunk really holds
    with sf.SoundFile(tmp_path / "cut.wav") as f:
        assert len(f.read()) == frames
    seconds = frames / 16000
    paths = ("ok.wav", "cut.wav", "gone.wav")
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "m.jsonl"), "--audio", "path", "--sampling-rate", "16000", "--out",
                 str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    said = f"1 input file is truncated (the header promises more audio than the file holds): measured by the " \
           f"audio it holds (row 1: {seconds:.2f} s)"
    assert said in terminal and "1 input row has no length (1 missing file)" in terminal
    assert "2 input rows have no length" not in terminal
    html = (out / "report.html").read_text()
    assert said in visible_text(html, "findings")
    stats = tables(html, "split-1")[0]
    row = dict(zip(stats[0], stats[1]))
    assert row["rows"] == "3" and row["missing"] == "1"  # only the missing file lacks a length
    roles = json.loads((out / "report.json").read_text())["splits"][0]["roles"]["input"]
    assert roles["truncated_rows"][0]["row"] == 1 and abs(roles["truncated_rows"][0]["value"] - seconds) < 1e-6
    # crop-mode clean keeps it, at that length
    cleaned = tmp_path / "c"
    assert main(["clean", str(tmp_path / "m.jsonl"), "--audio", "path", "--sampling-rate", "16000", "--limit",
                 "input_seconds<=3", "--crop-audio", "--out", str(cleaned), "--quiet"]) == 0
    t = pq.read_table(cleaned / "lengths.parquet").sort_by("row").to_pydict()
    assert t["decision"][1] == "keep" and abs(t["input_seconds"][1] - seconds) < 1e-6
