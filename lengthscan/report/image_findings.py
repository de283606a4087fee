"""Plain-language findings about the images of conversations, from ``report.json``'s dict (pure, no
I/O): the image tokens' share of the sequence, the costliest images, and for each sequence limit
the longest rows with images over it, with the ``--max-pixels`` cap (for processors that have one)
or the ``image_tokens`` rule that makes them fit."""

from __future__ import annotations

from lengthscan.report.chat_findings import sequence_limits
from lengthscan.report.fmt import share


def image_findings(data: dict) -> list[str]:
    """Sentences about the images of the report's conversations (``[]`` without images)."""
    chat = data.get("chat") or {}
    processor = chat.get("images")
    if not processor:
        return []
    splits = [s for s in data.get("splits", []) if (s.get("chat") or {}).get("images")]
    multi = len(splits) > 1
    out: list[str] = []
    for split in splits:
        where = f" of split {split['split']}" if multi else ""
        im = split["chat"]["images"]
        if not im["images"]:
            out.append(f"No conversation{where} has an image.")
            continue
        out.append(f"Images take {share(im['image_tokens'], im['sequence_tokens'])} of the sequence tokens{where} "
                   f"({im['image_tokens']:,} of {im['sequence_tokens']:,}): {im['images']:,} images in "
                   f"{im['rows_with_images']:,} rows, as {processor['processor']} expands them.")
        top = im["costliest"][:3]
        if top:
            listed = "; ".join(f"row {c['row']} ({c['width']:,}x{c['height']:,}): {c['image_tokens']:,}"
                               for c in top)
            out.append(f"The costliest images{where}, in tokens: {listed}.")
        for limit, origin in sequence_limits(data, split):
            sentence = _fit_sentence(im["longest"], limit, origin, processor, where)
            if sentence:
                out.append(sentence)
    return out


def pixels_per_token(processor: dict) -> int | None:
    """Pixels per image token of a processor whose ``max_pixels`` caps its images (Qwen2-VL and its
    successors: one token per (patch_size x merge_size)^2 pixels), else None."""
    options = processor.get("options") or {}
    size = options.get("size") or {}
    if processor.get("family") != "repeat" or "longest_edge" not in size or not options.get("merge_size"):
        return None
    side = int(options["patch_size"]) * int(options["merge_size"])
    return side * side


def _fit_sentence(longest: list, limit: int, origin: str, processor: dict, where: str) -> str | None:
    """The longest rows with images over ``limit``, and the per-image cap that makes them fit."""
    over = [r for r in longest if r["sequence_tokens"] > limit]
    if not over:
        return None
    text_only = [r["sequence_tokens"] - r["image_tokens"] + r["images"] for r in over]
    if any(t > limit for t in text_only):
        return (f"{len(over)} of the longest rows with images{where} exceed {limit:,} tokens ({origin}), some even "
                f"without their images: drop them (--limit 'sequence_tokens<={limit}').")
    cap = min((limit - t) // r["images"] for t, r in zip(text_only, over))
    rows = ", ".join(str(r["row"]) for r in over[:5])
    text = (f"The longest rows with images{where} (rows {rows}) exceed {limit:,} tokens ({origin}) because of "
            f"their images: at most {cap:,} tokens an image would make them fit")
    per = pixels_per_token(processor)
    if per is not None and cap > 0:
        pixels = cap * per
        return text + (f": set the image processor's max_pixels to {pixels:,} (check with --max-pixels {pixels}), "
                       f"or drop them (--limit 'image_tokens<={cap * min(r['images'] for r in over)}').")
    return text + (f"; drop rows whose images cost more (--limit 'image_tokens<={max(cap, 0):,}') or shrink the "
                   "images before training.")
