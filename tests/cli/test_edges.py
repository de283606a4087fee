"""Values and inputs checked at the edge, found by an adversarial sweep of the CLI: each is one line
and exit 2 (or a warning and a correct result), never exit 1 or 3, a hang, or a wrong number."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.sources.sampling import SampleError, parse_sample, plan_sample
from tests.support.cli import one_line


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _audit(src, bpe_dir, out, *extra, column="text"):
    return main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", column, "--out", str(out), "--quiet",
                 *extra])


def test_sample_percentages_and_fractions():
    assert parse_sample("100%") == 1.0 and parse_sample("1.0") == 1.0 and parse_sample("50%") == 0.5
    assert parse_sample("1") == 1 and parse_sample("2.0") == 2 and parse_sample("1e3") == 1000
    assert plan_sample(200, sample="100%").indices is None  # every row, not one
    for bad in ("0%", "101%", "2.5", "nan", "inf", "-1", "0", "lots"):
        with pytest.raises(SampleError):
            parse_sample(bad)


@pytest.mark.parametrize("flag,value,words", [("--seed", str(2**32), "between 0 and 4,294,967,295"),
                                              ("--num-proc", "100000", "between 1 and 512"),
                                              ("--sampling-rate", "99999999999999999999", "--sampling-rate")])
def test_numbers_past_their_range(tmp_path, bpe_dir, corpus_jsonl, capsys, flag, value, words):
    assert _audit(corpus_jsonl, bpe_dir, tmp_path / "o", "--sample", "10", flag, value) == 2
    one_line(capsys, words)
    assert not (tmp_path / "o").exists()


def test_a_feature_extractor_rate_that_is_no_rate(tmp_path, bpe_dir, capsys):
    import numpy as np
    import soundfile as sf
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    sf.write(tmp_path / "a.wav", np.zeros(1600, dtype="float32"), 16000)
    (tmp_path / "m.csv").write_text("path,text\na.wav,hello\n")
    for name, rate in (("neg", -8000), ("zero", 0), ("text", "abc")):
        Wav2Vec2Config().save_pretrained(tmp_path / name)
        Wav2Vec2FeatureExtractor(sampling_rate=rate).save_pretrained(tmp_path / name)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text((tmp_path / "zero" / "config.json").read_text())
    (tmp_path / "broken" / "preprocessor_config.json").write_text("{not json")
    for name in ("neg", "zero", "text", "broken"):
        assert main(["audit", str(tmp_path / "m.csv"), "--audio", "path", "--model", str(tmp_path / name),
                     "--out", str(tmp_path / f"o-{name}"), "--quiet", "--no-cache"]) == 2
        one_line(capsys, "preprocessor_config.json")


def test_text_files_that_fail_to_load_name_the_line(tmp_path, bpe_dir, capsys):
    (tmp_path / "a.csv").write_bytes(b"text\nok\nbad \xff here\n")
    assert _audit(tmp_path / "a.csv", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "a.csv: line 3 is not UTF-8")
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": broken\n{"text": "x"}\n')
    assert _audit(tmp_path / "b.jsonl", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "b.jsonl: line 2 is not valid JSON")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.csv").write_text("text\nhello\n")
    (tmp_path / "c" / "b.csv").write_text("other\nx\n")
    assert _audit(tmp_path / "c", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "have different columns", "b.csv has other")


def test_clean_never_publishes_bytes_that_are_not_utf8(tmp_path, bpe_dir, capsys):
    """A JSON Lines file is refused when opened, naming its file and line; a Parquet file whose
    reader lets such bytes through is refused before anything is written, naming its file and row."""
    (tmp_path / "s.jsonl").write_bytes(b'{"text": "ok", "other": "fine"}\n{"text": "fine", "other": "bad \xff"}\n')
    assert main(["clean", str(tmp_path / "s.jsonl"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--limit", "input_tokens<=64", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    one_line(capsys, f"{tmp_path / 's.jsonl'}: line 2 is not UTF-8 text (byte 32 of the line: b'\\xff')")
    pq.write_table(pa.table({"text": ["ok", "fine"], "other": pa.array([b"fine", b"bad \xff"]).view(pa.string())}),
                   tmp_path / "s.parquet")
    assert main(["clean", str(tmp_path / "s.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--limit", "input_tokens<=64", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    one_line(capsys, f"column 'other' holds text that is not UTF-8: row 1 of {tmp_path / 's.parquet'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.parquet"]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_file_of_a_multi_file_source_without_the_column(tmp_path, bpe_dir, capsys, kind):
    data = tmp_path / "d"
    data.mkdir()
    if kind == "jsonl":
        _jsonl(data / "a.jsonl", [{"text": "hello"}] * 3)
        _jsonl(data / "b.jsonl", [{"other": "x"}])
    else:
        pq.write_table(pa.table({"text": ["a b", "c"]}), data / "a.parquet")
        pq.write_table(pa.table({"other": ["x"]}), data / "b.parquet")
    for command in ("audit", "clean"):
        assert main([command, str(data), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                     str(tmp_path / command), "--quiet"]) == 2
        one_line(capsys, f"b.{kind}: no column 'text' for --input; columns are: other")


def test_tokenizer_folders_that_do_not_load_say_why(tmp_path, bpe_dir, corpus_jsonl, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer_config.json").write_text((bpe_dir / "tokenizer_config.json").read_text())
    (tmp_path / "bad" / "tokenizer.json").write_text('{"broken":\n')
    (tmp_path / "lone").mkdir()
    (tmp_path / "lone" / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "lone" / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    cases = [(tmp_path / "empty", "holds no tokenizer files"), (tmp_path / "bad", "tokenizer.json is not valid JSON"),
             (tmp_path / "lone" / "merges.txt", "a .txt file without tokenizer_config.json beside it"),
             (tmp_path / "lone" / "tokenizer.json", "not a tokenizers JSON file")]
    for tok, words in cases:
        assert _audit(corpus_jsonl, tok, tmp_path / "o") == 2
        one_line(capsys, words)


def test_a_tokenizer_json_file_counts_as_its_folder_or_alone(tmp_path, bpe_dir, corpus_jsonl):
    """``--tokenizer path/tokenizer.json``: with tokenizer_config.json beside it, the folder's
    tokenizer; alone, the tokenizers file itself (its post-processor's special tokens counted)."""
    from tokenizers import Tokenizer

    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(bpe_dir / "tokenizer.json", lone / "tokenizer.json")
    got = {}
    for name, tok in (("folder", bpe_dir), ("file", bpe_dir / "tokenizer.json"), ("lone", lone / "tokenizer.json")):
        assert _audit(corpus_jsonl, tok, tmp_path / f"out-{name}", "--full") == 0
        got[name] = pq.read_table(tmp_path / f"out-{name}" / "lengths.parquet").to_pydict()["input_tokens"]
    assert got["folder"] == got["file"]
    backend = Tokenizer.from_file(str(lone / "tokenizer.json"))
    backend.no_truncation()
    backend.no_padding()
    texts = [json.loads(line)["text"] for line in corpus_jsonl.read_text().splitlines()]
    assert len(got["lone"]) == len(texts)
    strings = [i for i, t in enumerate(texts) if isinstance(t, str) and t]
    assert len(strings) > 2000
    assert [got["lone"][i] for i in strings] == [len(backend.encode(texts[i]).ids) for i in strings]


@pytest.mark.slow  # five damaged caches, each an audit
def test_a_damaged_cache_is_ignored_with_a_warning_and_the_numbers_stay_right(tmp_path, bpe_dir, monkeypatch):
    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    src = _jsonl(tmp_path / "s.jsonl", [{"text": f"row {i} " + "word " * i} for i in range(50)])
    args = [str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--json", "--overwrite",
            "--out", str(tmp_path / "o")]
    run = [sys.executable, "-m", "lengthscan", "audit", *args]

    def audit():
        proc = subprocess.run(run, capture_output=True, text=True, env=os.environ | {}, timeout=120)
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


def test_clean_never_turns_a_file_into_its_out(tmp_path, bpe_dir, corpus_jsonl, capsys):
    (tmp_path / "notes.txt").write_text("precious")
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                 str(tmp_path / "notes.txt"), "--overwrite", "--quiet"]) == 2
    one_line(capsys, "exists and is not a directory")
    assert (tmp_path / "notes.txt").read_text() == "precious" and sorted(os.listdir(tmp_path)) == ["notes.txt"]


