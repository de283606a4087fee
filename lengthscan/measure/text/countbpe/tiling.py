"""Token offsets of rendered conversations without the tokenizer: the count-only engine's tokens
(``CountEngine.tokens``: its merges, the added tokens split out as the tokenizer splits them),
their bytes summed into character offsets as ``tokenizers`` gives them, then trimmed as the
post-processor trims them.

* A token that splits a character (byte-level BPE) spans the whole character: its start is the
  character holding its first byte, its end the one after the character holding its last byte.
* ``trim_offsets`` (ByteLevel's and RoBERTa's post-processors, applied even without special
  tokens): leading and trailing spaces of a token's string leave its offsets, never past each
  other; a space is ``Ġ`` or a character Unicode calls white space (an added token's own text).

Where it is used, it is proven twice: on texts made to part the two (``agrees``, when it is made)
and on the run's first renderings against the tokenizer's own offsets (``ChatCounter``). Texts the
engine leaves to the tokenizer (``None``) are tokenized there.
"""

from __future__ import annotations

import numpy as np

from lengthscan.measure.text.countbpe.proof import Refused

#: Unicode's White_Space characters (Rust's ``char::is_whitespace``, which ``trim_offsets`` reads)
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                        "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
#: ByteLevel's character for the space byte
BYTE_SPACE = "\u0120"


class Tiler:
    """Character offsets of texts' tokens for one engine and post-processor."""

    def __init__(self, engine, post_processor: dict | None):
        self.engine = engine
        self.trims = _trims(post_processor)
        codes = engine.added_codes
        size = engine.sep_id + 1 + len(codes)
        self._bytes = np.zeros(size, np.int64)
        self._lead = np.zeros(size, np.int64)
        self._trail = np.zeros(size, np.int64)
        for word, rank in engine.derived.ranks.items():
            self._bytes[rank] = len(word)
            self._lead[rank] = len(word) - len(word.lstrip(b" "))
            self._trail[rank] = len(word) - len(word.rstrip(b" "))
        for text, code in codes.items():
            self._bytes[code] = len(text.encode("utf-8"))
            self._lead[code] = _spaces(text)
            self._trail[code] = _spaces(text[::-1])

    def code_of(self, added_text: str) -> int | None:
        """The code ``CountEngine.tokens`` gives an added token (None: no such added token)."""
        return self.engine.added_codes.get(added_text)

    def offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per text (codes, an (n, 2) array of character offsets: int32 for texts under 2^31
        characters); None where the tokenizer must tokenize it. A job of texts at a time, a few
        array operations each (no Python per token)."""
        out: list = [None] * len(texts)
        for owners, codes, counts in self.engine.tokens(texts):
            taken = [texts[i] for i in owners]
            off, whole = self._tile(taken, codes, counts)
            if max(map(len, taken), default=0) < 2**31:  # half the memory of the batches in flight
                codes, off = codes.astype(np.int32), off.astype(np.int32)
            bounds = np.cumsum(counts)[:-1]
            for i, ok, c, o in zip(owners.tolist(), whole, np.split(codes, bounds), np.split(off, bounds)):
                if ok:
                    out[i] = (c, o)
        return out

    def _tile(self, taken: list[str], codes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The offsets of texts' tokens (codes one text after another, ``counts`` a text), and per
        text whether its tokens' bytes are its own (always, but a text that is not is not trusted)."""
        lens = self._bytes[codes]
        ends = np.cumsum(lens)
        starts = ends - lens
        owner = np.repeat(np.arange(len(taken)), counts)
        joined = "".join(taken)
        chars = np.fromiter(map(len, taken), np.int64, len(taken))
        if joined.isascii():
            sizes = chars
            off = np.stack((starts, ends), axis=1)
        else:
            sizes = np.fromiter((len(t.encode("utf-8", "surrogatepass")) for t in taken), np.int64, len(taken))
            raw = np.frombuffer(joined.encode("utf-8", "surrogatepass"), np.uint8)
            inner = np.flatnonzero((raw & 0xC0) == 0x80)  # bytes that continue a character
            # the character holding byte p is p less the continuing bytes up to p
            off = np.stack((starts - np.searchsorted(inner, starts, side="right"),
                            ends - np.searchsorted(inner, ends - 1, side="right")), axis=1)
        whole = np.bincount(owner, weights=lens, minlength=len(taken)).astype(np.int64) == sizes
        off -= (np.cumsum(chars) - chars)[owner][:, None]
        first = np.zeros(len(codes), bool)
        first[(np.cumsum(counts) - counts)[counts > 0]] = True
        for prefix_space in self.trims:
            off = self._trim(off, codes, prefix_space, first)
        return off, whole.tolist()

    def _trim(self, off: np.ndarray, codes: np.ndarray, prefix_space: bool, first: np.ndarray) -> np.ndarray:
        """``process_offsets`` of tokenizers' ByteLevel, token by token, vectorized (``first``:
        each text's first token)."""
        lead, trail = self._lead[codes], self._trail[codes]
        if not (lead.any() or trail.any()):
            return off
        start, end = off[:, 0].copy(), off[:, 1].copy()
        if prefix_space:  # the first token's one space was the prefix ByteLevel added: kept
            lead = np.where((first | (start == 0)) & (lead == 1), 0, lead)
        start = np.where(lead > 0, np.minimum(start + lead, end), start)
        end = np.where((trail > 0) & (end >= trail), np.maximum(end - trail, start), end)
        return np.stack((start, end), axis=1)

    def agrees(self, backend, texts: list[str]) -> str | None:
        """None when the offsets equal ``backend``'s (without special tokens) on ``texts`` (the
        ones the engine takes); else the first text where they part."""
        mine = self.offsets(texts)
        theirs = backend.encode_batch(texts, add_special_tokens=False)
        for text, got, enc in zip(texts, mine, theirs):
            if got is None:
                continue
            codes, off = got
            if len(enc) != len(codes) or not np.array_equal(off, np.asarray(enc.offsets, np.int64).reshape(-1, 2)):
                return text
        return None


def _spaces(text: str) -> int:
    n = 0
    for c in text:
        if c != BYTE_SPACE and c not in WHITE_SPACE:
            break
        n += 1
    return n


def _trims(state: dict | None) -> list[bool]:
    """The post-processor's offset trims in order, each as its ``add_prefix_space``; Refused for
    a post-processor whose offsets are not known here."""
    if state is None:
        return []
    kind = state.get("type")
    if kind == "Sequence":
        return [t for p in state.get("processors") or [] for t in _trims(p)]
    if kind in ("ByteLevel", "RobertaProcessing"):
        return [bool(state.get("add_prefix_space"))] if state.get("trim_offsets") else []
    if kind in ("TemplateProcessing", "BertProcessing"):
        return []
    raise Refused(f"the post-processor {kind} moves offsets in ways not reproduced here")
