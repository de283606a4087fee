"""Renderers: the terminal summary in a fixed-width console, and report.html from report.json."""

from __future__ import annotations

import html
import io
import re

from rich.console import Console

import lengthscan
from lengthscan.report.html import render_html
from lengthscan.report.terminal import render_summary


def _report(corpus_jsonl, bpe_dir, **kw):
    return lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary", **kw).to_dict()


def test_terminal_summary_full(corpus_jsonl, bpe_dir):
    data = _report(corpus_jsonl, bpe_dir, full=True)
    buf = io.StringIO()
    render_summary(data, Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    f = data["splits"][0]["fields"]["input_tokens"]
    assert "input_tokens" in text and f"{f['max']:,}" in text
    assert "--full: every row measured" in text
    assert "input_tokens > 256 (tokenizer.model_max_length)" in text
    assert "A sample can miss" not in text


def test_terminal_summary_sampled_warns(corpus_jsonl, bpe_dir):
    data = _report(corpus_jsonl, bpe_dir, sample=500, seed=3)
    buf = io.StringIO()
    render_summary(data, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "A sample can miss rare extremes" in text
    assert "95%" in text and "in the split" in text


def test_html_report_is_self_contained_and_escaped(corpus_jsonl, bpe_dir):
    data = _report(corpus_jsonl, bpe_dir, full=True)
    data["command"] = "lengthscan audit '<script>alert(1)</script>'"
    page = render_html(data)
    assert "<script>alert" not in page and html.escape("<script>alert(1)</script>", quote=False) in page
    # nothing loaded from anywhere (the inlined runtime holds URL strings, e.g. the SVG namespace)
    assert not re.search(r"""<(script|link|img|iframe)[^>]*\b(src|href)=["']?(https?:)?//""", page)
    assert page.count('class="chart"') >= 3  # two histograms and the input x target heatmap
    f = data["splits"][0]["fields"]["target_tokens"]
    assert f"{f['max']:,}" in page


def test_html_lists_percentile_headers_and_rows_over_limits(corpus_jsonl, bpe_dir):
    data = _report(corpus_jsonl, bpe_dir, full=True)
    page = render_html(data)
    assert "<th>p99.9</th>" in page
    (check,) = data["splits"][0]["limits"]
    assert check["over_in_measured"] > 0
    top = check["worst_rows"][0]
    assert f"<td>{top['row']}</td><td>{top['value']:,}</td>" in page
