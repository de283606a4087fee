"""Where an image's orientation or size hides, found by a review against Pillow: XMP orientation
(JPEG, PNG, WebP), ImageMagick's "Raw profile type exif" text, two EXIF segments (Pillow keeps the
first), a GIF whose first frame is larger than its screen, cut-short WebP headers; each compared
with ``ImageOps.exif_transpose(Image.open(...)).size``, as ``load_image`` opens images."""

from __future__ import annotations

import io
import struct
import zlib

import pytest

from lengthscan.measure.images.headers import ImageError, image_size

PIL = pytest.importorskip("PIL")

XMP = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
       b'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>')


def _exif(o: int) -> bytes:
    from PIL import Image

    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def _encoded(fmt: str, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (300, 100), (200, 10, 10)).save(buf, fmt, **kw)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _segment(payload: bytes) -> bytes:
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _cases() -> dict:
    png, jpg = _encoded("PNG"), _encoded("JPEG")
    raw = _exif(6)
    hexed = raw.hex()
    text = (b"Raw profile type exif\x00" + (f"\nexif\n{len(raw):8d}\n").encode()
            + "\n".join(hexed[i:i + 72] for i in range(0, len(hexed), 72)).encode() + b"\n")
    gif = bytearray(_encoded("GIF"))
    gif[6:10] = struct.pack("<HH", 10, 10)  # a 10x10 screen, a 300x100 first frame
    out = {
        "png raw profile": png[:33] + _chunk(b"tEXt", text) + png[33:],
        "png zTXt raw profile": png[:33] + _chunk(b"zTXt", text.split(b"\x00")[0] + b"\x00\x00"
                                                   + zlib.compress(text.split(b"\x00", 1)[1])) + png[33:],
        "png xmp": png[:33] + _chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + XMP % 6) + png[33:],
        "png exif over xmp": png[:33] + _chunk(b"eXIf", _exif(1)) + _chunk(
            b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + XMP % 6) + png[33:],
        "png two eXIf (6, 1)": png[:33] + _chunk(b"eXIf", _exif(6)) + _chunk(b"eXIf", _exif(1)) + png[33:],
        "png two xmp (1, 6)": png[:33] + _chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + XMP % 1)
        + _chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + XMP % 6) + png[33:],
        "jpeg xmp": jpg[:2] + _segment(b"http://ns.adobe.com/xap/1.0/\x00" + XMP % 8) + jpg[2:],
        "jpeg two exif (6, 1)": jpg[:2] + _segment(b"Exif\x00\x00" + _exif(6)) + _segment(b"Exif\x00\x00" + _exif(1))
        + jpg[2:],
        "jpeg two exif (1, 6)": jpg[:2] + _segment(b"Exif\x00\x00" + _exif(1)) + _segment(b"Exif\x00\x00" + _exif(6))
        + jpg[2:],
        "gif big first frame": bytes(gif),
    }
    try:
        out["webp xmp"] = _encoded("WEBP", xmp=XMP % 5)
    except TypeError:  # a Pillow without xmp= for WebP
        pass
    return out


@pytest.mark.parametrize("name", list(_cases()))
def test_orientation_and_size_as_pillow_opens_them(name):
    from PIL import Image, ImageOps

    data = _cases()[name]
    with Image.open(io.BytesIO(data)) as img:
        want = ImageOps.exif_transpose(img).size
    assert image_size(data).oriented() == want


@pytest.mark.parametrize("data", [b"RIFF\x00\x00\x00\x00WEBPVP8X", b"RIFF\x00\x00\x00\x00WEBPVP8X\x00\x00\x00\x00\x08",
                                  b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00"])
def test_cut_short_webp_headers_are_unreadable(data):
    with pytest.raises(ImageError):
        image_size(data)


def test_paths_with_a_nul_and_images_over_pillows_limit_get_reasons(tmp_path):
    from PIL import Image

    from lengthscan.measure.images.refs import ImageProblem, image_sizes

    png = _encoded("PNG")
    ihdr = struct.pack(">II", 20000, 10000) + png[24:29]  # the header says 200 megapixels
    (tmp_path / "huge.png").write_bytes(png[:8] + _chunk(b"IHDR", ihdr) + png[33:])
    got = image_sizes(["a\x00b.png", "huge.png"], str(tmp_path))
    assert all(isinstance(g, ImageProblem) for g in got)
    assert "null" in got[0].reason and "decompression-bomb" in got[1].reason
    with pytest.raises(Image.DecompressionBombError):  # what the processor's load_image meets
        Image.open(tmp_path / "huge.png")