@pytest.mark.slow  # a process writing into a closed pipe, for each command
@pytest.mark.parametrize("command", ["audit", "clean"])
def test_a_closed_pipe_on_the_summary_exits_0(tmp_path, bpe_dir, corpus_jsonl, command):
    limit = "--limit 'input_tokens<=64'" if command == "clean" else ""
    cmd = (f"{sys.executable} -m lengthscan {command} {corpus_jsonl} --tokenizer {bpe_dir} --input text {limit} "
           f"--out {tmp_path / 'o'} | head -c 1")
    for _ in range(3):  # rich used to exit 1 here, now and then
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; rm -rf {tmp_path / 'o'}; {cmd}"], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


@pytest.mark.slow
def test_a_full_stdout_says_the_outputs_are_written(tmp_path, bpe_dir, corpus_jsonl):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    proc = subprocess.run(f"{sys.executable} -m lengthscan audit {corpus_jsonl} --tokenizer {bpe_dir} --input text "
                          f"--out {tmp_path / 'o'} > /dev/full", shell=True, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "cannot print the summary" in proc.stderr and "are written" in proc.stderr
    assert (tmp_path / "o" / "report.json").exists()


def test_memory_models_that_do_not_load_and_bad_values(tmp_path, capsys, monkeypatch):
    from transformers import GPT2Config

    assert main(["memory", "--model", str(tmp_path / "nope"), "--batch-size", "4", "--input-len", "8"]) == 2
    one_line(capsys, "no such directory or config file")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["memory", "--model", "someorg/somemodel", "--batch-size", "4", "--input-len", "8"]) == 2
    one_line(capsys, "offline mode is on")
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=500).save_pretrained(tmp_path / "gpt2")
    assert main(["memory", "--model", str(tmp_path / "gpt2"), "--batch-size", "0", "--input-len", "8"]) == 2
    one_line(capsys, "--batch-size must be at least 1")


