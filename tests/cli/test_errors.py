"""The error model at the command line: a bad source or a dangerous --out is one line and exit 2
(naming the file or row), an unexpected error exit 3 with its traceback in a file (never 1, the
gate's), a closed pipe a quiet exit; and nothing of the source is ever lost."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_out_never_is_contains_or_lies_in_the_source(tmp_path, bpe_dir, capsys, where):
    data = tmp_path / "data"
    data.mkdir()
    src = _write_jsonl(data / "s.jsonl", [{"text": f"row {i}"} for i in range(20)])
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


def test_corrupt_parquet_and_non_utf8_exit_2_naming_them(tmp_path, bpe_dir, capsys):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": [f"hello world {i} " * 20 for i in range(2000)]}), path, row_group_size=500,
                   compression="snappy")
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 300] = b"\xab" * 300
    path.write_bytes(bytes(data))
    assert main(["audit", str(path), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}" in err and "unreadable" in err and "Traceback" not in err
    lines = tmp_path / "latin1.jsonl"
    lines.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    assert main(["audit", str(lines), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--no-cache",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{lines}: line 2 is not UTF-8 text" in err


def test_an_internal_error_exits_3_with_its_traceback_in_a_file(capsys):
    from lengthscan.cli.main import _internal_error

    try:
        raise RuntimeError("something broke\nsecond line")
    except RuntimeError as exc:
        code = _internal_error(exc)
    err = capsys.readouterr().err
    assert code == 3 and "internal error: RuntimeError: something broke" in err and "second line" not in err
    path = err.split("the traceback is in ")[1].split(";")[0]
    with open(path, encoding="utf-8") as fh:
        assert "Traceback" in fh.read()


@pytest.mark.slow
def test_a_closed_pipe_exits_quietly(tmp_path, bpe_dir, corpus_jsonl):
    cmd = (f"{sys.executable} -m lengthscan audit {corpus_jsonl} --tokenizer {bpe_dir} --input text --json "
           f"--out {tmp_path / 'o'} | head -c 10")
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True)
    assert proc.stdout == '{\n  "schema'[:10]
    assert proc.returncode == 0 and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag,value", [("--seed", "-1"), ("--max-chars", "0"), ("--num-proc", "0"),
                                        ("--sampling-rate", "0"), ("--limit", "input_tokens<=1e999"),
                                        ("--limit", "input_tokens<=z1e999")])
def test_values_are_checked_at_the_edge(tmp_path, bpe_dir, corpus_jsonl, capsys, flag, value):
    code = main(["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", flag, value,
                 "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("lengthscan: error:") and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_row_without_the_measurement_never_passes_a_limit_on_it(tmp_path, bpe_dir):
    """Every metric: a row that lacks it is dropped by an upper and by a lower limit on it."""
    import pyarrow.parquet as pq

    src = _write_jsonl(tmp_path / "s.jsonl", [{"text": "a short text", "summary": "sum"},
                                               {"text": "x" * 50, "summary": None}, {"text": None, "summary": "s"}])
    for rule in ("input_tokens<=100000", "input_tokens>=0", "target_tokens<=100000", "target_tokens>=0",
                 "target_tokens/input_tokens<=1000"):
        out = tmp_path / rule.replace("/", "_").replace("<", "l").replace(">", "g").replace("=", "e")
        assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary",
                     "--full", "--no-cache", "--limit", rule, "--out", str(out), "--quiet"]) == 0
        t = pq.read_table(out / "lengths.parquet").to_pydict()
        lacking = [i for i in range(3) if any(t[m][i] is None for m in rule.split("<")[0].split(">")[0].split("/"))]
        assert lacking and all(t["decision"][i] == "drop" for i in lacking), (rule, t["decision"])
        assert all(any(r.startswith(rule) for r in t["reasons"][i]) for i in lacking), (rule, t["reasons"])
        assert t["decision"][0] == "keep"


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs on this platform")
def test_special_files_in_an_audio_column_are_per_row_reasons(tmp_path):
    """A FIFO named where audio was expected is flagged without opening it for reading (which would
    block forever); the other rows are measured."""
    import os

    import numpy as np
    import soundfile as sf

    sf.write(tmp_path / "ok.wav", np.zeros(16000, np.float32), 16000)
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "m.csv").write_text("path,text\nok.wav,a\npipe.wav,b\n")
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(tmp_path / "m.csv"), "--audio", "path",
                           "--full", "--no-cache", "--quiet", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    t = pq.read_table(tmp_path / "o" / "lengths.parquet").to_pydict()
    assert t["input_seconds"] == [1.0, None]
    assert t["input_flag"] == [None, "unreadable"] and "not a regular file" in t["input_error"][1]


def test_empty_files_are_zero_rows_and_the_report_path_is_said(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("\n  \n")
    _write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": "two"}])
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "*.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text", "--full",
                 "--no-cache", "--out", str(out)]) == 0
    err = capsys.readouterr()
    assert f"{out.resolve()}/lengths.parquet" in (err.out + err.err).replace("\n", "")
    assert json.loads((out / "report.json").read_text())["splits"][0]["sample"]["rows_total"] == 2
    assert main(["audit", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    assert "holds no rows" in capsys.readouterr().err


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


def _lacking_rows_fail(tmp_path, args: list, rules: tuple, n_rows: int, good: int = 0):
    """Each rule (an upper and a lower limit on every metric) drops exactly the rows lacking its
    metric, with the rule as the reason; the row that has it is kept."""
    import pyarrow.parquet as pq

    for k, rule in enumerate(rules):
        out = tmp_path / f"o{k}"
        assert main(["audit", *args, "--full", "--no-cache", "--limit", rule, "--out", str(out), "--quiet"]) == 0
        t = pq.read_table(out / "lengths.parquet").to_pydict()
        metrics = rule.split("<")[0].split(">")[0].split("/")
        lacking = [i for i in range(n_rows) if any(t[m][i] is None for m in metrics)]
        assert lacking and all(t["decision"][i] == "drop" for i in lacking), (rule, t["decision"])
        assert all(any(r.startswith(rule) for r in t["reasons"][i]) for i in lacking), (rule, t["reasons"])
        assert t["decision"][good] == "keep", (rule, t["decision"], t["reasons"])


def test_a_row_without_an_audio_measurement_never_passes_a_limit_on_it(tmp_path, bpe_dir):
    import numpy as np
    import soundfile as sf
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    model = tmp_path / "w2v"
    Wav2Vec2Config().save_pretrained(model)
    Wav2Vec2FeatureExtractor(sampling_rate=16000).save_pretrained(model)
    sf.write(tmp_path / "a.wav", np.zeros(16000, dtype="float32"), 16000)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not audio at all")
    (tmp_path / "m.csv").write_text("path,text\na.wav,hello there\nmissing.wav,gone\nbad.wav,broken\n")
    metrics = ("input_seconds", "input_samples", "input_frames", "target_tokens/input_seconds")
    rules = tuple(r for m in metrics for r in (f"{m}<=1000000000", f"{m}>=0"))
    _lacking_rows_fail(tmp_path, [str(tmp_path / "m.csv"), "--audio", "path", "--target", "text", "--model",
                                  str(model), "--tokenizer", str(bpe_dir)], rules, 3)


@pytest.mark.slow
def test_a_row_without_a_conversation_measurement_never_passes_a_limit_on_it(tmp_path, chat_tok_dir):
    from lengthscan.measure.chat.metrics import CHAT_METRICS

    rows = [{"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]},
            {"messages": None}, {"messages": [{"role": "user"}]}]
    src = _write_jsonl(tmp_path / "c.jsonl", rows)
    rules = tuple(f"{m}{op}{v}" for m in CHAT_METRICS for op, v in (("<=", "1000000"), (">=", "0")))
    from tests.support.chat import trl_template

    _lacking_rows_fail(tmp_path, [str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir),
                                  "--chat-template", str(trl_template("qwen3"))], rules, 3)


@pytest.mark.parametrize("rule,words", [
    ("sequence_token<=2048", "unknown metric sequence_token; did you mean sequence_tokens?"),
    ("input_token<=512", "unknown metric input_token; did you mean input_tokens?"),
    ("target_tokens/input_second<=20", "unknown metric input_second; did you mean input_seconds?"),
    ("input_tokens<=512:trunc", "unknown action trunc; did you mean truncate?"),
    ("wordcount<=512", "unknown metric wordcount; metrics: input_tokens, target_tokens"),  # nothing close
])
def test_a_mistyped_metric_or_action_names_the_closest(tmp_path, bpe_dir, capsys, rule, words):
    from tests.support.cli import one_line

    src = _write_jsonl(tmp_path / "s.jsonl", [{"text": "a row"}])
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", rule, "--quiet"]) == 2
    one_line(capsys, words)


def _typo_source(tmp_path):
    return _write_jsonl(tmp_path / "s.jsonl", [{"document": "a text", "summary": "short", "audio": "a.wav",
                                               "messages": [{"role": "user", "content": "hi"}], "Tools": []}])


@pytest.mark.parametrize("args,words", [
    (["--input", "documnet"], "no column 'documnet' for --input; did you mean 'document'?"),
    (["--input", "document", "--target", "sumary"], "for --target; did you mean 'summary'?"),
    (["--audio", "audoi"], "no column 'audoi' for --audio; did you mean 'audio'?"),
    (["--input", "document", "--id", "sumary"], "for --id; did you mean 'summary'?"),
    (["--input", "txt"], "no column 'txt' for --input; columns are: document, summary"),  # nothing close
])
def test_a_mistyped_column_names_the_closest(tmp_path, bpe_dir, capsys, args, words):
    from tests.support.cli import one_line

    args = [*args, "--tokenizer", str(bpe_dir)] if "--audio" not in args else args
    assert main(["audit", str(_typo_source(tmp_path)), *args, "--quiet"]) == 2
    one_line(capsys, words, "columns are: document, summary, audio, messages, Tools")


@pytest.mark.slow  # a chat template, twice
def test_a_mistyped_conversation_column_names_the_closest(tmp_path, chat_tok_dir, capsys):
    from tests.support.chat import trl_template
    from tests.support.cli import one_line

    chat = ["--tokenizer", str(chat_tok_dir), "--chat-template", str(trl_template("qwen2_5")), "--quiet"]
    for args, words in [(["--messages", "mesages"], "no column 'mesages' for --messages; did you mean 'messages'?"),
                        (["--messages", "messages", "--tools", "tools"], "for --tools; did you mean 'Tools'?")]:
        assert main(["audit", str(_typo_source(tmp_path)), *args, *chat]) == 2
        one_line(capsys, words, "columns are: document, summary, audio, messages, Tools")


@pytest.mark.slow  # a vision processor
def test_a_mistyped_images_column_names_the_closest(tmp_path, train_texts, capsys):
    from tests.support.cli import one_line
    from tests.support.vision import template_of, vision_dir

    folder = vision_dir(tmp_path / "qwen2_vl", "qwen2_vl", train_texts[:400])
    src = _write_jsonl(tmp_path / "s.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "images": []}])
    assert main(["audit", str(src), "--messages", "messages", "--images", "imags", "--tokenizer", str(folder),
                 "--processor", str(folder), "--chat-template", str(template_of("qwen2_vl")), "--quiet"]) == 2
    one_line(capsys, "no column 'imags' for --images; did you mean 'images'?")
