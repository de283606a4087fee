"""Rendered conversations tokenized as ``apply_chat_template`` tokenizes them: the rendering
through the tokenizer with ``add_special_tokens=False``, by the backend where the counter has proven
that it gives ``__call__``'s ids (``TokenCounter.fast_backend`` for the chat role), in chunks."""

from __future__ import annotations

from lengthscan.measure.text.counter import CHAT_ROLE, CHUNK_CHARS, chunks


def rendered_encodings(counter, texts: list[str]) -> list | None:
    """A ``tokenizers.Encoding`` per text; None for a tokenizer without them (a Python one)."""
    if not texts:
        return []
    backend = counter.fast_backend(CHAT_ROLE, texts)
    out: list = []
    for start, stop in chunks(texts, CHUNK_CHARS):
        part = texts[start:stop]
        if backend is not None:
            out += backend.encode_batch(part, add_special_tokens=False)
            continue
        encodings = getattr(counter.tokenizer(part, add_special_tokens=False), "encodings", None)
        if encodings is None:
            return None
        out += encodings
    return out


def rendered_ids(counter, texts: list[str]) -> list[tuple[list, None]]:
    """(ids, None) per text: the ids alone (message texts tokenized apart; Python tokenizers)."""
    if not texts:
        return []
    backend = counter.fast_backend(CHAT_ROLE, texts)
    out: list = []
    for start, stop in chunks(texts, CHUNK_CHARS):
        part = texts[start:stop]
        if backend is not None:
            out += [(e.ids, None) for e in backend.encode_batch_fast(part, add_special_tokens=False)]
        else:
            out += [(ids, None) for ids in counter.tokenizer(part, add_special_tokens=False)["input_ids"]]
    return out
