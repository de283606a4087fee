"""report.html without a browser: self-contained and small, escaped, redactable, built from binned
data only; and the plain-language findings on constructed reports."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from html.parser import HTMLParser
from importlib import resources

import pytest

import lengthscan
from lengthscan.report import charts
from lengthscan.report.findings import findings
from lengthscan.report.html import RUNTIME, render_html, script_json, write_html

HOSTILE = "</script><script>alert(1)</script></div><!-- <b>"
LIMIT = 5_000_000


@pytest.fixture(scope="module")
def full(corpus_jsonl, bpe_dir):
    return lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                            full=True).to_dict()


@pytest.fixture(scope="module")
def sampled(corpus_jsonl, bpe_dir):
    return lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary", sample=300,
                            seed=2, limits=["target_tokens<=p95", "input_tokens<=128:truncate"]).to_dict()


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory, corpus_jsonl, bpe_dir):
    out = tmp_path_factory.mktemp("clean") / "out"
    lengthscan.clean(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                     limits=["target_tokens<=p90", "input_tokens<=128:truncate"], out=str(out))
    return json.loads((out / "report.json").read_text())


class Page(HTMLParser):
    """Tags, attributes and script blocks of a page, as a browser's tokenizer sees them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.ends, self.scripts, self._in = [], [], [], None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in = dict(attrs)
            self.scripts.append([dict(attrs), ""])

    def handle_endtag(self, tag):
        self.ends.append(tag)
        if tag == "script":
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self.scripts[-1][1] += data


def charts_payload(page: Page) -> dict:
    (block,) = [text for attrs, text in page.scripts if attrs.get("type") == "application/json"]
    return json.loads(block)


@pytest.mark.parametrize("name", ["full", "sampled", "cleaned"])
def test_self_contained_small_and_loads_nothing(name, request):
    data = request.getfixturevalue(name)
    text = render_html(data)
    assert len(text.encode("utf-8")) < LIMIT
    page = Page(text)
    assert [t for t, _ in page.tags].count("script") == 3  # the chart JSON, the runtime, the page's script
    for tag, attrs in page.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed", "source", "audio", "video"), tag
        for key in ("src", "href", "srcset", "action", "data", "poster"):
            value = attrs.get(key) or ""
            assert not re.match(r"\s*(https?:)?//", value), (tag, key, value)
            assert key not in ("src", "srcset") or not value, (tag, key, value)
    styles = re.findall(r"<style>(.*?)</style>", text, re.DOTALL)
    assert styles and not any(re.search(r"@import|url\(", s) for s in styles)
    # the runtime is inlined exactly once, without its source-map comments
    for name_ in RUNTIME:
        head = (resources.files("lengthscan.report") / "assets" / name_).read_text()[:300]
        assert text.count(head) == 1
    assert "sourceMappingURL" not in text


def test_every_chart_has_a_container_and_a_spec(sampled):
    text = render_html(sampled)
    page = Page(text)
    ids = {a["id"] for t, a in page.tags if "chart" in (a.get("class") or "").split()}
    specs = charts_payload(page)["charts"]
    assert ids == set(specs) and len(ids) >= 5  # two histograms, the heatmap, decisions, padding


def test_binned_data_only(full):
    data = copy.deepcopy(full)
    field = data["splits"][0]["fields"]["input_tokens"]
    field["histogram"] = {"values": [987654321, 987654322], "counts": [1, 1]}
    text = render_html(data)
    assert "987654321" not in text
    spec = charts.histogram_spec(field)
    bars = spec["layer"][0]["data"]["values"]
    assert len(bars) == len(field["display_histogram"]["counts"])
    assert sum(b["count"] for b in bars) == sum(field["display_histogram"]["counts"])


@pytest.mark.slow  # renders a 40-split page with 2,000-bin histograms and a full joint histogram
def test_size_bounded_whatever_the_corpus(full):
    """Huge lengths (wide bins), a full joint histogram, and many splits: still under 5 MB."""
    data = copy.deepcopy(full)
    split = data["splits"][0]
    edges = split["pair"]["joint"]["edges"]
    split["pair"]["joint"]["cells"] = [[i, j, 10 ** 6] for i in range(len(edges) - 1) for j in range(len(edges) - 1)]
    for f in split["fields"].values():
        f["display_histogram"] = {"edges": list(range(1, 2002)), "counts": [10 ** 9] * 2000}
    data["splits"] = [dict(copy.deepcopy(split), split=f"shard{i}") for i in range(40)]
    text = render_html(data)
    assert len(text.encode("utf-8")) < LIMIT
    assert "left out to keep the page under 5 MB" in text