def test_memory_exports_never_land_in_the_source(tmp_path, bpe_dir, capsys):
    from transformers import GPT2Config

    model = tmp_path / "model"
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=3000).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((bpe_dir / name).read_text())
    data = tmp_path / "data"
    data.mkdir()
    _jsonl(data / "a.jsonl", [{"text": f"row {i} " * (i + 1)} for i in range(20)])
    base = ["memory", str(data), "--model", str(model), "--input", "text", "--batch-size", "4"]
    assert main([*base, "--export-worst-batch", str(data / "worst")]) == 2
    one_line(capsys, "--export-worst-batch", "lies inside the source path")
    assert main([*base, "--pad-to-multiple-of", "-7"]) == 2
    one_line(capsys, "--pad-to-multiple-of -7")
    assert sorted(os.listdir(data)) == ["a.jsonl"]


def test_an_unreachable_ray_address_fails_in_seconds():
    from lengthscan.engines.ray.session import EngineError, check_reachable

    for address, words in (("garbage.invalid:1", "no Ray cluster answers"), ("127.0.0.1:1", "no Ray cluster answers"),
                           ("nonsense", "give HOST:PORT")):
        started = time.monotonic()
        with pytest.raises(EngineError, match=words):
            check_reachable(address)
        assert time.monotonic() - started < 15
    check_reachable(None)
    check_reachable("auto")


def test_a_zero_row_parquet_is_refused_like_an_empty_file(tmp_path, bpe_dir, capsys):
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    for command in ("audit", "clean"):
        assert main([command, str(tmp_path / "zero.parquet"), "--tokenizer", str(bpe_dir), "--input", "text",
                     "--out", str(tmp_path / command), "--quiet"]) == 2
        one_line(capsys, "holds no rows")


def test_date_like_strings_in_json_lines_stay_text(tmp_path, bpe_dir):
    from transformers import AutoTokenizer

    src = _jsonl(tmp_path / "d.jsonl", [{"text": "2024-01-01"}, {"text": "2024-01-02T10:00:00"}])
    assert main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", "input_tokens<=99",
                 "--out", str(tmp_path / "o"), "--quiet", "--no-cache", "--no-decide-only"]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(str(tmp_path / "o" / "dataset"))
    tok = AutoTokenizer.from_pretrained(bpe_dir)
    assert kept["text"] == ["2024-01-01", "2024-01-02T10:00:00"]
    assert kept["length"] == [len(tok(t)["input_ids"]) for t in kept["text"]]


