"""Video metadata from headers against PyAV: how long lengthscan takes to learn what each video
holds (``measure.video.headers.video_info_from``: frames, the span of their presentation times,
coded size, rotation) against what a user's script pays for the same: opening each file with PyAV
and counting its packets (``container.demux``: what torchcodec's exact scan does, no decoding),
decoding every frame (what the processor's decoder pays before it counts anything), and the script
that counts tokens by running the processor: every frame decoded, the frames kept at 2 a second
(``--fps 2``) resized and normalized by Qwen2-VL's image processor (Pillow backend; the video
processor class needs torchvision, which this machine has not: its per-frame pixels are the image
processor's) and their grids summed as video tokens, against lengthscan's count from the headers
with the same options (``count_video``), whose tokens are printed beside it.

    python bench/video_bench.py                # 60 clips, about a minute on 2 cores
    python bench/video_bench.py --clips 20

The clips are written once to ~/.cache/lengthscan-bench/videos: MP4 (H.264, fragmented and not),
MOV (MPEG-4), WebM (VP9), Matroska (H.264), AVI (MJPEG), 2 to 20 seconds at 24 to 60 fps, sizes up
to 640x360. Each side runs over every clip (the page cache warm for all sides alike), median of
``--repeats``. Printed: seconds per side, files per second, the ratios, and a check that the
headers' frames and durations equal what PyAV's demuxing finds, clip by clip.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

ROOT = Path.home() / ".cache" / "lengthscan-bench" / "videos"
KINDS = [("mp4", "libx264", {}), ("mp4", "libx264", {"movflags": "frag_keyframe+empty_moov"}), ("mov", "mpeg4", {}),
         ("webm", "libvpx-vp9", {}), ("mkv", "libx264", {}), ("avi", "mjpeg", {})]


def build(n: int) -> list[Path]:
    from tests.support.video import make_clip

    ROOT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    out = []
    for i in range(n):
        suffix, codec, options = KINDS[i % len(KINDS)]
        path = ROOT / f"clip{i:03d}.{suffix}"
        rate = rng.choice([24, 25, 30, Fraction(30000, 1001), 60])
        seconds = rng.uniform(2, 20)
        size = rng.choice([(320, 180), (640, 360), (426, 240), (322, 182)])
        if not path.exists():
            make_clip(path, codec=codec, rate=rate, frames=int(seconds * float(rate)), size=size, options=options)
        out.append(path)
    return out


def headers(paths: list[Path]) -> list:
    from lengthscan.measure.video.headers import video_info_from

    return [video_info_from(p) for p in paths]


def demuxed(paths: list[Path]) -> list:
    """Frames and presentation span per clip, as a script with PyAV finds them (packets, no decoding)."""
    import av

    out = []
    for p in paths:
        with av.open(str(p)) as c:
            s = c.streams.video[0]
            packets = [(k.pts, k.duration or 0) for k in c.demux(video=0) if k.size and k.pts is not None]
            span = (max(a + d for a, d in packets) - min(a for a, _ in packets)) * s.time_base
            out.append((len(packets), float(span)))
    return out


def decoded(paths: list[Path]) -> list[int]:
    import av

    out = []
    for p in paths:
        with av.open(str(p)) as c:
            out.append(sum(1 for _ in c.decode(video=0)))
    return out


def processed(paths: list[Path]) -> list[int]:
    """The user's script: decode, keep 2 frames a second, run the image processor, sum the grids."""
    import av
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)
    out = []
    for p in paths:
        with av.open(str(p)) as c:
            stream = c.streams.video[0]
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
            rate = float(stream.average_rate or 24)
        step = max(1, round(rate / 2))
        kept = frames[::step][: len(frames[::step]) // 2 * 2] or frames[:1]
        grid = proc(images=kept, return_tensors="np")["image_grid_thw"]
        out.append(int(sum(int(t) * int(h) * int(w) for t, h, w in grid) // 4 // 2))  # frame pairs merge
    return out


def counted(paths: list[Path]) -> list[int]:
    """lengthscan's count of the same, from the headers (2 frames a second, the same pixel bounds)."""
    from lengthscan.measure.video.headers import video_info_from
    from lengthscan.measure.video.qwen import VideoOptions, count_video

    options = VideoOptions.from_config("qwen2", {"min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28}, fps=2)
    return [count_video(video_info_from(p), options).tokens for p in paths]


def timed(fn, paths, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn(paths)
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    paths = build(args.clips)
    for p in paths:  # the page cache warm for every side
        p.read_bytes()
    t_head, infos = timed(headers, paths, args.repeats)
    t_demux, packets = timed(demuxed, paths, args.repeats)
    t_decode, frames = timed(decoded, paths, 1)
    t_script, script_tokens = timed(processed, paths, 1)
    t_count, tokens = timed(counted, paths, args.repeats)
    same = all(i.frames == n == f and abs(i.duration - span) < 1e-6
               for i, (n, span), f in zip(infos, packets, frames))
    total = sum(frames)
    print(f"video metadata, {len(paths)} clips ({total:,} frames; MP4, fragmented MP4, MOV, WebM, MKV, AVI), "
          f"median of {args.repeats}; frames and durations equal PyAV's on every clip: {same}")
    print("| side | seconds | files/s |")
    print("|---|---:|---:|")
    for name, t in (("lengthscan headers (video_info_from)", t_head), ("PyAV: open and demux every packet", t_demux),
                    ("PyAV: decode every frame", t_decode),
                    ("lengthscan video tokens (headers + count_video, fps 2)", t_count),
                    ("the user's script: decode, 2 frames a second through the image processor", t_script)):
        print(f"| {name} | {t:.3f} | {len(paths) / t:,.0f} |")
    print(f"\nheaders vs demuxing: {t_demux / t_head:.1f}x; vs decoding: {t_decode / t_head:.0f}x; "
          f"token counts vs the user's script: {t_script / t_count:.0f}x "
          f"({sum(tokens):,} tokens counted; the script's grids: {sum(script_tokens):,})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
