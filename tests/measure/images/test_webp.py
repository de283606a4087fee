"""WebP sizes and orientations as Pillow opens them: real files written by Pillow whose image data
is over 64 KiB and whose EXIF chunk follows it (lossy and lossless, every orientation), read from
files and through the audit's image sizes; and the chunk rules of libwebp's demuxer (the VP8X flags
that admit EXIF and XMP, the first chunk of each, the RIFF size that bounds them), each against
``ImageOps.exif_transpose(Image.open(...)).size`` or Pillow's refusal."""

from __future__ import annotations

import io
import os
import random
import struct

import pytest

from lengthscan.measure.images.headers import ImageError, image_size, image_size_from

PIL = pytest.importorskip("PIL")

XMP = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
       b'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>')


def _exif(o: int) -> bytes:
    from PIL import Image

    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def _noise(size, seed: int):
    """An image that does not compress: its WebP's image data is as large as its pixels."""
    from PIL import Image

    return Image.frombytes("RGB", size, random.Random(seed).randbytes(size[0] * size[1] * 3))


def _pillow(path_or_bytes):
    from PIL import Image, ImageOps

    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with Image.open(src) as img:
        return ImageOps.exif_transpose(img).size


def _chunks(data: bytes) -> list:
    out, at = [], 12
    while at + 8 <= len(data):
        kind, length = struct.unpack_from("<4sI", data, at)
        out.append((kind, data[at + 8:at + 8 + length]))
        at += 8 + length + (length & 1)
    return out


@pytest.mark.parametrize("kwargs", [{"quality": 90}, {"lossless": True}], ids=["lossy", "lossless"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_after_image_data_past_64_kib(tmp_path, kwargs, orientation):
    from lengthscan.measure.images.refs import Seen, image_sizes

    path = tmp_path / "photo.webp"
    _noise((420, 260), orientation).save(path, "WEBP", exif=_exif(orientation), **kwargs)
    data = path.read_bytes()
    assert [k for k, _ in _chunks(data)] == [b"VP8X", b"VP8L" if kwargs.get("lossless") else b"VP8 ", b"EXIF"]
    assert data.rindex(b"EXIF") > 64 << 10  # past what the header reading used to see
    want = _pillow(path)
    assert image_size_from(path).oriented() == want
    assert image_size(path.read_bytes()).oriented() == want
    (seen,) = image_sizes([path.name], str(tmp_path))
    assert isinstance(seen, Seen) and (seen.width, seen.height) == want


def _build(parts, *, flags: int, riff_extra: int = 0, tail: bytes = b"") -> bytes:
    body = b"WEBP"
    for kind, value in parts:
        if kind == b"VP8X":
            value = bytes([flags]) + value[1:]
        body += kind + struct.pack("<I", len(value)) + value + (b"\x00" if len(value) & 1 else b"")
    return b"RIFF" + struct.pack("<I", len(body) + riff_extra) + body + tail


def _cases() -> dict:
    buf = io.BytesIO()
    _noise((360, 260), 7).save(buf, "WEBP", quality=90, exif=_exif(6))
    vp8x, image, _ = _chunks(buf.getvalue())
    assert len(image[1]) > 64 << 10
    exif6, exif3, xmp5 = (b"EXIF", _exif(6)), (b"EXIF", _exif(3)), (b"XMP ", XMP % 5)
    full = _build([vp8x, image, exif6], flags=0x08)
    short = len(_build([vp8x, image], flags=0x08))
    return {
        "exif flagged": _build([vp8x, image, exif6], flags=0x08),
        "exif not flagged": _build([vp8x, image, exif6], flags=0x00),
        "only the xmp flag, an exif chunk": _build([vp8x, image, exif6], flags=0x04),
        "xmp flagged": _build([vp8x, image, xmp5], flags=0x04),
        "exif 1 beside xmp 5": _build([vp8x, image, (b"EXIF", _exif(1)), xmp5], flags=0x0C),
        "two exif chunks (6, 3)": _build([vp8x, image, exif6, exif3], flags=0x08),
        "an empty exif chunk first": _build([vp8x, image, (b"EXIF", b""), exif6], flags=0x08),
        "exif before the image": _build([vp8x, exif6, image], flags=0x08),
        "an unknown chunk between": _build([vp8x, image, (b"ABCD", b"x" * 101), exif6], flags=0x08),
        "an odd-sized exif chunk": _build([vp8x, image, (b"EXIF", _exif(6) + b"\x00")], flags=0x08),
        "bytes after the riff": _build([vp8x, image, exif6], flags=0x08, tail=b"trailing"),
        "exif outside the riff": _build([vp8x, image, exif6], flags=0x08, riff_extra=short - len(full)),
        "a riff past the end": _build([vp8x, image, exif6], flags=0x08, riff_extra=1000),
        "the exif chunk cut short": full[:-10],
        "exif that is not tiff": _build([vp8x, image, (b"EXIF", b"garbage data here")], flags=0x08),
        "exif with its Exif prefix": _build([vp8x, image, (b"EXIF", b"Exif\x00\x00" + _exif(8))], flags=0x08),
        "no image chunk": _build([vp8x, exif6], flags=0x08),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_chunks_as_libwebp_reads_them(tmp_path, name):
    data = _cases()[name]
    path = tmp_path / "case.webp"
    path.write_bytes(data)
    try:
        want = _pillow(data)
    except Exception:  # noqa: BLE001 - Pillow refuses it: the processor cannot open it either
        with pytest.raises(ImageError):
            image_size_from(path)
        return
    assert image_size_from(path).oriented() == want


def test_a_declared_exif_chunk_of_gigabytes_is_not_read(tmp_path):
    """A sparse file whose EXIF chunk says 3 GiB: refused over the budget, nothing read of it."""
    import tracemalloc

    buf = io.BytesIO()
    _noise((40, 30), 1).save(buf, "WEBP", quality=80, exif=_exif(6))
    vp8x, image, _ = _chunks(buf.getvalue())
    head = _build([vp8x, image], flags=0x08)
    big = 3 << 30
    path = tmp_path / "big.webp"
    with open(path, "wb") as fh:
        fh.write(b"RIFF" + struct.pack("<I", len(head) - 8 + 8 + big) + head[8:] + b"EXIF" + struct.pack("<I", big))
        fh.truncate(len(head) + 8 + big)
    tracemalloc.start()
    try:
        with pytest.raises(ImageError, match="MiB of header and metadata"):
            image_size_from(path)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()
    os.remove(path)
