"""``--redact`` keeps the data out of the reasons the report counts, as it keeps texts out of the
previews: the image paths (relative, outside the folder, absolute), URLs with signed queries,
inline image parts and data URIs of conversations whose images are missing or unreadable, and
unknown roles, appear nowhere in ``report.json``, ``report.html`` or the terminal of ``audit
--limit`` and ``clean``; the reasons still say what is wrong, and are counted together. Without
``--redact`` the same outputs name them (so the check can fail)."""

from __future__ import annotations

import base64
import io
import json

import pytest

from lengthscan.cli.main import main
from lengthscan.policy.decisions import redacted
from tests.support.chat import write_jsonl

pytest.importorskip("PIL")

SECRETS = ["secret-dir/gone.png", "/no/such/secret-abs.png",
           "https://host.example/secret-url.png?X-Amz-Signature=s3cr3t", "secret-inline.png", "../secret-outside.png",
           "secret-role", "secret-bytes-in-uri"]


@pytest.fixture
def qwen(qwen2_vl_dir):
    return qwen2_vl_dir


def _rows(tmp_path):
    from PIL import Image

    (tmp_path / "data").mkdir()
    Image.new("RGB", (64, 48)).save(tmp_path / "data" / "ok.png")
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}
    reply = {"role": "assistant", "content": "Something."}

    def inline(ref):
        return {"role": "user", "content": [{"type": "image", "image": ref}, {"type": "text", "text": "And?"}]}

    return [
        {"messages": [user, reply], "images": ["ok.png"]},
        {"messages": [user, reply], "images": [SECRETS[0]]},
        {"messages": [user, reply], "images": [SECRETS[1]]},
        {"messages": [user, reply], "images": [SECRETS[2]]},
        {"messages": [inline(SECRETS[3]), reply], "images": []},
        {"messages": [user, reply], "images": [SECRETS[4]]},
        {"messages": [{"role": SECRETS[5], "content": "hi"}, reply], "images": []},
        {"messages": [inline("data:image/png;base64,@@" + SECRETS[6]), reply], "images": []},
        {"messages": [user, reply], "images": ["ok.png"]},
    ]


def _outputs(out, capsys) -> str:
    """The terminal (both streams), report.json and report.html."""
    terminal = capsys.readouterr()
    return terminal.out + terminal.err + (out / "report.json").read_text() + (out / "report.html").read_text()


@pytest.mark.parametrize("command", ["audit", "clean"])
def test_redact_keeps_image_paths_out_of_every_report(tmp_path, qwen, capsys, command):
    from tests.support.vision import template_of

    rows = _rows(tmp_path)
    src = write_jsonl(tmp_path / "data" / "rows.jsonl", rows)
    args = [command, str(src), "--tokenizer", str(qwen), "--chat-template", str(template_of("qwen2_vl")),
            "--messages", "messages", "--images", "images", "--processor", str(qwen), "--no-cache",
            "--limit", "image_tokens<=10000"]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    plain = _outputs(tmp_path / "plain", capsys)
    named = [s.split("?")[0] for s in SECRETS[:6]]  # a URL is named without its signed query, --redact or not
    assert all(s in plain for s in named)  # the reasons name the images without --redact
    assert "s3cr3t" not in plain and "X-Amz-Signature" not in plain
    assert main([*args, "--redact", "--out", str(tmp_path / "redacted")]) == 0
    shown = _outputs(tmp_path / "redacted", capsys)
    for secret in [*SECRETS, "X-Amz-Signature", "s3cr3t"]:
        assert secret not in shown, secret
    report = json.loads((tmp_path / "redacted" / "report.json").read_text())
    reasons = {r["reason"]: r["rows"] for r in report["decisions"]["splits"][0]["by_reason"]}
    assert reasons["missing_file: image 1 of 1: image '…': no such file"] == 4  # counted together
    assert any(r.startswith("unreadable: image 1 of 1: image '…': a URL") for r in reasons)
    assert any("unknown role '…'" in r for r in reasons)


def test_redacted_replaces_quoted_values_only():
    assert redacted("sequence_tokens<=2048") == "sequence_tokens<=2048"
    assert redacted("missing_file: image 2 of 3: image 'a b/c\\'d.png': no such file") == \
        "missing_file: image 2 of 3: image '…': no such file"
    assert redacted('unreadable: image 1 of 1: image "it\'s.png": a URL') == \
        "unreadable: image 1 of 1: image '…': a URL"
    assert redacted(None) is None
    uri = "data:image/png;base64," + base64.b64encode(b"x" * 30).decode()
    assert uri not in redacted(f"invalid_conversation: image {uri!r}: bad")
