"""Plain-language findings about the videos of conversations, from ``report.json``'s dict: the video
tokens' share of the sequence, the costliest videos, and for each sequence limit the longest rows
with videos over it, with the ``--fps`` that makes them fit.

The ``--fps`` is exact for the processors that repeat their video token (Qwen2-VL, Qwen2.5-VL): the
longest rows' videos are counted again (``measure.video.qwen``) from the metadata the report keeps
of them, at sampling rates going down, until every one of those rows fits; the row's other tokens
stay as they are (the video tokens are the only part a rate changes)."""

from __future__ import annotations

from dataclasses import replace

from lengthscan.report.chat_findings import sequence_limits
from lengthscan.report.fmt import share

#: frame rates tried for ``--fps``, highest first
RATES = (8, 6, 5, 4, 3, 2, 1.5, 1, 0.75, 0.5, 0.25, 0.1)


def video_findings(data: dict) -> list[str]:
    """Sentences about the videos of the report's conversations (``[]`` without videos)."""
    counter = (data.get("chat") or {}).get("videos")
    if not counter:
        return []
    splits = [s for s in data.get("splits", []) if (s.get("chat") or {}).get("videos")]
    multi = len(splits) > 1
    out: list[str] = []
    for split in splits:
        where = f" of split {split['split']}" if multi else ""
        vd = split["chat"]["videos"]
        if not vd["videos"]:
            continue
        out.append(f"Videos take {share(vd['video_tokens'], vd['sequence_tokens'])} of the sequence tokens{where} "
                   f"({vd['video_tokens']:,} of {vd['sequence_tokens']:,}): {vd['videos']:,} videos in "
                   f"{vd['rows_with_videos']:,} rows, {vd['video_seconds']:,.1f} s, as {counter['video_processor']} "
                   f"counts them.")
        top = vd["costliest"][:3]
        if top:
            listed = "; ".join(f"row {c['row']} ({c['frames']:,} frames kept): {c['video_tokens']:,}" for c in top)
            out.append(f"The costliest videos{where}, in tokens: {listed}.")
        for limit, origin in sequence_limits(data, split):
            sentence = _fit_sentence(vd["longest"], limit, origin, counter, where)
            if sentence:
                out.append(sentence)
    return out


def fitting_fps(longest: list, limit: int, counter: dict) -> float | None:
    """The highest rate of ``RATES`` at which every row of ``longest`` over ``limit`` fits (None:
    none does, or the processor's counts are not recomputed here)."""
    options = _options(counter)
    over = [r for r in longest if r["sequence_tokens"] > limit]
    if options is None or not over or any(len(r.get("metadata") or ()) != r["videos"] for r in over):
        return None
    from lengthscan.measure.video.info import VideoInfo
    from lengthscan.measure.video.qwen import VideoRefused, count_video

    for fps in RATES:
        trial = replace(options, fps=fps, num_frames=None, do_sample_frames=True)
        try:
            fits = True
            for r in over:
                others = r["sequence_tokens"] - r["video_tokens"] + r["videos"]  # one placeholder a video
                tokens = sum(count_video(VideoInfo(f / v if v else 0.0, f, v, w, h, rot), trial).tokens - 1
                             for f, v, w, h, rot in r["metadata"])
                fits &= others + tokens <= limit
        except VideoRefused:
            continue
        if fits:
            return fps
    return None


def _options(counter: dict):
    """The counter's options as ``qwen.VideoOptions`` for a processor that repeats its video token
    (Qwen2-VL's family), else None."""
    from lengthscan.measure.video.qwen import DEFAULTS, VideoOptions

    if counter.get("video_processor") not in ("Qwen2VLVideoProcessor", "Qwen2VLProcessor", "Qwen2_5_VLProcessor"):
        return None
    o = counter.get("options") or {}
    known = {k: o[k] for k in DEFAULTS["qwen2"] if k in o and o[k] is not None}
    return VideoOptions(family="qwen2", **{**DEFAULTS["qwen2"], **known})


def _fit_sentence(longest: list, limit: int, origin: str, counter: dict, where: str) -> str | None:
    over = [r for r in longest if r["sequence_tokens"] > limit]
    if not over:
        return None
    rows = ", ".join(str(r["row"]) for r in over[:5])
    text = f"The longest rows with videos{where} (rows {rows}) exceed {limit:,} tokens ({origin})"
    fps = fitting_fps(longest, limit, counter)
    if fps is not None:
        return text + (f": sampling {fps:g} frames a second makes them fit (check with --fps {fps:g}; in training, "
                       f"fps={fps:g} to the processor), or drop them (--limit 'sequence_tokens<={limit}').")
    cap = min(limit - (r["sequence_tokens"] - r["video_tokens"]) for r in over)
    return text + (f": drop rows whose videos cost more (--limit 'video_tokens<={max(cap, 0):,}'), or sample fewer "
                   "frames (try --fps or --num-frames).")
