r"""An exact count-only engine for a byte-level BPE: a tiktoken rank table that provably merges
as the tokenizer's own merge list does.

The two merge loops
-------------------
``tokenizers``' BPE starts a word from its characters (byte-level: one character per byte) and
repeatedly applies the *listed* merge ``(x, y)`` of lowest index among adjacent symbol pairs,
leftmost on a tie (its heap orders by ``(rank, position)``); a pair listed twice keeps its last
index (the merge map is a hash map built in list order). With ``ignore_merges`` a word that is a
vocabulary entry is one token before any merge.

tiktoken starts a piece from its bytes, returns one token if the whole piece is in its rank table,
and otherwise repeatedly merges the adjacent pair whose *concatenation* is in the table with the
lowest rank, leftmost on a tie. It never asks whether that split of the token is a listed merge.

The construction
----------------
Let ``iso(t)`` be the tokenizer's own merge loop run on the bytes of ``t`` alone (computed below by
``tokenizers`` itself, with ``ignore_merges`` off). Call ``t`` *self-reducing* when ``iso(t)`` is
``[t]``. The rank table holds the 256 bytes, every self-reducing token ``t`` with rank
``256 + lo(t)``, ``lo(t)`` being the lowest index of a listed merge whose concatenation is ``t``,
and, only under ``ignore_merges``, every other vocabulary entry with a rank above all of those.

Why the counts are equal
------------------------
1. *Locality.* Suppose symbols ``x`` and ``y`` are adjacent at some point of the loop on some word,
   and let ``R`` be the bytes they cover. No merge crossed ``R``'s edges before (symbols never
   split), and while none does, the merges inside ``R`` are taken in exactly the order the loop on
   ``R`` alone takes them (a merge inside ``R`` is the lowest of the word's candidates, hence of
   ``R``'s, and ties go leftmost in both). So ``iso(x + y)`` passes through the state ``[x, y]``.
   The loop is deterministic and loses one symbol a step, so ``iso(t)`` has at most one
   two-symbol state: every adjacent pair that concatenates to ``t`` is that one split of ``t``.
2. *Same candidates.* A listed pair ``(x, y)`` that is ever adjacent is merged by ``iso(x + y)``,
   so ``x + y`` is self-reducing and in the table. Conversely if adjacent ``x``, ``y`` concatenate
   to a table entry ``t``: when ``t`` is self-reducing, ``[x, y]`` is ``iso(t)``'s two-symbol state,
   which it merged, so ``(x, y)`` is listed; when ``t`` is in the table only under
   ``ignore_merges``, ``iso(t)`` must not *end* in two symbols, which ``derive`` checks (if it
   did, tiktoken would merge a pair the tokenizer never merges).
3. *Same order.* The pair that makes a self-reducing ``t`` is always the same listed merge
   (step 1), whose index lies in ``[lo(t), hi(t)]``, the span of the listed merges that make ``t``.
   ``derive`` checks that these spans of different tokens never interleave, so ordering by
   ``lo(t)`` (tiktoken's rank) is ordering by the index actually used. Equal ranks mean the same
   token, hence the same pair, and both loops take the leftmost.
4. *Whole pieces.* tiktoken's lookup of the whole piece answers one token exactly when the
   tokenizer does: a self-reducing piece merges to one token anyway, and under ``ignore_merges``
   every vocabulary entry is in the table.

So for every piece both loops take the same merges in the same order, and the token counts (not
the ids: ranks are merge positions) are equal. Nothing here is a sample: ``derive`` answers for
every token of the vocabulary, and refuses with a reason when a condition fails. What the
pre-tokenizer, normalizer, added tokens and post-processor do is ``engine.py``'s part.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


def byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet: character -> byte (GPT-2's ``bytes_to_unicode``, inverted)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


@dataclass(frozen=True)
class Derived:
    """The rank table (bytes -> rank) that counts as the tokenizer's BPE does, and what it holds."""

    ranks: dict[bytes, int]
    merged: int          # self-reducing tokens
    whole_only: int      # entries held only for ``ignore_merges``' whole-word lookup
    ignore_merges: bool