def test_a_loop_of_links_as_the_source(tmp_path, bpe_dir, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert _audit(tmp_path / "a", bpe_dir, tmp_path / "o") == 2
    one_line(capsys, "a symbolic link that leads nowhere")


@pytest.mark.parametrize("argv,words", [
    (["--limit", "input_tokens<=-5"], "below 0"),
    (["--length-column", ""], "--length-column ''"),
])
def test_clean_values_that_mean_nothing(tmp_path, bpe_dir, corpus_jsonl, capsys, argv, words):
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                 str(tmp_path / "o"), "--quiet", *(["--limit", "input_tokens<=64"] if "--limit" not in argv else []),
                 *argv]) == 2
    one_line(capsys, words)


def test_memory_sizes_and_shapes_past_sense(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=500).save_pretrained(tmp_path / "gpt2")
    base = ["memory", "--model", str(tmp_path / "gpt2"), "--input-len", "8"]
    assert main([*base, "--batch-size", "4", "--budget", "0"]) == 2
    one_line(capsys, "--budget 0")
    assert main([*base, "--batch-size", str(10**20)]) == 2
    one_line(capsys, "--batch-size", "not a training batch")


def test_a_dead_runs_staging_folder_is_swept_by_the_next_run(tmp_path, bpe_dir, corpus_jsonl):
    out = tmp_path / "o"
    (tmp_path / f".o.tmp-{os.getpid()}-deadbeef").mkdir()  # even a live pid: under the lock it is a leftover
    (tmp_path / ".o.old-cafe").mkdir()
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out", str(out),
                 "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["o"]


def test_a_manifests_audio_paths_stay_usable_after_clean(tmp_path, bpe_dir):
    import numpy as np
    import soundfile as sf

    data = tmp_path / "data"
    data.mkdir()
    sf.write(data / "a.wav", np.zeros(32000, dtype="float32"), 16000)
    sf.write(data / "long.wav", np.zeros(16000 * 40, dtype="float32"), 16000)
    _jsonl(data / "m.jsonl", [{"audio_filepath": "a.wav", "text": "hi", "duration": 2.0},
                              {"audio_filepath": "long.wav", "text": "long", "duration": 40.0}])
    with pytest.warns(UserWarning, match="--embed-audio embeds Audio columns"):
        assert main(["clean", str(data / "m.jsonl"), "--audio", "audio_filepath", "--sampling-rate", "16000",
                     "--limit", "input_seconds<=30", "--crop-audio", "--embed-audio", "--out", str(tmp_path / "o"),
                     "--quiet"]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(str(tmp_path / "o" / "dataset"))
    assert all(os.path.isabs(p) and os.path.exists(p) for p in kept["audio_filepath"])
    assert kept["duration"] == [2.0, 30.0] and sf.info(kept["audio_filepath"][1]).duration == 30.0


def test_a_template_that_loops_is_a_rows_error_then_stops_the_run(tmp_path, chat_tok_dir, capsys, monkeypatch):
    from lengthscan.measure.chat import template

    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    slow = tmp_path / "slow.jinja"
    slow.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{% if messages|length > 1 %}"
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}")
    rows = [{"messages": [{"role": "user", "content": "hi"}]}] * 3 + \
           [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    src = _jsonl(tmp_path / "c.jsonl", rows)
    args = ["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--chat-template",
            str(slow), "--full", "--quiet", "--no-cache"]
    started = time.monotonic()
    assert main([*args, "--json", "--out", str(tmp_path / "o1")]) == 0  # one slow row: its own reason
    chat = json.loads(capsys.readouterr().out)["splits"][0]["roles"]
    assert "template_error" in json.dumps(chat)
    src = _jsonl(tmp_path / "c.jsonl", rows[-1:] * 4)
    assert main([*args, "--out", str(tmp_path / "o2")]) == 2  # slow on row after row: the run stops
    one_line(capsys, "the chat template ran past 0.3 s on 3 rows")
    assert time.monotonic() - started < 20
