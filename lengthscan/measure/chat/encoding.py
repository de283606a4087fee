"""Rendered conversations tokenized as ``apply_chat_template`` tokenizes them: the rendering
through the tokenizer with ``add_special_tokens=False``, by the backend where the counter has proven
that it gives ``__call__``'s ids (``TokenCounter.fast_backend`` for the chat role), in chunks."""

from __future__ import annotations

from lengthscan.measure.text.chunking import chunks
from lengthscan.measure.text.counter import CHAT_ROLE, CHUNK_CHARS


def rendered_encodings(counter, texts: list[str]) -> list | None:
    """A ``tokenizers.Encoding`` per text; None for a tokenizer without them (a Python one)."""
    return _tokenized(counter, texts, _encodings, lambda enc: getattr(enc, "encodings", None))


def rendered_ids(counter, texts: list[str]) -> list[tuple[list, None]]:
    """(ids, None) per text: the ids alone (message texts tokenized apart; Python tokenizers)."""
    return _tokenized(counter, texts, _ids, lambda enc: [(ids, None) for ids in enc["input_ids"]])


def rendered_lengths(counter, texts: list[str]) -> list[int]:
    """Tokens per text tokenized alone without special tokens: by the count-only engine's tokens
    in a worker that holds no tokenizer (``apart.TiledCounter``), else as ``rendered_ids``."""
    from lengthscan.measure.chat.apart import TiledCounter

    if isinstance(counter, TiledCounter):
        return counter.rendered_lengths(texts) if texts else []
    return [len(ids) for ids, _ in rendered_ids(counter, texts)]


def _encodings(backend, part: list[str]) -> list:
    return backend.encode_batch(part, add_special_tokens=False)


def _ids(backend, part: list[str]) -> list:
    return [(e.ids, None) for e in backend.encode_batch_fast(part, add_special_tokens=False)]


def _tokenized(counter, texts: list[str], by_backend, by_call) -> list | None:
    """``texts`` in chunks, by the proven backend or by the tokenizer's own call (None when
    ``by_call`` finds nothing to return)."""
    if not texts:
        return []
    backend = counter.fast_backend(CHAT_ROLE, texts)
    out: list = []
    for start, stop in chunks(texts, CHUNK_CHARS):
        part = texts[start:stop]
        if backend is not None:
            out += by_backend(backend, part)
            continue
        got = by_call(counter.tokenizer(part, add_special_tokens=False))
        if got is None:
            return None
        out += got
    return out