class Refused(ValueError):
    """The construction does not hold for this model; the message says which condition failed."""


def merge_pairs(merges: list) -> list[tuple[str, str]]:
    """A model entry's merges as pairs of strings, either format ("a b" or ["a", "b"])."""
    if merges and set(map(type, merges)) == {list}:  # the newer format: pairs as lists, read in one piece
        pairs = list(map(tuple, merges))
        if set(map(len, pairs)) == {2}:
            return pairs
    out = []
    for m in merges:
        if isinstance(m, str):
            a, sep, b = m.partition(" ")
            if not sep:
                raise Refused(f"merge {m!r} is not two tokens")
            out.append((a, b))
        else:
            out.append((m[0], m[1]))
    return out


def derive(tokenizer_json: str) -> Derived:
    """The rank table proven exact for this ``tokenizer.json``'s BPE model (module docstring), or
    ``Refused`` naming the condition that fails."""
    return derive_model((json.loads(tokenizer_json).get("model") or {}))


#: The BPE options a ``tokenizers`` model takes as keywords (``bpe_model``), as ``tokenizer.json`` spells them.
_OPTIONS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
            "ignore_merges")


def bpe_model(model: dict, pairs: list[tuple[str, str]] | None = None):
    """``tokenizers.models.BPE`` of a ``tokenizer.json`` model entry (BPE), its options included: the
    model a tokenizer loading that file holds (``__getstate__`` serializes both alike). ``pairs``:
    its merges as ``merge_pairs`` reads them, where read already."""
    from tokenizers import models

    options = {k: model[k] for k in _OPTIONS if model.get(k) is not None}
    pairs = pairs if pairs is not None else merge_pairs(model.get("merges") or [])
    return models.BPE(vocab=model.get("vocab"), merges=pairs, **options)


def derive_model(model: dict, bpe=None, pairs: list[tuple[str, str]] | None = None) -> Derived:
    """``derive`` for the model entry of a ``tokenizer.json`` (as ``json.loads`` reads it); ``bpe``:
    the model itself, where the caller has it without ``ignore_merges`` (a loaded tokenizer's: it
    is only read), else it is built; ``pairs``: its merges as ``merge_pairs`` reads them, where
    read already."""
    if model.get("type") != "BPE":
        raise Refused(f"the model is {model.get('type')}, not BPE")
    if model.get("dropout"):
        raise Refused("BPE dropout makes counts random")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Refused("subword prefixes or word suffixes change the symbols")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise Refused("the vocabulary is not a mapping")
    alphabet = byte_alphabet()
    missing = [c for c in alphabet if c not in vocab]
    if missing:
        raise Refused(f"{len(missing)} of the 256 byte-level characters are not in the vocabulary")
    pairs = pairs if pairs is not None else merge_pairs(model.get("merges") or [])
    lo, hi = _spans(pairs)
    to_bytes = str.maketrans({c: chr(b) for c, b in alphabet.items()})  # a word's bytes, as latin-1 text
    outside = re.compile(f"[^{''.join(re.escape(c) for c in alphabet)}]")
    words = [t for t in vocab if len(t) >= 2 and not outside.search(t)]
    if bpe is None or bpe.ignore_merges:
        bpe = bpe_model(model, pairs)
        bpe.ignore_merges = False
    sizes = _iso_sizes(bpe, words)
    ignore = bool(model.get("ignore_merges"))
    ranks = {bytes([b]): b for b in alphabet.values()}
    merged, others = [], []
    for word, size in zip(words, sizes):
        if size == 1:
            merged.append(word)
        elif ignore:
            if size == 2:
                raise Refused(f"under ignore_merges, {word!r} is a vocabulary entry whose own merges stop at two "
                              "tokens that are not a listed merge (tiktoken would merge them)")
            others.append(word)
    order = sorted(merged, key=lo.__getitem__)
    if hi is not lo:  # a token made by several listed merges: their spans must not interleave
        for prev, word in zip(order, order[1:]):
            if hi[prev] >= lo[word]:
                raise Refused(f"the merges making {prev!r} and {word!r} are interleaved in the merge list")
    ranks.update(zip(_as_bytes(order, to_bytes), [256 + lo[w] for w in order]))
    top = 256 + len(pairs)
    ranks.update(zip(_as_bytes(others, to_bytes), range(top, top + len(others))))
    return Derived(ranks=ranks, merged=len(merged), whole_only=len(others), ignore_merges=ignore)


