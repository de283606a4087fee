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


def proven_first(tok_dir) -> None:
    """The count-only engine of ``tok_dir`` proven in this process now. A run whose process has not
    proven it yet proves it beside its counting and says so in report.json (how many texts the
    tokenizer counted first, by timing); worker processes and Ray actors prove it before counting.
    Tests comparing two runs' counting tallies call this first, so that the order tests ran in does
    not decide what the first run reports."""
    from lengthscan.measure.text.counter import TokenCounter

    TokenCounter(str(tok_dir)).count(["proven before the runs compared"], "input")
