"""report.html in a real browser: headless Chromium (Debian's ``chromium``) with networking off,
driven over the DevTools protocol with ``websocket-client``.

Each page must draw every chart (a canvas or svg with a nonzero size in each chart container),
log no console error or warning and no uncaught exception, request nothing but its own file, and
look like something (a full-page screenshot that is not one colour, decoded by the browser
itself). Screenshots are kept under pytest's temporary directory for a person to look at.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import lengthscan
from lengthscan.report.html import write_html
from tests.factories import write_jsonl
from tests.support.pages import LABELS_JS, TABLES_JS

CHROMIUM = next((p for p in (os.environ.get("LENGTHSCAN_CHROMIUM"), shutil.which("chromium"),
                             "/usr/bin/chromium", shutil.which("chromium-browser")) if p and Path(p).exists()), None)
websocket = pytest.importorskip("websocket", reason="websocket-client is not installed (pip install websocket-client)")
# slow: a real Chromium per module and pages that render and animate (about 45 s in all)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
         "--remote-debugging-port=0", "--window-size=1280,900"]
#: URL schemes a page may load: itself (file:) and in-memory data.
LOCAL = ("file:", "data:", "blob:", "about:")


class Chromium:
    """One headless Chromium and one page in it, over the DevTools protocol (flattened sessions)."""

    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="lengthscan-chromium-")
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=60, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=1280, height=900,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params) -> dict:
        msg_id = next(self.ids)
        msg = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path: Path, timeout: float = 60) -> None:
        self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout
        while self.evaluate("document.readyState + '/' + (document.body && document.body.dataset.charts)") \
                != "complete/done":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish drawing its charts")
            time.sleep(0.1)

    def screenshot(self, out: Path) -> Path:
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        out.write_bytes(base64.b64decode(shot["data"]))
        return out

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def problems(events: list[dict]) -> list[str]:
    """Console errors and warnings, uncaught exceptions, browser log errors, and every request
    for something that is not the page itself."""
    out = []
    for e in events:
        method, p = e["method"], e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p["type"] in ("error", "warning", "assert"):
            args = " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
            out.append(f"console.{p['type']}: " + args)
        elif method == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('exception', {}).get('description')}")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent" and not p["request"]["url"].startswith(LOCAL):
            out.append(f"request: {p['request']['url']}")
    return out


#: The distinct colours of a PNG (a sample of its pixels), counted by the browser's own decoder.
COLOURS_JS = """(async () => {
  const img = new Image(); img.src = "data:image/png;base64,%s"; await img.decode();
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d"); ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data; const seen = new Set();
  for (let i = 0; i < d.length && seen.size < 64; i += 4 * 97) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  return [img.width, img.height, seen.size];
})()"""

CHARTS_JS = """Array.from(document.querySelectorAll(".chart")).map(el => {
  const g = el.querySelector(".plot canvas, .plot svg.marks");
  const r = g ? g.getBoundingClientRect() : {width: 0, height: 0};
  return {id: el.id, width: r.width, height: r.height};
})"""


@pytest.fixture(scope="module")
def browser():
    b = Chromium(CHROMIUM)
    yield b
    b.close()


def check_page(browser: Chromium, page: Path, shot: Path) -> dict:
    """Open ``page``; assert on what it did; return the chart sizes."""
    browser.events.clear()
    browser.open(page)
    time.sleep(0.3)  # late console messages
    browser.evaluate("1")  # drain events
    charts = browser.evaluate(CHARTS_JS)
    state = browser.evaluate("window.lengthscanCharts")
    assert problems(browser.events) == []
    assert charts and state["total"] == len(charts) and state["rendered"] == state["total"] and not state["failed"]
    empty = [c["id"] for c in charts if c["width"] < 50 or c["height"] < 30]
    assert not empty, f"charts without a drawing: {empty}"
    browser.screenshot(shot)
    b64 = base64.b64encode(shot.read_bytes()).decode()
    width, height, colours = browser.evaluate(COLOURS_JS % b64)
    assert width >= 1000 and height > 900 and colours > 8, f"screenshot looks blank: {colours} colours"
    return {"charts": charts, "height": height}


HOVER_JS = """(() => {
  const box = document.querySelector(".chart .plot"); box.scrollIntoView({block: "center"});
  const view = box._view, rect = box.querySelector("canvas").getBoundingClientRect(), origin = view.origin();
  return [rect.left + origin[0] + view.width() * 0.3, rect.top + origin[1] + view.height() - 2];
})()"""
TOOLTIP_JS = """(() => { const t = document.getElementById("vg-tooltip-element");
  return t && t.classList.contains("visible") ? t.innerText : null; })()"""
CLICK_ALL_JS = """(async () => {
  for (const b of document.querySelectorAll(".toggles .seg button")) {
    b.click(); await new Promise(r => setTimeout(r, 150));
  }
  return document.querySelectorAll(".toggles .seg button").length;
})()"""


def _audit_page(tmp_path, data, name) -> Path:
    page = tmp_path / f"{name}.html"
    write_html(page, data)
    return page


def test_full_audit_page(browser, tmp_path, corpus_jsonl, bpe_dir):
    data = lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                            full=True).to_dict()
    data["source"]["spec"] = "corpus.jsonl </script><script>alert(1)</script>"
    result = check_page(browser, _audit_page(tmp_path, data, "audit"), tmp_path / "audit.png")
    # two histograms and the joint heatmap, plus the batches chart when batches were simulated
    assert len(result["charts"]) >= 3
    assert browser.evaluate("document.querySelector('h1').textContent") == data["source"]["spec"]
    # hovering a bar of the first histogram shows its rows; every scale toggle redraws cleanly
    x, y = browser.evaluate(HOVER_JS)
    browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)
    time.sleep(0.3)
    tip = browser.evaluate(TOOLTIP_JS)
    assert tip and "rows" in tip and "rows up to here" in tip
    browser.events.clear()
    assert browser.evaluate(CLICK_ALL_JS) >= 8
    time.sleep(0.5)
    browser.evaluate("1")
    assert problems(browser.events) == []
    assert all(c["width"] > 50 and c["height"] > 30 for c in browser.evaluate(CHARTS_JS))
    browser.screenshot(tmp_path / "audit-toggled.png")


def test_sampled_audit_with_limits_page(browser, tmp_path, corpus_jsonl, bpe_dir):
    data = lengthscan.audit(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                            sample=400, seed=1, limits=["target_tokens<=p95", "input_tokens<=128:truncate"]).to_dict()
    assert data["decisions"] and data["splits"][0]["sample"]["mode"] == "sample"
    check_page(browser, _audit_page(tmp_path, data, "sampled"), tmp_path / "sampled.png")
    assert "95%" in browser.evaluate("document.body.innerText")


def test_clean_page(browser, tmp_path, corpus_jsonl, bpe_dir):
    result = lengthscan.clean(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                              limits=["target_tokens<=p90", "input_tokens<=128:truncate"],
                              out=str(tmp_path / "cleaned"))
    data = json.loads((tmp_path / "cleaned" / "report.json").read_text())
    assert data.get("clean") and result is not None
    check_page(browser, tmp_path / "cleaned" / "report.html", tmp_path / "clean.png")
    check_page(browser, _audit_page(tmp_path, data, "clean-rendered"), tmp_path / "clean-rendered.png")


#: Each rule or reason in the limit tables and worst rows: its text and how many lines it takes.
REASONS_JS = """Array.from(document.querySelectorAll("td.reason code")).map(el => {
  const rects = Array.from(el.getClientRects()).filter(r => r.width > 0);
  const box = el.closest(".scroll");
  return {text: el.textContent, lines: new Set(rects.map(r => Math.round(r.top))).size,
          scrolls: box ? box.scrollWidth > box.clientWidth + 1 : false};
})"""


def test_short_rules_are_not_cut_inside(browser, tmp_path, docs, chat_tok_dir):
    """A clean's rules and reasons in its tables: ``input_tokens<=256`` stays on one line, a longer
    ``sequence_tokens<=512:drop-turns`` wraps after its colon only, and the worst rows fit their card."""
    from tests.support.chat import conversations, trl_template, write_jsonl

    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": r["messages"]} for r in conversations(docs, 120, 3)])
    out = tmp_path / "cleaned"
    lengthscan.clean(str(src), tokenizer=str(chat_tok_dir), messages="messages",
                     chat_template=str(trl_template("qwen3_training")), out=str(out),
                     limits=["sequence_tokens<=400:drop-turns", "turns<=12"])
    check_page(browser, out / "report.html", tmp_path / "reasons.png")
    reasons = browser.evaluate(REASONS_JS)
    assert {r["text"] for r in reasons} >= {"sequence_tokens<=400:drop-turns"}
    for r in reasons:
        pieces = r["text"].split(":")
        short = all(len(p) + 1 <= 24 and " " not in p for p in pieces)
        assert r["lines"] <= (1 if len(r["text"]) <= 24 and " " not in r["text"] else len(pieces) if short else 99), r
        assert not r["scrolls"], r


def test_audio_audit_page(browser, tmp_path, bpe_dir):
    from tests.support import audio_files as af

    rows = []
    for i, seconds in enumerate((0.7, 1.3, 2.2, 3.1, 4.0, 5.5, 7.9, 12.0, 31.5)):
        clip = af.write_audio(tmp_path / f"clip{i}.wav", int(16000 * seconds), 16000)
        rows.append({"path": str(clip), "text": " ".join(["word"] * (3 * i + 2))})
    rows.append({"path": str(tmp_path / "gone.wav"), "text": "a missing file"})
    manifest = tmp_path / "m.jsonl"
    write_jsonl(manifest, rows)
    data = lengthscan.audit(str(manifest), audio="path", target="text", tokenizer=str(bpe_dir),
                            model=str(_whisper_dir(tmp_path)), full=True).to_dict()
    assert "input_seconds" in data["splits"][0]["fields"] and data["model"]["limits"]
    check_page(browser, _audit_page(tmp_path, data, "audio"), tmp_path / "audio.png")


def _whisper_dir(tmp_path):
    from transformers import WhisperConfig, WhisperFeatureExtractor

    out = tmp_path / "whisper"
    WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64).save_pretrained(out)
    WhisperFeatureExtractor().save_pretrained(out)
    return out


def test_memory_page(browser, tmp_path, corpus_jsonl, bpe_dir):
    from transformers import BartConfig

    from lengthscan.memory.data import predict_dataset

    BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=3000).save_pretrained(tmp_path / "bart")
    first = predict_dataset(str(corpus_jsonl), model=str(tmp_path / "bart"), tokenizer=str(bpe_dir), input="text",
                            target="summary", batch_size=8)
    predict_dataset(str(corpus_jsonl), model=str(tmp_path / "bart"), tokenizer=str(bpe_dir), input="text",
                    target="summary", batch_size=8, budget_bytes=first.memory["peak_bytes"],
                    out=str(tmp_path / "memory"))
    result = check_page(browser, tmp_path / "memory" / "report.html", tmp_path / "memory.png")
    assert any(c["id"] for c in result["charts"])
    assert "Worst batch #" in browser.evaluate("document.getElementById('memory').innerText")
    browser.events.clear()
    assert browser.evaluate(CLICK_ALL_JS) >= 2
    time.sleep(0.5)
    browser.evaluate("1")
    assert problems(browser.events) == []
    assert all(c["width"] > 50 and c["height"] > 30 for c in browser.evaluate(CHARTS_JS))


def test_images_audit_page(browser, tmp_path, qwen2_vl_dir, docs):
    """A conversation audit with images: the image section, its size chart and the tables render."""
    pytest.importorskip("PIL")
    from tests.support.vision import image_conversations, template_of, write_pictures

    folder = qwen2_vl_dir
    pictures = write_pictures(tmp_path / "pictures")
    src = tmp_path / "pictures" / "vlm.jsonl"
    write_jsonl(src, image_conversations(docs, pictures, 30, seed=2))
    data = lengthscan.audit(str(src), tokenizer=str(folder), messages="messages", images="images",
                            processor=str(folder), chat_template=str(template_of("qwen2_vl")), full=True,
                            limits=["sequence_tokens<=1200"]).to_dict()
    assert data["splits"][0]["chat"]["images"]["images"] > 10
    check_page(browser, _audit_page(tmp_path, data, "images"), tmp_path / "images.png")
    drawn = "document.querySelector('[data-name=\"image sizes\"] .plot canvas, [data-name=\"image sizes\"] svg')"
    assert browser.evaluate(f"{drawn} !== null")
    text = browser.evaluate("document.body.innerText")
    assert "Images" in text and "of the sequence tokens" in text and "max_pixels" in text


def _at_width(browser: Chromium, width: int) -> None:
    browser.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=900, deviceScaleFactor=1,
                 mobile=False)


def _asr_manifest(tmp_path, n: int = 60) -> Path:
    """Speech clips of 0.7 to 45 s with transcripts whose length follows the audio."""
    import random

    from tests.support import audio_files as af

    rng, rows = random.Random(0), []
    for i in range(n):
        seconds = rng.choice([0.7, 1.3, 2.2, 3.1, 4.0, 5.5, 7.9, 12.0, 31.5, 45.0])
        af.write_audio(tmp_path / f"clip{i}.wav", int(16000 * seconds), 16000)
        rows.append({"path": f"clip{i}.wav", "text": " ".join(["word"] * int(3 * seconds + 2))})
    manifest = tmp_path / "m.jsonl"
    write_jsonl(manifest, rows)
    return manifest


def test_wide_tables_stay_within_the_page_at_1400_px(browser, tmp_path, bpe_dir):
    """A sampled speech audit (three audio measurements, intervals under every percentile): at a
    1,400 px window each statistics table fits its card, and any wider table scrolls inside its
    card, never past the page."""
    data = lengthscan.audit(str(_asr_manifest(tmp_path)), audio="path", target="text", tokenizer=str(bpe_dir),
                            model=str(_whisper_dir(tmp_path)), sample=40, seed=1,
                            limits=["input_seconds<=30", "target_tokens<=p90"]).to_dict()
    assert data["splits"][0]["sample"]["mode"] == "sample" and len(data["splits"][0]["fields"]) == 4
    _at_width(browser, 1400)
    try:
        check_page(browser, _audit_page(tmp_path, data, "asr-sampled"), tmp_path / "asr-sampled.png")
        laid = browser.evaluate(TABLES_JS)
    finally:
        _at_width(browser, 1280)
    assert laid["page"] <= laid["vw"] == 1400  # no table widens the page
    stats = [t for t in laid["tables"] if t["stats"]]
    assert stats and all(not t["scrolls"] and t["right"] <= t["clipRight"] + 0.5 for t in stats), stats
    assert all(t["clipRight"] <= laid["vw"] and t["clipLeft"] >= 0 for t in laid["tables"])


def test_line_labels_never_lie_over_bars(browser, tmp_path, bpe_dir, corpus_jsonl):
    """Labels of percentiles, limits and rules on the histograms, and of the budget lines on the memory
    chart, as drawn: no label's box overlaps a bar's."""
    from transformers import BartConfig

    from lengthscan.memory.data import predict_dataset

    data = lengthscan.clean(str(_asr_manifest(tmp_path)), audio="path", target="text", tokenizer=str(bpe_dir),
                            model=str(_whisper_dir(tmp_path)), limits=["input_seconds<=30", "target_tokens<=p90"],
                            out=str(tmp_path / "cleaned"))
    assert data is not None
    BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=3000).save_pretrained(tmp_path / "bart")
    first = predict_dataset(str(corpus_jsonl), model=str(tmp_path / "bart"), tokenizer=str(bpe_dir), input="text",
                            target="summary", batch_size=8)
    budget = int(first.memory["per_batch"]["p90"])  # the usable line crosses the highest bars
    predict_dataset(str(corpus_jsonl), model=str(tmp_path / "bart"), tokenizer=str(bpe_dir), input="text",
                    target="summary", batch_size=8, budget_bytes=budget, out=str(tmp_path / "memory"))
    labelled = 0
    for page in (tmp_path / "cleaned" / "report.html", tmp_path / "memory" / "report.html"):
        _at_width(browser, 1400)
        try:
            check_page(browser, page, tmp_path / f"{page.parent.name}.png")
            charts = browser.evaluate(LABELS_JS)
        finally:
            _at_width(browser, 1280)
        assert all(not c["over"] for c in charts), [c for c in charts if c["over"]]
        labelled += sum(c["texts"] for c in charts)
    assert labelled >= 8  # the labels were there to check
