"""Image headers read within a budget, and only from regular files.

Special files: a FIFO, a socket, a device and a folder in a conversation's images are refused unread,
each row with its reason (the audit runs in a subprocess under a timeout: a regression fails, it
does not hang the suite). Hostile metadata, in real crafted files: compressed PNG text that inflates
to 64 MiB, a TIFF directory 300 MiB into a sparse file, an EXIF or eXIf chunk that declares
gigabytes, hundreds of EXIF segments, hundreds of thousands of chunks; each read with a bounded peak
of memory (``tracemalloc``), refused with a reason where Pillow refuses it or where it is over the
budget, and measured as Pillow measures it where it is within.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib

import pyarrow.parquet as pq
import pytest

from lengthscan.measure.images.headers import ImageError, OverBudget, image_size_from
from lengthscan.measure.images.reader import INFLATE_BUDGET, PILLOW_TEXT_CHUNK, READ_BUDGET
from tests.factories import write_jsonl

PIL = pytest.importorskip("PIL")

#: The most any crafted file below may make the header reading hold at once.
PEAK = 16 << 20


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png(size=(30, 20)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (9, 99, 199)).save(buf, "PNG")
    return buf.getvalue()


def _exif(o: int) -> bytes:
    from PIL import Image

    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def _pillow(path):
    """What ``load_image`` meets: the oriented size, or the exception's type."""
    from PIL import Image, ImageOps

    try:
        with open(path, "rb") as fh, Image.open(fh) as img:
            return ImageOps.exif_transpose(img).size
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        return type(exc).__name__


def _bounded(path):
    """``image_size_from(path)`` (the oriented size, or the ImageError) and its peak memory."""
    tracemalloc.start()
    try:
        try:
            got = image_size_from(path).oriented()
        except ImageError as exc:
            got = exc
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _raw_profile(o: int) -> bytes:
    raw = _exif(o)
    return (f"\nexif\n{len(raw):8d}\n").encode() + raw.hex().encode() + b"\n"


def _deflated(prefix: bytes, zeros: int) -> bytes:
    z = zlib.compressobj(9)
    return z.compress(prefix) + b"".join(z.compress(b"0" * (1 << 20)) for _ in range(zeros >> 20)) + z.flush()


@pytest.mark.parametrize("kind", ["zTXt", "iTXt"])
def test_a_text_chunk_that_inflates_to_64_mib_is_refused_as_pillow_refuses_it(tmp_path, kind):
    png = _png()
    body = _deflated(_raw_profile(6), 64 << 20)
    chunk = (_chunk(b"zTXt", b"Raw profile type exif\x00\x00" + body) if kind == "zTXt"
             else _chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x01\x00\x00\x00" + body))
    path = tmp_path / "bomb.png"
    path.write_bytes(png[:-12] + chunk + png[-12:])  # after the image data, where Pillow reads it on loading
    got, peak = _bounded(path)
    assert isinstance(got, ImageError) and "Pillow refuses" in str(got) and "MAX_TEXT_CHUNK" in str(got)
    assert _pillow(path) == "ValueError"  # "Decompressed data too large for PngImagePlugin.MAX_TEXT_CHUNK"
    assert peak < PEAK


def test_text_chunks_within_pillows_limits_are_read_as_pillow_reads_them(tmp_path):
    """A compressed raw profile just under 1 MiB once inflated, ahead of an XMP that says otherwise."""
    png = _png()
    text = _raw_profile(6)
    text += b" " * (PILLOW_TEXT_CHUNK - 1 - len(text))
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="3"/></x:xmpmeta>'
    path = tmp_path / "near.png"
    path.write_bytes(png[:-12] + _chunk(b"zTXt", b"Raw profile type exif\x00\x00" + zlib.compress(text))
                     + _chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + xmp) + png[-12:])
    got, peak = _bounded(path)
    assert got == _pillow(path) == (20, 30)
    assert peak < PEAK


def test_many_inflating_chunks_are_stopped_by_the_inflate_budget(tmp_path):
    png = _png()
    one = _chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"x" * (PILLOW_TEXT_CHUNK - 10)))
    count = INFLATE_BUDGET // PILLOW_TEXT_CHUNK + 4
    path = tmp_path / "many.png"
    path.write_bytes(png[:-12] + one * count + png[-12:])
    got, peak = _bounded(path)
    assert isinstance(got, OverBudget) and "inflate" in str(got)
    assert peak < PEAK