def test_hostile_strings_are_escaped(cleaned):
    data = copy.deepcopy(cleaned)
    data["source"]["spec"] = f"data/{HOSTILE}.jsonl"
    data["command"] = f"lengthscan clean '{HOSTILE}'"
    data["splits"][0]["split"] = f"train{HOSTILE}"
    data["decisions"]["splits"][0]["by_reason"][0]["reason"] = HOSTILE
    data["model"] = {"model": HOSTILE, "model_type": "x", "family": "y", "notes": [HOSTILE],
                     "limits": [{"name": "input_tokens", "value": 64, "origin": HOSTILE}]}
    data["clean"]["worst_rows"] = [{"split": "train", "row": 7, "decision": "drop", "reason": HOSTILE,
                                    "field": "input_tokens", "lengths": {"input_tokens": 999},
                                    "preview": {"text": f"a row holding {HOSTILE} and <script>x()</script>"}}]
    text = render_html(data)
    page = Page(text)
    assert "<script>alert(1)" not in text and "<script>x()" not in text and "<!-- <b>" not in text
    assert [t for t, _ in page.tags].count("script") == 3
    assert page.tags.count(("b", {})) == page.ends.count("b")  # no tag from the data opened or closed
    assert [t for t, _ in page.tags].count("div") == page.ends.count("div")
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;/div&gt;" in text
    # the split name reaches the chart JSON too: escaped there, and intact once parsed
    payload = charts_payload(page)
    assert HOSTILE not in page.scripts[0][1]
    assert "a row holding" in text
    json.dumps(payload)


def test_script_json_cannot_end_its_block():
    obj = {"a": HOSTILE, "b": "<!--<script>", "c": [1.5, float("nan"), "&amp;"]}
    text = script_json(obj)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": HOSTILE, "b": "<!--<script>", "c": [1.5, None, "&amp;"]}


def test_redact_leaves_data_text_out(cleaned, tmp_path):
    data = copy.deepcopy(cleaned)
    data["clean"]["worst_rows"] = [
        {"split": "train", "row": 4242, "decision": "drop", "reason": "target_tokens<=p90", "field": "target_tokens",
         "lengths": {"target_tokens": 321}, "preview": {"summary": "SECRET PATIENT NOTE"}},
        {"split": "train", "row": 4343, "decision": "drop", "reason": "input_seconds<=30", "field": "input_seconds",
         "lengths": {"input_seconds": 41.5}, "audio": "/data/SECRET-SPEAKER/clip.wav"}]
    plain = render_html(data)
    assert "SECRET PATIENT NOTE" in plain and "SECRET-SPEAKER" in plain
    write_html(tmp_path / "r.html", data, redact=True)
    redacted = (tmp_path / "r.html").read_text()
    assert "SECRET" not in redacted
    assert "4242" in redacted and "4343" in redacted and "41.5" in redacted and "Redacted" in redacted


def test_audit_and_clean_pages_show_their_parts(full, sampled, cleaned):
    page = render_html(full)
    assert "full pass" in page and "Findings" in page and "Limit rules" not in page
    page = render_html(sampled)
    assert "sample: 300 of" in page and "95%" in page and "Limit rules" in page and "would do" in page
    assert "target_tokens&lt;=p95" in page
    page = render_html(cleaned)
    assert "after cleaning" in page and "what cleaning did" in page
    for d in cleaned["decisions"]["splits"]:
        assert f"{d['dropped']:,}" in page


