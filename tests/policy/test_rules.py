"""Limit rules and the decision table (pure: no tokenizer needed)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthscan.cli.main import main
from lengthscan.measure.records import FLAG_MISSING, FLAG_OK, FLAG_TOO_LONG, FLAG_UNREADABLE
from lengthscan.policy.rules import (
    DROP,
    KEEP,
    TRUNCATE,
    RuleError,
    decide,
    metric_values,
    parse_rule,
    resolve_rules,
)
from lengthscan.stats.histograms import Histogram
from tests.factories import silent_wav, write_jsonl


@pytest.mark.parametrize("text, metric, op, value, action", [
    ("input_tokens<=1024", "input_tokens", "<=", "1024", None),
    (" target_tokens <= p99.9 : truncate ", "target_tokens", "<=", "p99.9", "truncate"),
    ("target_tokens/input_seconds<=z4", "target_tokens/input_seconds", "<=", "z4", None),
    ("input_seconds>=0.5", "input_seconds", ">=", "0.5", None),
    ("input_frames<model", "input_frames", "<", "model", None),
    ("input_tokens>2:drop", "input_tokens", ">", "2", "drop"),
])
def test_parse(text, metric, op, value, action):
    r = parse_rule(text)
    assert (r.metric, r.op, r.value, r.action) == (metric, op, value, action)


@pytest.mark.parametrize("bad", [
    "", "input_tokens", "input_tokens=<5", "input_words<=5", "input_tokens<=five", "input_tokens<=p101",
    "input_tokens<=p0", "input_tokens<=5:crop", "input_tokens>=5:truncate", "input_seconds<=30:truncate",
    "target_tokens/input_seconds<=9:truncate", "target_tokens<=z3:truncate", "target_tokens/input_tokens<=model",
])
def test_malformed_rules_show_the_accepted_forms(bad):
    with pytest.raises(RuleError) as info:
        parse_rule(bad)
    assert bad.strip() in str(info.value) or "truncate applies" in str(info.value)


def test_percentile_and_z_resolution_are_exact():
    rng = np.random.default_rng(0)
    values = np.rint(rng.lognormal(4, 1, 5000)).astype(np.int64)
    hist = Histogram.of(values)
    (p99, z3) = resolve_rules([parse_rule("input_tokens<=p99"), parse_rule("input_tokens<=z3")],
                              histograms={"input_tokens": (hist, 1)})
    assert p99.threshold == np.percentile(values, 99, method="inverted_cdf")
    med = np.percentile(values, 50, method="inverted_cdf")
    mad = np.percentile(np.abs(values - med), 50, method="inverted_cdf")
    assert z3.threshold == pytest.approx(med + 3 * 1.4826 * mad)
    assert "median" in z3.origin and "train" in z3.origin
    (lower,) = resolve_rules([parse_rule("input_tokens>=z3")], histograms={"input_tokens": (hist, 1)})
    assert lower.threshold == pytest.approx(med - 3 * 1.4826 * mad)


def test_seconds_percentiles_are_in_seconds():
    hist = Histogram.of([1000, 2500, 30000])  # milliseconds
    (r,) = resolve_rules([parse_rule("input_seconds<=p50")], histograms={"input_seconds": (hist, 1000)})
    assert r.threshold == 2.5


def test_model_rules_need_a_model_limit():
    from lengthscan.policy.model_limits import ModelLimit, ModelLimits

    limits = ModelLimits("m", "bart", "encoder-decoder", (ModelLimit("input_tokens", 1024, "config"),), (), None)
    (r,) = resolve_rules([parse_rule("input_tokens<=model")], histograms={}, model_limits=limits)
    assert r.threshold == 1024 and "config" in r.origin
    with pytest.raises(RuleError, match="no --model"):
        resolve_rules([parse_rule("input_tokens<=model")], histograms={})
    with pytest.raises(RuleError, match="no target_tokens limit"):
        resolve_rules([parse_rule("target_tokens<=model")], histograms={}, model_limits=limits)


def _flags(n, **codes):
    out = {role: np.full(n, FLAG_OK, np.int8) for role in ("input", "target")}
    for key, (role, code) in codes.items():
        out[role][int(key[1:])] = code
    return out


def test_decision_table():
    x = np.asarray([10, 2000, 10, 10, -1, 10, 3000, -1])
    y = np.asarray([5, 5, 2, 500, 5, -1, 5, 5])
    flags = _flags(8, r4=("input", FLAG_MISSING), r5=("target", FLAG_MISSING), r7=("input", FLAG_TOO_LONG))
    rules = resolve_rules([parse_rule("input_tokens<=1024:truncate"), parse_rule("target_tokens<=64"),
                           parse_rule("input_tokens>=5")], histograms={})
    d = decide({"input_tokens": x, "target_tokens": y}, flags, rules, special={"input": 2, "target": 2})
    assert d.names() == ["keep", "truncate", "drop", "drop", "drop", "drop", "truncate", "drop"]
    assert d.reason == [None, "input_tokens<=1024:truncate", "empty_target", "target_tokens<=64", "input_missing",
                        "target_missing", "input_tokens<=1024:truncate", "input_too_long"]
    assert d.truncate_to["input"].tolist() == [-1, 1024, -1, -1, -1, -1, 1024, -1]
    keep_empty = decide({"input_tokens": x, "target_tokens": y}, flags, rules, special={"input": 2, "target": 2},
                        keep_empty_targets=True)
    assert keep_empty.names()[2] == "keep"


def test_drop_wins_and_reasons_list_every_failure():
    x, y = np.asarray([2000]), np.asarray([900])
    rules = resolve_rules([parse_rule("input_tokens<=1024:truncate"), parse_rule("target_tokens<=64"),
                           parse_rule("target_tokens/input_tokens<=0.3")], histograms={})
    d = decide({"input_tokens": x, "target_tokens": y}, _flags(1), rules, special={"input": 2, "target": 2})
    assert d.names() == ["drop"] and d.reason == ["target_tokens<=64"]
    assert d.reasons == [["input_tokens<=1024:truncate", "target_tokens<=64", "target_tokens/input_tokens<=0.3"]]
    assert d.truncate_to["input"].tolist() == [-1]


def test_truncate_below_special_tokens_drops_and_strict_limits():
    rules = resolve_rules([parse_rule("target_tokens<2:truncate")], histograms={})
    d = decide({"target_tokens": np.asarray([5])}, {"target": np.zeros(1, np.int8)}, rules,
               special={"target": 2})
    assert d.names() == ["drop"] and "special tokens" in d.reason[0]
    rules = resolve_rules([parse_rule("target_tokens<10.5:truncate")], histograms={})
    d = decide({"target_tokens": np.asarray([20])}, {"target": np.zeros(1, np.int8)}, rules, special={"target": 2})
    assert d.truncate_to["target"].tolist() == [10]


def test_audio_limits_drop_unless_cropping():
    seconds = np.asarray([5.0, 31.0, np.nan])
    flags = {"input": np.asarray([FLAG_OK, FLAG_OK, FLAG_UNREADABLE], np.int8)}
    rules = resolve_rules([parse_rule("input_seconds<=30")], histograms={}, default_action="truncate")
    d = decide({"input_seconds": seconds}, flags, rules, special={})
    assert d.names() == ["keep", "drop", "drop"] and d.reason[2] == "input_unreadable"
    rules = resolve_rules([parse_rule("input_seconds<=30")], histograms={}, crop_audio=True)
    d = decide({"input_seconds": seconds}, flags, rules, special={})
    assert d.names() == ["keep", "truncate", "drop"] and d.crop_seconds[1] == 30


def test_ratios():
    v = metric_values("target_tokens/input_seconds", {"target_tokens": np.asarray([10, 0, 5, -1]),
                                                      "input_seconds": np.asarray([2.0, 0.0, 0.0, 1.0])})
    assert v[0] == 5 and np.isnan(v[1]) and v[2] == np.inf and np.isnan(v[3])


@given(st.lists(st.tuples(st.integers(-1, 3000), st.integers(-1, 300)), min_size=1, max_size=60),
       st.sampled_from(["drop", "truncate"]), st.integers(3, 2000), st.integers(3, 200))
@settings(max_examples=150, deadline=None)
def test_every_row_gets_exactly_one_consistent_decision(rows, action, lx, ly):
    x = np.asarray([r[0] for r in rows])
    y = np.asarray([r[1] for r in rows])
    flags = {"input": np.where(x < 0, FLAG_MISSING, FLAG_OK).astype(np.int8),
             "target": np.where(y < 0, FLAG_MISSING, FLAG_OK).astype(np.int8)}
    rules = resolve_rules([parse_rule(f"input_tokens<={lx}"), parse_rule(f"target_tokens<={ly}")], histograms={},
                          default_action=action)
    d = decide({"input_tokens": x, "target_tokens": y}, flags, rules, special={"input": 2, "target": 2})
    assert len(d.decision) == len(rows) and set(d.decision.tolist()) <= {KEEP, TRUNCATE, DROP}
    for i in range(len(rows)):
        over = (x[i] > lx) or (y[i] > ly)
        broken = x[i] < 0 or y[i] < 0 or 0 <= y[i] <= 2
        if broken:
            assert d.decision[i] == DROP
        elif over:
            assert d.decision[i] == (TRUNCATE if action == "truncate" else DROP)
            if action == "truncate":
                assert (x[i] <= lx or d.truncate_to["input"][i] == lx)
                assert (y[i] <= ly or d.truncate_to["target"][i] == ly)
        else:
            assert d.decision[i] == KEEP and d.reason[i] is None


def test_a_row_without_the_measurement_never_passes_a_limit_on_it(tmp_path, bpe_dir):
    """Every metric: a row that lacks it is dropped by an upper and by a lower limit on it."""

    src = write_jsonl(tmp_path / "s.jsonl", [{"text": "a short text", "summary": "sum"},
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


def _lacking_rows_fail(tmp_path, args: list, rules: tuple, n_rows: int, good: int = 0):
    """Each rule (an upper and a lower limit on every metric) drops exactly the rows lacking its
    metric, with the rule as the reason; the row that has it is kept."""

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
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    model = tmp_path / "w2v"
    Wav2Vec2Config().save_pretrained(model)
    Wav2Vec2FeatureExtractor(sampling_rate=16000).save_pretrained(model)
    silent_wav(tmp_path / "a.wav", 16000)
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
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    rules = tuple(f"{m}{op}{v}" for m in CHAT_METRICS for op, v in (("<=", "1000000"), (">=", "0")))
    from tests.support.chat import trl_template

    _lacking_rows_fail(tmp_path, [str(src), "--messages", "messages", "--tokenizer", str(chat_tok_dir),
                                  "--chat-template", str(trl_template("qwen3"))], rules, 3)
