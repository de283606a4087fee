"""Image tokens from headers against decoding: how long lengthscan takes to learn what each image
costs (header reads, ``measure.images.refs.image_sizes``, then the processor's own count) against
opening and decoding every image with Pillow (``PIL.Image.open(p).convert("RGB")``, with the EXIF
orientation applied as ``load_image`` does), which is what a trainer's preprocessing pays
(LLaMA-Factory decodes every image to expand its tokens), and against the processor run on the
decoded images (the image processor's own resize and patching).

    python bench/image_bench.py                 # 400 images, ~2 minutes on 2 cores
    python bench/image_bench.py --images 100

The images are written once to ~/.cache/lengthscan-bench/images: JPEG photos of 1 to 24
megapixels (some with EXIF orientation 6), PNG screenshots, WebP, all of real content (noise over
gradients, so the decoders do real work). Each side runs cold-ish (the files are read once before,
so the page cache holds them for all sides alike), median of ``--repeats``. Printed: seconds per
side, images per second, the ratios, and a check that the header sizes equal the decoded sizes and
that every image's token count equals the processor's on the decoded image.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

ROOT = Path.home() / ".cache" / "lengthscan-bench" / "images"
QWEN2_VL = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
            "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}


def build(n: int) -> list[Path]:
    import numpy as np
    from PIL import Image

    folder = ROOT / f"n{n}"
    done = folder / "done"
    if done.exists():
        return sorted(p for p in folder.iterdir() if p.suffix in (".jpg", ".png", ".webp"))
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = [(4000, 3000), (6000, 4000), (1920, 1080), (1024, 768), (3024, 4032), (800, 600), (2560, 1440)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        grad = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * np.ones((h, 1, 3), np.float32)
        noise = rng.normal(0, 24, (h // 8 + 1, w // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)[:h, :w]
        img = Image.fromarray(np.clip(grad + noise, 0, 255).astype(np.uint8))
        kind = ("jpg", "jpg", "jpg", "png", "webp")[i % 5]
        path = folder / f"img{i:04d}.{kind}"
        if kind == "jpg":
            exif = Image.Exif()
            if i % 3 == 0:
                exif[0x0112] = 6
            img.save(path, quality=88, exif=exif)
        elif kind == "png":
            img.save(path, compress_level=3)
        else:
            img.save(path, quality=80)
        out.append(path)
    done.write_text("ok")
    return out


def headers(paths: list[Path]) -> list:
    from lengthscan.measure.images.refs import image_sizes

    return [(s.width, s.height) for s in image_sizes([str(p) for p in paths], None)]


def decoded(paths: list[Path]) -> list:
    from PIL import Image, ImageOps

    out = []
    for p in paths:
        with Image.open(p) as img:
            out.append(ImageOps.exif_transpose(img).convert("RGB").size)
    return out


def timed(fn, *args, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    paths = build(args.images)
    for p in paths:  # every side finds the files in the page cache
        p.read_bytes()
    megabytes = sum(p.stat().st_size for p in paths) / 1e6

    proc_dir = ROOT / "qwen2_vl"
    proc_dir.mkdir(parents=True, exist_ok=True)
    (proc_dir / "preprocessor_config.json").write_text(json.dumps(QWEN2_VL))
    from transformers import AutoImageProcessor

    image_processor = AutoImageProcessor.from_pretrained(proc_dir)

    t_head, sizes = timed(headers, paths, repeats=args.repeats)
    t_count, tokens = timed(lambda s: [image_processor.get_number_of_image_patches(h, w, {}) // 4 for w, h in s],
                            sizes, repeats=args.repeats)
    t_dec, want = timed(decoded, paths, repeats=args.repeats)
    assert sizes == want, "header sizes differ from the decoded sizes"

    from PIL import Image, ImageOps

    sample = paths[: max(1, len(paths) // 10)]
    start = time.perf_counter()
    for p, n in zip(sample, tokens):
        with Image.open(p) as img:
            grid = image_processor(ImageOps.exif_transpose(img).convert("RGB"))["image_grid_thw"]
        assert int(grid.prod()) // 4 == n, p
    t_proc = (time.perf_counter() - start) * len(paths) / len(sample)

    ours = t_head + t_count
    print(f"{len(paths)} images, {megabytes:,.0f} MB, {sum(tokens):,} Qwen2-VL image tokens "
          f"(median of {args.repeats}; the processor side from {len(sample)} images, scaled)")
    print(f"  lengthscan (header sizes + the processor's count) {ours:8.3f} s  {len(paths) / ours:10,.0f} images/s")
    print(f"  PIL.Image.open(...).convert() decoding            {t_dec:8.3f} s  {len(paths) / t_dec:10,.0f} images/s")
    print(f"  decoding + the image processor (Qwen2-VL)          {t_dec + t_proc:8.3f} s")
    print(f"  decode / lengthscan: {t_dec / ours:,.0f}x;  decode+process / lengthscan: {(t_dec + t_proc) / ours:,.0f}x")
    print("  checks: header sizes == decoded sizes for every image; tokens == the processor's on "
          f"{len(sample)} decoded images")


if __name__ == "__main__":
    main()
