"""A batch function for ``Dataset.map(batched=True)``: each row's image tokens, as the model's
processor expands its images, from the images' headers (never decoded).

Like ``mapping.token_lengths``, it takes its options as plain values (the processor and tokenizer
as names or folders, the column), so ``datasets`` fingerprints the map from them.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4)
def _image_counter(processor: str, tokenizer: str, max_pixels: int | None, pan_and_scan: bool):
    from lengthscan.measure.images.processor import ImageCounter
    from lengthscan.measure.text.loading import load_tokenizer

    counter = ImageCounter(processor, load_tokenizer(tokenizer), max_pixels=max_pixels, pan_and_scan=pan_and_scan)
    counter.check()
    return counter


def image_tokens(batch: dict, *, processor: str, tokenizer: str | None = None, images: str = "images",
                 max_pixels: int | None = None, pan_and_scan: bool = False, base_dir: str | None = None) -> dict:
    """``image_tokens`` (the row's images' tokens summed) and ``num_images`` per row of one batch;
    ``image_tokens`` is None for a row with a missing or unreadable image. ``images`` names the
    column of per-row image lists (paths, relative to ``base_dir``; bytes; ``Image(decode=False)``
    values), which is left as it is (a count named ``images`` would replace it in ``Dataset.map``);
    ``tokenizer`` defaults to ``processor``; ``max_pixels`` and ``pan_and_scan`` as the audit's
    ``--max-pixels`` and ``--pan-and-scan``."""
    from lengthscan.measure.images.processor import ImageRefused
    from lengthscan.measure.images.refs import ImageProblem, image_sizes

    counter = _image_counter(str(processor), str(tokenizer or processor), max_pixels, bool(pan_and_scan))
    rows = [r if isinstance(r, (list, tuple)) else ([] if r is None else [r]) for r in batch[images]]
    seen = image_sizes([ref for r in rows for ref in r], base_dir)
    tokens, counts, at = [], [], 0
    for r in rows:
        mine = seen[at:at + len(r)]
        at += len(r)
        counts.append(len(r))
        if any(isinstance(s, ImageProblem) for s in mine):
            tokens.append(None)
            continue
        try:
            tokens.append(sum(e.tokens for e in counter.expand([(s.height, s.width) for s in mine])))
        except ImageRefused:
            tokens.append(None)
    return {"image_tokens": tokens, "num_images": counts}
