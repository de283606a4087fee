"""Image sizes from headers against Pillow's decoded images, for every format and orientation."""

from __future__ import annotations

import io

import pytest

from lengthscan.measure.images.headers import ImageError, image_size, image_size_from
from tests.support.vision import system_images

PIL = pytest.importorskip("PIL")


def _image(size, mode="RGB"):
    from PIL import Image

    img = Image.new(mode, size)
    img.putpixel((0, 0), (255, 0, 0) if mode == "RGB" else 255)
    return img


@pytest.mark.parametrize("fmt,kwargs", [
    ("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("WEBP", {"lossless": True}),
    ("WEBP", {"quality": 80}), ("GIF", {}), ("BMP", {}), ("TIFF", {}), ("TIFF", {"compression": "tiff_lzw"}),
])
@pytest.mark.parametrize("size", [(1, 1), (37, 5), (640, 480), (3001, 17)])
def test_sizes_equal_pillows(fmt, kwargs, size):
    from PIL import Image

    buf = io.BytesIO()
    _image(size).save(buf, fmt, **kwargs)
    got = image_size(buf.getvalue())
    assert (got.width, got.height) == Image.open(io.BytesIO(buf.getvalue())).size == size


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_as_exif_transpose_applies_it(fmt, orientation, tmp_path):
    from PIL import Image, ImageOps

    img = _image((40, 25))
    exif = Image.Exif()
    exif[274] = orientation
    path = tmp_path / f"o.{fmt.lower()}"
    img.save(path, fmt, exif=exif.tobytes())
    got = image_size_from(path)
    with Image.open(path) as opened:
        assert got.oriented() == ImageOps.exif_transpose(opened).size


def test_a_jpeg_whose_size_follows_a_big_segment_is_read_past_the_head(tmp_path):
    from PIL import Image

    path = tmp_path / "icc.jpg"
    _image((123, 45)).save(path, "JPEG", icc_profile=b"\0" * 200_000)
    assert (image_size_from(path).width, image_size_from(path).height) == Image.open(path).size


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xd9", b"GIF89a"])
def test_unreadable_headers_say_why(data):
    with pytest.raises(ImageError):
        image_size(data)


@pytest.mark.slow
def test_the_machines_own_images_read_as_pillow_opens_them():
    from PIL import Image, ImageOps

    files = system_images()
    if len(files) < 20:
        pytest.skip("fewer than 20 image files on this machine")
    checked = 0
    for path in files:
        try:
            with Image.open(path) as img:
                want = ImageOps.exif_transpose(img).size
        except Exception:  # noqa: BLE001 - a file Pillow cannot open either: not a check of ours
            continue
        got = image_size_from(path)
        assert got.oriented() == want, path
        checked += 1
    assert checked >= 20
