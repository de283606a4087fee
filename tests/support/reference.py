"""Reference computations the tests compare against."""

from __future__ import annotations


def direct_counts(tok_dir, texts, role: str) -> list[int | None]:
    """The reference: one plain ``AutoTokenizer`` call per text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    out = []
    for t in texts:
        if t is None:
            out.append(None)
        elif role == "target":
            out.append(len(tok(text_target=t)["input_ids"]))
        else:
            out.append(len(tok(t)["input_ids"]))
    return out
