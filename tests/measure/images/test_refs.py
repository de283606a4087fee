"""Image references read once per batch: rows that share an image, and a row that names one image
thousands of times (a hostile row whose image carries megabytes of metadata within the budget), cost
one read of it, as paths and as ``Image(decode=False)`` values alike."""

from __future__ import annotations

import io
import struct
import time
import zlib

import pytest

from lengthscan.measure.images.refs import ImageProblem, Seen, image_sizes
from tests.factories import write_jsonl

PIL = pytest.importorskip("PIL")


def test_an_image_named_thousands_of_times_is_read_once(tmp_path):
    from PIL import Image, ImageOps

    buf = io.BytesIO()
    Image.new("RGB", (60, 40)).save(buf, "PNG", exif=Image.Exif().tobytes())
    png = buf.getvalue()
    text = b"Comment\x00" + b"x" * (6 << 20)  # 6 MiB of text before the image data: read whole (checksum)
    chunk = struct.pack(">I", len(text)) + b"tEXt" + text + struct.pack(">I", zlib.crc32(b"tEXt" + text) & 0xFFFFFFFF)
    (tmp_path / "heavy.png").write_bytes(png[:33] + chunk + png[33:])
    refs = ["heavy.png"] * 1500 + [{"bytes": None, "path": "heavy.png"}] * 1500 + ["missing.png"] * 10
    start = time.perf_counter()
    got = image_sizes(refs, str(tmp_path))
    assert time.perf_counter() - start < 3  # 3,000 reads of 6 MiB would take far longer
    with Image.open(tmp_path / "heavy.png") as img:
        want = ImageOps.exif_transpose(img).size
    assert all(isinstance(g, Seen) and (g.width, g.height) == want for g in got[:3000])
    assert all(isinstance(g, ImageProblem) and g.flag == "missing_file" for g in got[3000:])


def test_an_image_url_is_named_without_its_credentials_and_query(tmp_path, train_texts):
    """An image given as a URL is a per-row reason; the reason names it as every URL is shown
    (``https://***@host/path``), so no password or signature reaches lengths.parquet, report.json,
    report.html or the terminal."""

    import pyarrow.parquet as pq

    from lengthscan.cli.main import main
    from tests.support.vision import vision_dir, write_pictures

    url = "https://alice:hunter2@images.example/a.png?X-Amz-Signature=SIG0123&X-Amz-Credential=CRED4567"
    assert image_sizes([url], None)[0].reason == \
        "image 'https://***@images.example/a.png': a URL; lengthscan reads local image files and bytes " \
        "(download the images first)"
    folder = vision_dir(tmp_path / "vl", "qwen2_5_vl", train_texts[:200])
    pic = write_pictures(tmp_path / "pics")[0]
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": ref}, {"type": "text", "text": "?"}]},
                          {"role": "assistant", "content": "A picture."}]} for ref in (str(pic), url)]
    src = tmp_path / "c.jsonl"
    write_jsonl(src, rows)
    out = tmp_path / "o"
    assert main(["audit", str(src), "--tokenizer", str(folder), "--processor", str(folder), "--messages", "messages",
                 "--chat-template", "qwen2_5_vl", "--full", "--out", str(out)]) == 0
    written = [str(pq.read_table(out / "lengths.parquet").to_pylist()), (out / "report.json").read_text(),
               (out / "report.html").read_text()]
    assert "https://***@images.example/a.png" in written[0] + written[1]
    for secret in ("hunter2", "SIG0123", "CRED4567"):
        assert not any(secret in text for text in written)