def _spans(pairs: list[tuple[str, str]]) -> tuple[dict[str, int], dict[str, int]]:
    """Per concatenation of a listed merge, the lowest and highest index of the merges that make it
    (a pair listed twice keeps its last index, as in tokenizers' merge map). Where every pair and
    every concatenation is listed once (the usual case) both are the one index, and the same dict."""
    cats = [a + b for a, b in pairs]
    hi = dict(zip(cats, range(len(cats))))  # dict order keeps the last index of each concatenation
    if len(hi) == len(cats):  # every concatenation listed once (so every pair): the one index each
        return hi, hi
    if len(set(pairs)) == len(pairs):  # each index its own: reversed, the first
        return dict(zip(reversed(cats), range(len(cats) - 1, -1, -1))), hi
    import numpy as np

    index = dict(zip(pairs, range(len(pairs))))  # later duplicates win
    at = np.fromiter(index.values(), np.int64, len(index))
    order = np.argsort(at, kind="stable").tolist()
    made = [a + b for a, b in index]
    cats, spots = [made[k] for k in order], at[order].tolist()
    hi = dict(zip(cats, spots))  # in index order: the last (highest) index of each token stays
    lo = dict(zip(reversed(cats), reversed(spots)))
    return lo, hi


def _as_bytes(words: list[str], to_bytes: dict) -> list[bytes]:
    """Each byte-level word's bytes (one character a byte), translated in one piece."""
    blob = "".join(words).translate(to_bytes).encode("latin-1")
    out, at = [], 0
    for w in words:
        out.append(blob[at:at + len(w)])
        at += len(w)
    return out


#: Words per text of ``_iso_sizes``' joined encoding (the backend's threads share the texts).
_JOINED = 4096


def _iso_sizes(bpe, words: list[str]) -> list[int]:
    """How many tokens the model's own merge loop leaves of each word alone (``iso``): the
    tokenizer's BPE model itself (``ignore_merges`` off) with nothing around it. The words (of
    byte-level characters, never a line break) are encoded a few thousand to a text, each ended by
    a line break matched as a special token (no normalizer, no pre-tokenizer: every word is a
    piece of its own), and counted between the breaks' ids: half the time of one encoding per
    word. Where the break's id is a token's too, each word is encoded alone."""
    import numpy as np
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer(bpe)  # the model shared, not copied: added tokens live in the tokenizer, not the model
    tok.add_special_tokens([AddedToken("\n", special=True, normalized=False)])
    sep = tok.token_to_id("\n")
    groups = [words[i:i + _JOINED] for i in range(0, len(words), _JOINED)]
    encoded = tok.encode_batch_fast(["\n".join(g) + "\n" for g in groups], add_special_tokens=False)
    sizes = []
    for group, enc in zip(groups, encoded):
        ends = np.flatnonzero(np.array(enc.ids, np.int64) == sep)
        if len(ends) != len(group):  # a word's token has the break's id: counted word by word
            single = Tokenizer(bpe)
            return [len(e) for e in single.encode_batch_fast(words, add_special_tokens=False)]
        sizes.append(np.diff(ends, prepend=-1) - 1)
    return np.concatenate(sizes).tolist() if sizes else []