def _sparse(path, head: bytes, far: int, tail: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.seek(far)
        fh.write(tail)


def test_a_tiff_directory_300_mib_into_the_file(tmp_path):
    """The first directory at the end of a sparse 300 MiB file, its next pointer looping to itself."""
    far = 300 << 20
    entries = [(256, 3, 40), (257, 3, 30), (258, 3, 8), (262, 3, 1), (273, 4, 8), (274, 3, 3), (278, 3, 30),
               (279, 4, 1200)]
    ifd = struct.pack("<H", len(entries)) + b"".join(
        struct.pack("<HHI", tag, kind, 1) + (struct.pack("<HH", v, 0) if kind == 3 else struct.pack("<I", v))
        for tag, kind, v in entries) + struct.pack("<I", far)
    path = tmp_path / "far.tiff"
    _sparse(path, b"II*\x00" + struct.pack("<I", far), far, ifd)
    got, peak = _bounded(path)
    assert got == _pillow(path) == (40, 30)
    assert peak < PEAK


@pytest.mark.parametrize("fmt", ["png eXIf", "png tEXt"])
def test_a_chunk_that_declares_gigabytes_is_not_read(tmp_path, fmt):
    png = _png()
    big = 2 << 30
    kind = b"eXIf" if fmt == "png eXIf" else b"tEXt"
    path = tmp_path / "big.png"
    _sparse(path, png[:-12] + struct.pack(">I", big) + kind, len(png) - 12 + 8 + big, b"\x00" * 4 + png[-12:])
    got, peak = _bounded(path)
    assert isinstance(got, OverBudget) and f"{READ_BUDGET >> 20} MiB" in str(got)
    assert peak < PEAK


def test_hundreds_of_exif_segments_are_stopped_by_the_read_budget(tmp_path):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (30, 20)).save(buf, "JPEG")
    jpg = buf.getvalue()
    payload = b"Exif\x00\x00" + _exif(6)
    segment = b"\xff\xe1" + struct.pack(">H", 65535) + payload + b"\x00" * (65533 - len(payload))
    path = tmp_path / "segments.jpg"
    path.write_bytes(jpg[:2] + segment * 300 + jpg[2:])  # 19 MiB of EXIF, which Pillow joins
    got, peak = _bounded(path)
    assert isinstance(got, OverBudget)
    assert peak < PEAK


@pytest.mark.slow
def test_hundreds_of_thousands_of_chunks_are_not_walked_to_the_end(tmp_path):
    png = _png()
    path = tmp_path / "chunks.png"
    path.write_bytes(png[:-12] + _chunk(b"prVt", b"") * 300_000 + png[-12:])
    start = time.perf_counter()
    with pytest.raises(OverBudget, match="chunks"):
        image_size_from(path)
    assert time.perf_counter() - start < 3
    got, peak = _bounded(path)  # (tracemalloc slows it down)
    assert isinstance(got, OverBudget) and peak < PEAK


def test_special_files_are_refused_unread(tmp_path):
    """Read in a thread: were the FIFO opened, a writer opens it after 20 s to end the wait, and
    the test fails rather than hangs."""
    import threading

    from lengthscan.measure.images.refs import ImageProblem, image_sizes

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock.png"))
    (tmp_path / "folder.png").mkdir()
    got = []
    reading = threading.Thread(target=lambda: got.extend(
        image_sizes(["pipe.png", "sock.png", "folder.png", "/dev/zero"], str(tmp_path))), daemon=True)
    try:
        reading.start()
        reading.join(20)
        blocked = reading.is_alive()
        if blocked:  # a reader waits in open(): a writer lets it through, to an empty read
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reading.join(20)
    finally:
        server.close()
    assert not blocked, "reading an image blocked on a FIFO"
    assert all(isinstance(g, ImageProblem) and g.flag == "unreadable" for g in got)
    assert [g.reason.rsplit("(", 1)[1] for g in got] == ["a FIFO)", "a socket)", "a folder)", "a device)"]
    assert all("not a regular file" in g.reason for g in got)


@pytest.mark.slow
def test_audit_of_conversations_with_a_fifo_and_a_bomb_does_not_hang(tmp_path, qwen2_vl_dir):
    """The whole audit, in a subprocess under a timeout: each bad image is its row's reason."""
    from tests.support.vision import template_of, write_pictures

    folder = qwen2_vl_dir
    pics = write_pictures(tmp_path / "data")
    os.mkfifo(tmp_path / "data" / "pipe.png")
    png = _png()
    (tmp_path / "data" / "bomb.png").write_bytes(png[:-12] + _chunk(
        b"zTXt", b"Raw profile type exif\x00\x00" + _deflated(b"", 64 << 20)) + png[-12:])
    user = {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]}
    reply = {"role": "assistant", "content": "They differ."}
    rows = [{"messages": [user, reply], "images": [pics[0].name, "pipe.png"]},
            {"messages": [user, reply], "images": ["bomb.png", pics[1].name]},
            {"messages": [user, reply], "images": [pics[0].name, pics[1].name]}]
    src = tmp_path / "data" / "rows.jsonl"
    write_jsonl(src, rows)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(folder), "--chat-template",
         str(template_of("qwen2_vl")), "--messages", "messages", "--images", "images", "--processor", str(folder),
         "--full", "--no-cache", "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    assert t["chat_flag"] == ["unreadable", "unreadable", None]
    assert t["chat_error"][0].startswith("image 2 of 2: image 'pipe.png': not a regular file (a FIFO)")
    assert t["chat_error"][1].startswith("image 1 of 2: image 'bomb.png': a PNG zTXt chunk inflates past 1 MiB")
    assert t["sequence_tokens"][2] > 0
