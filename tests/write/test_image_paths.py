"""``clean`` of conversations whose images lie outside the data file's folder (``../other/pic.png``,
an absolute path elsewhere), given in every place audit reads them: the images column as paths,
as ``Image(decode=False)`` values, inline ``image``/``path`` parts and OpenAI ``image_url`` parts,
beside string content. The written paths are absolute, as audit resolved them, so the cleaned
dataset measures the same from any working directory; URLs, data URIs and bytes stay as they are."""

from __future__ import annotations

import base64
import io

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.support.chat import write_jsonl

pytest.importorskip("PIL")


@pytest.fixture
def qwen(qwen2_vl_dir):
    return qwen2_vl_dir


def _pictures(root):
    from PIL import Image

    (root / "data").mkdir()
    (root / "other").mkdir()
    Image.new("RGB", (300, 200), (10, 20, 30)).save(root / "other" / "pic.png")
    Image.new("RGB", (90, 700), (10, 20, 30)).save(root / "elsewhere.jpg")
    Image.new("RGB", (128, 128), (10, 20, 30)).save(root / "data" / "here.png")
    buf = io.BytesIO()
    Image.new("RGB", (50, 40)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _args(qwen, images: bool):
    from tests.support.vision import template_of

    out = ["--tokenizer", str(qwen), "--chat-template", str(template_of("qwen2_vl")), "--messages", "messages",
           "--processor", str(qwen), "--quiet", "--no-cache"]
    return out + (["--images", "images"] if images else [])


def _measured(folder, *args, cwd=None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    assert main(["audit", str(folder), *args, "--full", "--out", str(folder) + ".audit"]) == 0
    t = pq.read_table(str(folder) + ".audit/lengths.parquet").to_pydict()
    return t["sequence_tokens"], t["image_tokens"], t["chat_error"]


def test_images_outside_the_folder_in_every_form(tmp_path, qwen, monkeypatch):
    uri = _pictures(tmp_path)
    elsewhere = str(tmp_path / "elsewhere.jpg")
    reply = {"role": "assistant", "content": "A picture."}
    bare = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}

    def inline(**part):
        return {"role": "user", "content": [{"type": "image", **part}, {"type": "text", "text": "What is it?"}]}

    rows = [
        {"messages": [bare, reply], "images": ["../other/pic.png"]},
        {"messages": [bare, reply], "images": [elsewhere]},
        {"messages": [bare, reply], "images": ["here.png"]},
        {"messages": [inline(image="../other/pic.png"), reply], "images": []},
        {"messages": [inline(path="../other/pic.png"), reply], "images": []},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "../other/pic.png"}},
                                                   {"type": "text", "text": "And this?"}]}, reply], "images": []},
        {"messages": [inline(image=uri), reply], "images": []},
        {"messages": [{"role": "user", "content": "no image here"}, reply], "images": []},
    ]
    src = write_jsonl(tmp_path / "data" / "rows.jsonl", rows)
    args = _args(qwen, images=True)
    before = _measured(src, *args)
    assert before[2] == [None] * len(rows)
    out = tmp_path / "out"
    assert main(["clean", str(src), *args, "--out", str(out)]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(out / "dataset")
    pic, here = str(tmp_path / "other" / "pic.png"), str(tmp_path / "data" / "here.png")
    assert kept["images"] == [[pic], [elsewhere], [here], [], [], [], [], []]
    parts = [m[0]["content"][0] for m in kept["messages"]]
    assert parts[3]["image"] == pic and parts[4]["path"] == pic and parts[5]["image_url"]["url"] == pic
    assert parts[6]["image"] == uri
    assert kept["messages"][7] == rows[7]["messages"]
    assert _measured(out / "dataset", *args, cwd=tmp_path / "other", monkeypatch=monkeypatch) == before


def test_image_values_outside_the_folder(tmp_path, qwen, monkeypatch):
    """A Parquet file with an ``Image(decode=False)`` list column: paths made absolute, bytes kept."""
    import datasets

    _pictures(tmp_path)
    png = (tmp_path / "data" / "here.png").read_bytes()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "That."}]}]
    features = datasets.Features({"messages": [{"role": datasets.Value("string"), "content": [
        {"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image(decode=False))})
    images = [[{"bytes": None, "path": "../other/pic.png"}], [{"bytes": None, "path": str(tmp_path / "elsewhere.jpg")}],
              [{"bytes": png, "path": "named.png"}]]
    src = tmp_path / "data" / "rows.parquet"
    datasets.Dataset.from_dict({"messages": [messages] * 3, "images": images}, features=features).to_parquet(src)
    args = _args(qwen, images=True)
    before = _measured(src, *args)
    assert before[2] == [None] * 3
    out = tmp_path / "out"
    assert main(["clean", str(src), *args, "--out", str(out)]) == 0
    kept = datasets.load_from_disk(out / "dataset").with_format("arrow")[:]["images"].to_pylist()
    assert kept == [[{"bytes": None, "path": str(tmp_path / "other" / "pic.png")}],
                    [{"bytes": None, "path": str(tmp_path / "elsewhere.jpg")}], [{"bytes": png, "path": "named.png"}]]
    assert _measured(out / "dataset", *args, cwd=tmp_path, monkeypatch=monkeypatch) == before
