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
