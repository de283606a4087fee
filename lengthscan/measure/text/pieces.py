r"""A lower bound on token counts without tokenizing: the pre-tokenizer's pieces.

A pre-tokenizer cuts a text into pieces and the model makes at least one token of every piece
(BPE: whenever the piece's characters are in its vocabulary; WordPiece: ``[UNK]`` at worst). So
anything that provably counts no more than the pieces counts no more than the tokens. We count
*run starts* over the ASCII characters of the normalized text, in one vectorized byte scan. Only
ASCII characters are classified (a letter ``[A-Za-z]``, a digit ``[0-9]``, ASCII punctuation,
ASCII whitespace ``\t \n \r`` and space); anything else (non-ASCII, control characters) is
*unknown*, and a run start is never counted right after an unknown character (it might continue
the run: ``é`` is a letter, ``²`` a digit, ``\x1c`` is neither space nor letter to the regex).

Each rule is proven for exactly one family of pre-tokenizers, by reading its regex:

``gpt2``
    GPT-2's byte-level regex ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``
    puts runs of letters, digits and other non-space characters in different pieces, and a piece
    holds at most one such run after an optional leading space, except a contraction: an
    apostrophe and the letters after it. So a start of a letter, digit or other run is counted
    where the character before is whitespace or of another known class; a letter right after an
    apostrophe never.
``llama3``
    The split regex of Llama 3 (``(?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...``)
    and Qwen 2 (``\p{N}`` alone): as ``gpt2``, but one non-letter, non-digit character may lead a
    run of letters (``(foo`` is one piece), so a letter right after other punctuation is never
    counted.
``bert``
    BERT's pre-tokenizer splits at whitespace and isolates every punctuation character (all ASCII
    punctuation is): every ASCII punctuation character is a piece, and a run of letters and
    digits starts one after whitespace or punctuation.

Two counted positions never fall in one piece, so ``run starts <= pieces <= tokens - specials``
(the post-processor must add a fixed number). The runs are counted on the normalized text of a
prefix cut at a space (a character-wise normalizer cannot act across it), so the prefix's runs
are runs of the whole normalized text. Texts holding an added token near the counted part are
left out (an added token is one token however many runs it spells). ``tests/measure/text/test_bounds.py``
checks the claim against the pre-tokenizer's own pieces on thousands of adversarial texts.
"""

from __future__ import annotations

import numpy as np

#: The pre-tokenizer regexes of the ``llama3`` rule, exactly as ``tokenizer.json`` spells them.
LLAMA3_PATTERNS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
UNKNOWN, LETTER, DIGIT, OTHER, SPACE = range(5)
#: Characters per allowed token looked at (a piece is about 5-6 characters of English).
CHARS_PER_TOKEN = 8
#: Bytes scanned at a time, so memory stays flat whatever the limit.
SCAN_BYTES = 8 << 20


def _classes() -> np.ndarray:
    table = np.full(256, UNKNOWN, np.int8)
    for lo, hi, cls in ((65, 90, LETTER), (97, 122, LETTER), (48, 57, DIGIT), (33, 47, OTHER), (58, 64, OTHER),
                        (91, 96, OTHER), (123, 126, OTHER)):
        table[lo:hi + 1] = cls
    table[[9, 10, 13, 32]] = SPACE
    return table


_CLASS = _classes()


def rule_for(model: dict, pre: list[dict], reasons: list[str]) -> str | None:
    """The rule proven for this model and (flattened) pre-tokenizer, or None with a reason."""
    types = [p.get("type") for p in pre]
    if types == ["ByteLevel"] and pre[0].get("use_regex", True):
        rule = "gpt2"
    elif (types == ["Split", "ByteLevel"] and not pre[1].get("use_regex", True)
          and (pre[0].get("pattern") or {}).get("Regex") in LLAMA3_PATTERNS
          and pre[0].get("behavior") == "Isolated" and not pre[0].get("invert")):
        rule = "llama3"
    elif types == ["BertPreTokenizer"]:
        rule = "bert"
    else:
        reasons.append("pieces bound: not proven for this pre-tokenizer (GPT-2's byte-level regex, "
                       "Llama 3's or Qwen 2's split, BERT's)")
        return None
    vocab = model.get("vocab") or {}
    if rule == "bert":
        if model.get("type") != "WordPiece" or model.get("unk_token") not in vocab:
            reasons.append("pieces bound: BERT's pre-tokenizer without a WordPiece model that has its [UNK]")
            return None
    elif (model.get("type") != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")
          or not isinstance(vocab, dict) or any(chr(b) not in vocab for b in range(33, 127))):
        reasons.append("pieces bound: not a BPE model holding every printable ASCII character")
        return None
    return rule


def run_starts(parts: list[bytes], rule: str) -> np.ndarray:
    """For each UTF-8 text, the counted run starts under ``rule`` (module docstring)."""
    buf = np.frombuffer(b"\n".join(parts) + b"\n", np.uint8)
    cls = _CLASS[buf]
    prev = np.empty_like(cls)
    prev[0], prev[1:] = SPACE, cls[:-1]
    known = (cls >= LETTER) & (cls <= OTHER)
    if rule == "bert":
        word = (cls == LETTER) | (cls == DIGIT)
        starts = (cls == OTHER) | (word & ((prev == SPACE) | (prev == OTHER)))
    else:
        starts = known & ((prev == SPACE) | ((prev >= LETTER) & (prev <= OTHER) & (prev != cls)))
        if rule == "gpt2":
            prev_byte = np.empty_like(buf)
            prev_byte[0], prev_byte[1:] = 10, buf[:-1]
            starts &= ~((cls == LETTER) & (prev_byte == ord("'")))
        else:
            starts &= ~((cls == LETTER) & (prev == OTHER))
    total = np.concatenate(([0], np.cumsum(starts, dtype=np.int64)))
    ends = np.cumsum([len(p) + 1 for p in parts])
    return np.diff(np.concatenate(([0], total[ends])))
