"""Flag values checked at the edge of the CLI: numbers past their range, values that mean nothing,
mistyped metrics, actions and columns (naming the closest), sampling flags clean does not take, and
a crop the data cannot have. Each is one line and exit 2, never exit 1 or 3 or a wrong number."""

from __future__ import annotations

import json
import re
import time

import pytest

from lengthscan.cli.main import build_parser, main
from lengthscan.sources.sampling import SampleError, parse_sample, plan_sample
from tests.factories import write_jsonl
from tests.support.chat import trl_template
from tests.support.cli import audit, one_line


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
    assert audit(corpus_jsonl, bpe_dir, tmp_path / "o", "--sample", "10", flag, value) == 2
    one_line(capsys, words)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,words", [
    (["--limit", "input_tokens<=-5"], "below 0"),
    (["--length-column", ""], "--length-column ''"),
])
def test_clean_values_that_mean_nothing(tmp_path, bpe_dir, corpus_jsonl, capsys, argv, words):
    assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--out",
                 str(tmp_path / "o"), "--quiet", *(["--limit", "input_tokens<=64"] if "--limit" not in argv else []),
                 *argv]) == 2
    one_line(capsys, words)


@pytest.mark.parametrize("flag,value", [("--seed", "-1"), ("--max-chars", "0"), ("--num-proc", "0"),
                                        ("--sampling-rate", "0"), ("--limit", "input_tokens<=1e999"),
                                        ("--limit", "input_tokens<=z1e999")])
def test_values_are_checked_at_the_edge(tmp_path, bpe_dir, corpus_jsonl, capsys, flag, value):
    code = main(["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", flag, value,
                 "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("lengthscan: error:") and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rule,words", [
    ("sequence_token<=2048", "unknown metric sequence_token; did you mean sequence_tokens?"),
    ("input_token<=512", "unknown metric input_token; did you mean input_tokens?"),
    ("target_tokens/input_second<=20", "unknown metric input_second; did you mean input_seconds?"),
    ("input_tokens<=512:trunc", "unknown action trunc; did you mean truncate?"),
    ("wordcount<=512", "unknown metric wordcount; metrics: input_tokens, target_tokens"),  # nothing close
])
def test_a_mistyped_metric_or_action_names_the_closest(tmp_path, bpe_dir, capsys, rule, words):
    from tests.support.cli import one_line

    src = write_jsonl(tmp_path / "s.jsonl", [{"text": "a row"}])
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--limit", rule, "--quiet"]) == 2
    one_line(capsys, words)


def _typo_source(tmp_path):
    return write_jsonl(tmp_path / "s.jsonl", [{"document": "a text", "summary": "short", "audio": "a.wav",
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
    from tests.support.cli import one_line

    chat = ["--tokenizer", str(chat_tok_dir), "--chat-template", str(trl_template("qwen2_5")), "--quiet"]
    for args, words in [(["--messages", "mesages"], "no column 'mesages' for --messages; did you mean 'messages'?"),
                        (["--messages", "messages", "--tools", "tools"], "for --tools; did you mean 'Tools'?")]:
        assert main(["audit", str(_typo_source(tmp_path)), *args, *chat]) == 2
        one_line(capsys, words, "columns are: document, summary, audio, messages, Tools")


@pytest.mark.slow  # a vision processor
def test_a_mistyped_images_column_names_the_closest(tmp_path, qwen2_vl_dir, capsys):
    from tests.support.cli import one_line
    from tests.support.vision import template_of

    folder = qwen2_vl_dir
    src = write_jsonl(tmp_path / "s.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "images": []}])
    assert main(["audit", str(src), "--messages", "messages", "--images", "imags", "--tokenizer", str(folder),
                 "--processor", str(folder), "--chat-template", str(template_of("qwen2_vl")), "--quiet"]) == 2
    one_line(capsys, "no column 'imags' for --images; did you mean 'images'?")


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command].format_help()


def test_clean_offers_no_sampling_flags_and_refuses_them(tmp_path, corpus_jsonl, bpe_dir, capsys):
    text = _help("clean")
    for flag in ("--sample ", "--sample-unit", "--full", "--seed"):
        assert flag not in text
        assert flag.strip() in _help("audit")
    for flags in (["--seed", "3"], ["--sample", "10"], ["--full"]):
        capsys.readouterr()
        assert main(["clean", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--limit",
                     "input_tokens<=64", "--out", str(tmp_path / "o"), *flags]) == 2
        one_line(capsys, "clean always decides on every row", flags[0])
        assert not (tmp_path / "o").exists()
    assert "sequence_tokens for conversations" in " ".join(text.split())


def test_cropping_a_transcribed_clip_is_refused_without_invented_figures(tmp_path, bpe_dir, capsys):
    from tests.support import audio_files as af

    af.write_audio(tmp_path / "long.wav", 8000 * 12, 8000)
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": "long.wav", "transcript": "a talk"}) + "\n")
    assert main(["clean", str(tmp_path / "m.jsonl"), "--audio", "path", "--target", "transcript", "--tokenizer",
                 str(bpe_dir), "--limit", "input_seconds<=5", "--crop-audio", "--out", str(tmp_path / "o")]) == 2
    err = one_line(capsys, "--target-is-label", "'input_seconds<=5'")
    # the data has a 12 s clip and a 5 s limit: no other duration is named
    assert set(re.findall(r"(\d+) s\b", err)) <= {"5", "12"}, err


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
