r"""The proofs behind decide-only counting (``decide.py``): is a text over L tokens? Count only as far
as the answer needs.

Three shortcuts, each used only where it is *proven* for the tokenizer at hand (read from the
backend's own ``tokenizer.json`` structure, then checked on real texts), else the full count:

* **An upper bound without tokenizing.** Every token covers at least one unit of the normalized
  text: one byte for byte-level BPE and byte-fallback models (a byte is the smallest piece they
  make), one character for WordPiece, char-level BPE and Unigram (whose Metaspace may add one
  "▁" in front). So ``tokens <= units(normalize(text)) + prepend + specials``, ``specials`` being
  the length of the empty string. The bound is computed on the *normalized* text (NFKC can turn
  3 bytes into 20 characters). Texts that contain an added token matched on the raw text are
  left to the full count. A text whose bound is <= L is within the limit.
* **A lower bound from a prefix.** Where tokenization is additive at a cut, the tokens of a
  prefix are the first tokens of the whole text, so ``count(prefix) > L`` proves the text is over.
  It is additive at a space that follows a non-space and precedes a non-space when the
  normalizer works character by character (NFC/NFKC and the like cannot compose across a space),
  the pre-tokenizer starts a new piece at such a space and never looks past it (GPT-2's
  byte-level regex, whitespace, BERT's and punctuation splitters, Metaspace with ``split``), the
  model tokenizes each piece on its own (BPE without dropout, WordPiece, WordLevel, and Unigram
  only behind such a splitter: Unigram over a whole text is not additive), the post-processor
  adds a fixed number of special tokens, and no added token contains whitespace.
* **A lower bound without tokenizing, from the pre-tokenizer's pieces** (``pieces.py``): for
  GPT-2's byte-level regex, Llama 3's and Qwen 2's split regexes and BERT's pre-tokenizer, the
  runs of ASCII letters, digits and punctuation of a text never outnumber its pieces, and every
  piece makes at least one token, so ``runs + specials > L`` proves the text is over.

Rows decided this way carry a bound instead of an exact length (``{name}_at_least``,
``{name}_at_most`` in ``lengths.parquet``) and are counted in the report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from lengthscan.measure.text.pieces import CHARS_PER_TOKEN, SCAN_BYTES, rule_for, run_starts

_CHAR_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "BertNormalizer", "Strip",
                     "Prepend", "Nmt"}
_SPLITTERS = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Punctuation", "Digits"}
_FIXED_POST = {"TemplateProcessing", "RobertaProcessing", "BertProcessing", "ByteLevel"}


@dataclass(frozen=True)
class Bounds:
    """What is proven for one tokenizer and role."""

    unit: str | None           # "bytes" or "chars": what each token covers at least one of; None: no bound
    prepend: int               # extra units a pre-tokenizer may add (a prefix space, Metaspace's "▁")
    metaspace: bool = False    # spaces become "▁" (3 bytes) before the model sees them
    specials: int = 0          # the empty string's length: special tokens added to every text
    prefix_ok: bool = False    # prefix counts are lower bounds (additive at space cuts)
    reasons: tuple[str, ...] = ()  # why a shortcut is off
    raw_added: re.Pattern | None = None  # added tokens matched on the raw text
    pieces: str | None = None  # the pieces rule proven (pieces.py), or None
    any_added: re.Pattern | None = None  # every added token's content
    added_len: int = 0         # the longest added token, in characters

    def upper(self, texts: list[str], normalize) -> np.ndarray:
        """Upper bounds on the token counts (-1 where no bound is proven for that text)."""
        out = np.full(len(texts), -1, np.int64)
        if self.unit is None:
            return out
        for i, text in enumerate(texts):
            if self.raw_added is not None and self.raw_added.search(text):
                continue
            norm = normalize(text) if normalize is not None else text
            if self.unit == "bytes":
                units = len((norm.replace(" ", "\u2581") if self.metaspace else norm).encode("utf-8"))
            else:
                units = len(norm)
            out[i] = units + self.prepend + self.specials
        return out

    def pieces_lower(self, texts: list[str], limit: int, normalize) -> np.ndarray:
        """Lower bounds on the token counts from the pre-tokenizer's pieces (see the module
        docstring), counted on about ``CHARS_PER_TOKEN * (limit + 1)`` characters of each
        text (-1 where no bound is computed)."""
        out = np.full(len(texts), -1, np.int64)
        if not self.pieces:
            return out
        span = CHARS_PER_TOKEN * (limit + 1)
        parts, owners = [], []
        for i, text in enumerate(texts):
            end = len(text)
            if end > span:
                end = span if normalize is None else safe_cut(text, span)
                if end is None:
                    continue
            head = text[:end]
            if self.any_added is not None:
                near = text[:end + self.added_len]
                if self.any_added.search(near) or (normalize is not None and self.any_added.search(normalize(near))):
                    continue
            parts.append((normalize(head) if normalize is not None else head).encode("utf-8"))
            owners.append(i)
        start = 0
        while start < len(parts):  # a few MB at a time, so memory stays flat whatever the limit
            stop, size = start, 0
            while stop < len(parts) and (stop == start or size + len(parts[stop]) < SCAN_BYTES):
                size += len(parts[stop]) + 1
                stop += 1
            out[owners[start:stop]] = run_starts(parts[start:stop], self.pieces) + self.specials
            start = stop
        return out

    def to_dict(self) -> dict:
        return {"upper_bound_unit": self.unit, "prefix_lower_bound": self.prefix_ok,
                "pieces_lower_bound": self.pieces, "why_not": list(self.reasons)}


def prove(backend, specials: int) -> Bounds:
    """Read the backend tokenizer's structure and say which shortcuts hold (see the module docstring)."""
    spec = json.loads(backend.to_str())
    reasons: list[str] = []
    model = spec.get("model") or {}
    mtype = model.get("type")
    pre = _flatten(spec.get("pre_tokenizer"))
    norm = _flatten(spec.get("normalizer"))
    byte_level = any(p.get("type") == "ByteLevel" for p in pre)

    unit, prepend = None, 0
    if mtype == "BPE":
        unit = "bytes" if byte_level or model.get("byte_fallback") else "chars"
    elif mtype == "WordPiece" or mtype == "WordLevel":
        unit = "chars"
    elif mtype == "Unigram":
        unit = "bytes" if model.get("byte_fallback") else "chars"
    else:
        reasons.append(f"no token-size bound known for a {mtype} model")
    metaspace = any(p.get("type") == "Metaspace" for p in pre)
    if any(p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never" for p in pre):
        prepend = 3  # "▁": one character, three bytes
    if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space") for p in pre):
        prepend = max(prepend, 1)
    if unit is not None and any(p.get("type") not in _SPLITTERS | {"ByteLevel", "Metaspace", "Split"} for p in pre):
        unit = None
        reasons.append("a pre-tokenizer that may add characters")

    prefix_ok = True
    for n in norm:
        if n.get("type") not in _CHAR_NORMALIZERS and not _char_replace(n):
            prefix_ok = False
            reasons.append(f"normalizer {n.get('type')} may act across a space")
    if not pre:
        prefix_ok = False
        reasons.append("no pre-tokenizer: the model sees the whole text at once")
    for p in pre:
        t = p.get("type")
        ok = (t in _SPLITTERS or (t == "ByteLevel" and p.get("use_regex", True))
              or (t == "Metaspace" and p.get("split", True)))
        if not ok:
            prefix_ok = False
            reasons.append(f"pre-tokenizer {t} is not known to split at every space")
    if mtype not in ("BPE", "WordPiece", "WordLevel", "Unigram") or (mtype == "BPE" and model.get("dropout")):
        prefix_ok = False
        reasons.append(f"model {mtype} is not additive over pieces")
    post = _flatten(spec.get("post_processor"))
    if any(p.get("type") not in _FIXED_POST for p in post):
        prefix_ok = False
        reasons.append("a post-processor that may add a varying number of tokens")
    added = spec.get("added_tokens") or []
    if any(re.search(r"\s", a.get("content", "")) for a in added):
        prefix_ok = False
        reasons.append("an added token contains whitespace and could span a cut")
    raw = [a["content"] for a in added if not a.get("normalized", False) and a.get("content")]
    raw_added = re.compile("|".join(re.escape(c) for c in sorted(raw, key=len, reverse=True))) if raw else None
    contents = sorted({a["content"] for a in added if a.get("content")}, key=len, reverse=True)
    any_added = re.compile("|".join(re.escape(c) for c in contents)) if contents else None
    pieces = _pieces_proven(model, pre, norm, post, reasons)
    return Bounds(unit, prepend, metaspace, specials, prefix_ok, tuple(reasons), raw_added, pieces, any_added,
                  max((len(c) for c in contents), default=0))


def _pieces_proven(model: dict, pre: list[dict], norm: list[dict], post: list[dict], reasons: list[str]):
    """The pieces rule that holds here (``pieces.py``), or None."""
    if any(n.get("type") not in _CHAR_NORMALIZERS and not _char_replace(n) for n in norm) \
            or any(p.get("type") not in _FIXED_POST for p in post):
        reasons.append("pieces bound: a normalizer or post-processor that is not character-wise or fixed")
        return None
    return rule_for(model, pre, reasons)


def _flatten(node) -> list[dict]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        items = node.get("normalizers") or node.get("pretokenizers") or node.get("processors") or []
        return [x for item in items for x in _flatten(item)]
    return [node]


def _char_replace(n: dict) -> bool:
    """A Replace of one non-space character by a string without spaces: character by character."""
    if n.get("type") != "Replace":
        return False
    pattern = (n.get("pattern") or {}).get("String")
    content = n.get("content", "")
    return pattern is not None and len(pattern) == 1 and not pattern.isspace() and not any(c.isspace() for c in content)


def safe_cut(text: str, limit_chars: int) -> int | None:
    """The last cut <= limit_chars at a space between two non-spaces (None if there is none)."""
    i = text.rfind(" ", 1, min(limit_chars, len(text) - 2) + 1)  # a character must follow the space
    while i > 0:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", 1, i)
    return None


def holds_on(proof: Bounds, backend, texts: list[str], count) -> bool:
    """The proven bounds also hold on ``texts`` (real and probe texts), ``count`` giving their exact
    token counts: a check, not the proof."""
    counts = count(texts)
    normalize = normalize_fn(backend)
    upper = proof.upper(texts, normalize)
    if any(0 <= u < n for u, n in zip(upper, counts)):
        return False
    if any(lo > n for lo, n in zip(proof.pieces_lower(texts, 1 << 20, normalize), counts)):
        return False
    if proof.prefix_ok:
        cuts = [(t, safe_cut(t, len(t) // 2)) for t in texts]
        cuts = [(t, c) for t, c in cuts if c]
        prefix_counts = count([t[:c] for t, c in cuts]) if cuts else []
        whole = dict(zip(texts, counts))
        if any(p > whole[t] for (t, _), p in zip(cuts, prefix_counts)):
            return False
    return True


def normalize_fn(backend):
    """The backend's normalizer as a function of a string (None: it has none)."""
    return backend.normalizer.normalize_str if backend.normalizer is not None else None