def test_vendored_runtime_matches_its_readme():
    assets = resources.files("lengthscan.report") / "assets"
    readme = (assets / "README.md").read_text()
    for name in RUNTIME:
        digest = hashlib.sha256((assets / name).read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(name)}`.*`{digest}`", readme), name
    for lic in ("LICENSE.vega", "LICENSE.vega-lite", "LICENSE.vega-embed"):
        assert "Redistribution and use" in (assets / lic).read_text()


def test_histogram_spec_marks_and_toggles(full):
    f = full["splits"][0]["fields"]["input_tokens"]
    spec = charts.histogram_spec(f, limits=[(256, "tokenizer")], rules=[(100, "<=", "a rule")])
    lines = [v for layer in spec["layer"][1:] if layer["mark"]["type"] == "rule" for v in layer["data"]["values"]]
    kinds = {ln["kind"] for ln in lines}
    assert kinds == {"percentile", "limit", "rule"}
    assert {ln["value"] for ln in lines} >= {256, 100, f["max"], f["percentiles"]["p99"]}
    toggle = spec["usermeta"]["toggle"]
    assert set(toggle["x"]) == {"log x", "linear x"} and toggle["y"]["log y"]["scale"]["type"] == "symlog"
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"


def test_joint_spec_divides_stored_milliseconds():
    pair = {"x": "input_seconds", "y": "target_tokens", "x_scale": 1000, "y_scale": 1,
            "joint": {"edges": [0, 1, 2, 3, 4, 6, 8, 12, 16], "cells": [[7, 2, 5], [0, 3, 1]]}}
    spec = charts.joint_spec(pair, x_limits=[(0.01, "30 s", "limit")])
    rect = spec["layer"][0]
    assert rect["data"]["values"] == [{"i": 7, "j": 2, "n": 5}, {"i": 0, "j": 3, "n": 1}]
    assert spec["params"][0]["value"] == [0, 1, 2, 3, 4, 6, 8, 12, 16]
    calc = {t["as"]: t["calculate"] for t in rect["transform"]}
    assert calc["x1"] == "edges[datum.i + 1] / 1000" and calc["y1"] == "edges[datum.j + 1] / 1"
    assert ") s'" in calc["xr"] and "format(" in calc["yr"]


# -- findings on constructed reports ----------------------------------------------------------------

def _field(name, *, p50, p99, top, count=1000):
    pct = {"p25": p50, "p50": p50, "p75": p50, "p90": p99, "p95": p99, "p99": p99, "p99.5": top, "p99.9": top}
    return {"name": name, "count": count, "rows": count, "missing": 0, "empty": 0, "unmeasured": 0, "min": 1,
            "mean": p50, "max": top, "percentiles": pct, "display_histogram": {"edges": [1, 2], "counts": [count]}}


def _split(fields, limits=(), *, sample=None, roles=None, pair=None):
    sample = sample or {"mode": "full", "rows_total": 1000, "rows_measured": 1000, "seed": 0, "reason": "--full"}
    out = {"split": "train", "sample": sample, "fields": {f["name"]: f for f in fields}, "limits": list(limits),
           "roles": roles or {}}
    if pair:
        out["pair"] = pair
    return out


def _check(measure, limit, over, worst, *, measured=1000, est=None, interval=None):
    return {"name": f"{measure} > {limit}", "measure": measure, "limit": limit, "origin": "config.max_target_positions",
            "over_in_measured": over, "measured": measured, "estimated_over": est if est is not None else over,
            "interval": interval or [over, over], "worst_rows": [{"row": r, "value": v} for r, v in worst]}


def _batches(role="target", worst=17160, median=1000):
    entry = {"batch_size": 8, "effective_batch_size": 8, "worst_case": {"input": 800, "target": None},
             "strategies": {"random": {"padding_share": 0.43, "input_padding_share": 0.4, "target_padding_share": 0.55,
                                       "median_batch": {"input": 400, "target": None}},
                            "group_by_length": {"padding_share": 0.06}}}
    entry["worst_case"][role] = worst
    entry["strategies"]["random"]["median_batch"][role] = median
    return {"unit": "tokens", "by_batch_size": [{**entry, "batch_size": 4}, entry]}


def test_findings_rows_over_a_limit_and_their_batch():
    data = {"splits": [_split([_field("target_tokens", p50=40, p99=120, top=2145)],
                              [_check("target_tokens", 128, 37, [(17, 2145), (3, 900)])])],
            "batches": _batches()}
    out = findings(data)
    assert out[0] == ("37 targets exceed 128 tokens (config.max_target_positions); the longest is 2,145 tokens "
                      "(row 17); a batch of 8 containing it pads labels to 2,145 tokens (17x the median batch).")
    assert "Random batches of 8 are 43% padding (inputs 40%, labels 55%); group_by_length brings that to 6%." in out
    assert not any("long tail" in f for f in out)  # the limit finding already says it


def test_findings_sampled_estimates_and_caveat():
    sample = {"mode": "sample", "rows_total": 100000, "rows_measured": 500, "seed": 3, "reason": "--sample 500"}
    data = {"splits": [_split([_field("input_tokens", p50=40, p99=300, top=900, count=500)],
                              [_check("input_tokens", 512, 3, [(5339, 900)], measured=500, est=600.0,
                                      interval=[210.4, 1702.9])], sample=sample)]}
    out = findings(data)
    assert out[0].startswith("About 600 inputs exceed 512 tokens") and "95% interval 210-1,703" in out[0]
    assert "from 3 of 500 sampled rows" in out[0] and "the longest seen is 900 tokens (row 5339)" in out[0]
    assert out[-1].startswith("Measured on a sample of 500 of 100,000 rows (seed 3)")


def test_findings_decisions_clean_flags_ratio_and_tail():
    before = _split([_field("input_tokens", p50=20, p99=100, top=1432),
                     _field("target_tokens", p50=10, p99=40, top=50)],
                    [_check("input_tokens", 512, 0, [])],
                    roles={"input": {"flags": {"missing": 2, "unreadable": 1}}, "target": {"flags": {"empty": 4}}})
    after = copy.deepcopy(before)
    after["fields"]["input_tokens"]["max"] = 256
    after["sample"]["rows_total"] = 950
    by_reason = [{"decision": "truncate", "reason": "input_tokens<=256", "rows": 50},
                 {"decision": "drop", "reason": "target_tokens<=40", "rows": 45}]
    decisions = {"splits": [{"split": "train", "rows": 1000, "measured": 1000, "kept": 900, "truncated": 50,
                             "dropped": 50, "by_reason": by_reason}],
                 "gate": None}
    out = findings({"splits": [before], "decisions": decisions, "clean": {"after": [after]}})
    assert ("Before cleaning: Every row with a length is within the known limits: input_tokens <= 512 (rows "
            "without a length are not in it: see below)." in out)
    assert ("Cleaning dropped 50 (5%) and truncated 50 (5%) of 1,000 rows; most drops: target_tokens<=40 (45)."
            in out)
    assert "After cleaning, 950 rows remain: input_tokens max 1,432 -> 256." in out
    assert any(f.startswith("Before cleaning: 3 input rows have no length (2 missing, 1 unreadable)") for f in out)
    assert any("4 targets are empty" in f for f in out)
    audio = _split([_field("input_seconds", p50=5, p99=20, top=25), _field("target_tokens", p50=20, p99=90, top=400)],
                   pair={"x": "input_seconds", "y": "target_tokens",
                         "ratio": {"name": "target_tokens/input_seconds", "count": 1000, "min": 0.5, "max": 126.9,
                                   "percentiles": {"p50": 4.2}}})
    out = findings({"splits": [audio]})
    assert any(f.startswith("target_tokens/input_seconds: median 4.2, but the highest is 126.9 (30x the median) "
                            "and the lowest is 0.5") for f in out)
    assert any(f.startswith("target_tokens has a long tail: 99% of rows are at most 90 tokens, the longest is "
                            "400 tokens (4.4x p99, 20x the median)") for f in out)


def test_findings_quiet_report_model_notes_and_gate():
    quiet = _split([_field("input_tokens", p50=20, p99=30, top=40)], [_check("input_tokens", 512, 0, [])])
    assert findings({"splits": [quiet]}) == ["Every row is within the known limits: input_tokens <= 512."]
    no_limit = _split([_field("input_tokens", p50=20, p99=30, top=40)])
    assert findings({"splits": [no_limit]})[0].startswith("No model or tokenizer limit was checked: pass --model")
    model = {"model": "m", "notes": ["decoder-only: input and target share one sequence"], "limits": []}
    assert findings({"splits": [no_limit], "model": model}) == [
        "Model note: decoder-only: input and target share one sequence."]
    decisions = {"splits": [], "gate": "3.2% of rows would be dropped or truncated (more than --fail-over 1%)"}
    assert findings({"splits": [], "decisions": decisions}) == [f"The --fail-over gate failed: {decisions['gate']}."]
