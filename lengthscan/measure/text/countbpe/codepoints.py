"""Where the two regex engines disagree, by code point, measured with both engines themselves
(see ``pattern.py``): the characters a text must not hold to be counted by the count-only engine,
probed once per set of library versions and cached."""

from __future__ import annotations

import re
import sys
import threading
import unicodedata

import numpy as np

from lengthscan.measure.text.countbpe.locks import acquire
from lengthscan.measure.text.countbpe.pattern import PreTokenizer
from lengthscan.sources.cache_dir import read_cache_json, write_cache_json

#: What this process has measured already, by engine versions (the cache file may be unwritable).
_KNOWN: dict[str, dict] = {}
_PROBING = threading.Lock()  # held while the cache is read or code points are probed
_PROBES_NOW: set = set()  # not empty while code points are probed


def _all_code_points() -> str:
    """Every code point but the surrogates, once each, in order."""
    codes = np.arange(0x110000, dtype=np.uint32)
    return codes[(codes < 0xD800) | (codes > 0xDFFF)].tobytes().decode("utf-32-le")


def differences(pre: PreTokenizer, form: str | None, cache_dir, *, cached_only: bool = False) -> np.ndarray | None:
    """The characters a text must not hold to be counted by the engine, as a table by code point
    (surrogates always; the classes' and normalizer's disagreements; the characters the
    case-insensitive groups match otherwise, ``_fold_differences``).
    ``cached_only``: None where a part is not known yet, or is being probed by another thread
    (``prefetch.py``), which a call without it waits for (nothing is probed twice)."""
    import tiktoken
    import tokenizers

    wanted = ([f"class {a}" for a in pre.atoms] + ([f"normalizer {form}", "unassigned"] if form else [])
              + [f"folds {group}" for group in pre.folds])
    key = f"v2-{tiktoken.__version__}-{tokenizers.__version__}-{sys.version_info[0]}.{sys.version_info[1]}"
    known = _KNOWN.get(key)
    if known is None:
        known = _KNOWN.setdefault(key, dict(shipped().get(key) or {}))
    if any(w not in known for w in wanted):
        if not acquire(_PROBING, lambda: bool(_PROBES_NOW), cached_only):
            return None
        try:
            if not _probe(known, wanted, cache_dir / f"differences-{key}.json" if cache_dir is not None else None,
                          cached_only=cached_only):
                return None
        finally:
            _PROBING.release()
    table = np.zeros(0x110000, bool)
    table[0xD800:0xE000] = True
    for w in wanted:
        for lo, hi in known[w]:
            table[lo:hi + 1] = True
    return table


#: The probes of the common classes, normalizers and folds, made for the library versions the
#: project is tested with (``tests/constraints.txt``), shipped: a first run with those versions
#: probes nothing (1.4 s saved); a test checks every entry against a fresh probe.
SHIPPED = "probed.json"
#: The case-insensitive group of the released byte-level regexes (GPT-4's, Llama 3's, Qwen's, o200k's)
CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#: What ``write_shipped`` probes.
SHIPPED_ATOMS = ("\\p{L}", "\\p{N}", "\\p{Lu}", "\\p{Lt}", "\\p{Lm}", "\\p{Lo}", "\\p{M}", "\\p{Ll}", "\\s", "\\p{P}",
                 "\\p{S}", "\\p{Nd}", "\\d", "\\w")


def shipped() -> dict:
    """key (library versions) -> what -> code-point runs, as shipped with lengthscan."""
    import json
    from importlib import resources

    try:
        return json.loads((resources.files("lengthscan.measure.text.countbpe") / SHIPPED).read_text("utf-8"))
    except (OSError, ValueError):
        return {}


def write_shipped(path) -> dict:
    """Probe ``SHIPPED_ATOMS``, both normalizers, the unassigned code points and the case folds with
    the installed libraries into ``path`` (the shipped file, beside this module), keeping the
    entries of other versions."""
    import json
    from pathlib import Path

    import tiktoken
    import tokenizers

    key = f"v2-{tiktoken.__version__}-{tokenizers.__version__}-{sys.version_info[0]}.{sys.version_info[1]}"
    wanted = ([f"class {a}" for a in SHIPPED_ATOMS]
              + ["normalizer NFC", "normalizer NFKC", "unassigned", f"folds {CONTRACTIONS}"])
    known: dict = {}
    _probe_all(known, wanted)
    path = Path(path)
    table = json.loads(path.read_text("utf-8")) if path.exists() else {}
    table[key] = known
    path.write_text(json.dumps(table, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    return known


def _probe(known: dict, wanted: list[str], path, *, cached_only: bool) -> bool:
    """``known`` completed with ``wanted`` from the cache file at ``path``, then (unless
    ``cached_only``) probed; False where something is still missing."""
    if path is not None:
        cached = read_cache_json(path) if path.exists() else None
        if isinstance(cached, dict):
            known.update({k: v for k, v in cached.items() if k not in known})
    todo = [w for w in wanted if w not in known]
    if todo and cached_only:
        return False
    if todo:
        _PROBES_NOW.add(True)
        try:
            _probe_all(known, todo)
        finally:
            _PROBES_NOW.clear()
        if path is not None:
            write_cache_json(path, known)
    return True


def _probe_all(known: dict, todo: list[str]) -> None:
    text = _all_code_points()
    for what in todo:
        kind, _, name = what.partition(" ")
        if kind == "class":
            points = _class_differences(name, text)
        elif kind == "normalizer":
            points = _normalizer_differences(name, text)
        else:
            points = _fold_differences(name, text) if kind == "folds" else _unassigned(text)
        known[what] = _runs(points)


def _class_differences(atom: str, text: str) -> list[int]:
    """Code points one engine's ``atom`` matches and the other's does not (``text``: every code
    point once)."""
    theirs, ours = _matched(atom, text)
    everything = _codes(text)
    return everything[ours[everything] != theirs[everything]].tolist()


def _matched(pattern: str, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(tiktoken's, tokenizers') tables by code point of the characters of ``text`` (each at most
    once) that ``pattern`` matches: one engine keeps the matches, the other removes them."""
    from tokenizers import Regex, normalizers

    theirs = np.zeros(0x110000, bool)
    theirs[_codes(_kept(pattern, text))] = True
    ours = np.ones(0x110000, bool)
    ours[_codes(normalizers.Replace(Regex(pattern), "").normalize_str(text))] = False  # what is left did not match
    return theirs, ours


def _kept(pattern: str, text: str) -> str:
    """What tiktoken's regex engine matches of ``text`` with ``pattern``, the matches one after another."""
    import tiktoken

    enc = tiktoken.Encoding("lengthscan-probe", pat_str=pattern, special_tokens={},
                            mergeable_ranks={bytes([b]): b for b in range(256)})
    return bytes(enc.encode_ordinary(text)).decode("utf-8")


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int64)


def _normalizer_differences(form: str, text: str) -> list[int]:
    """Code points the tokenizer's normalizer maps otherwise than Python's ``unicodedata``."""
    from tokenizers import normalizers

    spaced = "\x00".join(text)
    ours = getattr(normalizers, form)().normalize_str(spaced).split("\x00")
    theirs = unicodedata.normalize(form, spaced).split("\x00")
    if len(ours) != len(theirs):  # not expected: then every character is suspect
        return [ord(c) for c in text if not c.isascii()]
    return [ord(c) for c, a, b in zip(text, ours, theirs) if a != b]


def _ascii_folds(text: str) -> list[int]:
    """Non-ASCII characters of ``text`` (every code point once) whose case forms reach ASCII
    letters (``(?i:'s)`` may match ``'ſ``)."""
    chars = [c for c in text if not c.isascii()]
    spaced = "\x00".join(chars)  # no case form holds NUL: the forms of character i are part i
    hits: set[int] = set()
    for form in (spaced.lower(), spaced.upper(), spaced.casefold()):
        at, part = 0, 0  # the part that starts at ``at``
        for m in re.finditer("[A-Za-z]", form):  # few: only the forms that reach ASCII
            part += form.count("\x00", at, m.start())
            at = m.start()
            hits.add(ord(chars[part]))
    return sorted(hits)


def _fold_differences(group: str, text: str) -> list[int]:
    """The characters whose case forms reach ASCII (``_ascii_folds``, ``_engine_folds``; ``text``
    holds every code point once) that the two engines match otherwise inside the case-insensitive
    ``group`` (``(?i:...)`` as the regex writes it).

    Where the group is an alternation of ASCII literals of 2 or 3 characters (the contractions of
    the released regexes), whether it matches at a place depends on the 3 characters from there
    alone: every string of 1 to 3 characters over the group's characters (both cases), ``#`` (a
    character it cannot match) and those characters, holding at least one of them, is matched by
    both engines, and a character is kept where they match a string holding it otherwise (a string
    that short holds one match at most: what each engine matched of it says where). Any other group
    (or one where an alternative begins another: a probe sees only the first that matches): every
    one of those characters (it may fold them where the probe does not look)."""
    import itertools

    from tokenizers import Regex, pre_tokenizers

    candidates = sorted(set(_ascii_folds(text)) | set(_engine_folds(text)))
    body = group[4:-1] if group.startswith("(?i:") and group.endswith(")") else ""
    alternatives = body.split("|")
    if not body or any(not 2 <= len(a) <= 3 or not all(c.isascii() and c.isprintable() and c not in "\\[](){}?*+.|^$#"
                                                       for c in a) for a in alternatives):
        return candidates
    folded = [a.lower() for a in alternatives]
    if any(a != b and b.startswith(a) for a in folded for b in folded):  # a probe sees only the first to match
        return candidates
    plain = sorted({c for a in alternatives for c in a} | {c.swapcase() for a in alternatives for c in a})
    odd = [chr(c) for c in candidates]
    probes = ["".join(t) for n in (1, 2, 3) for t in itertools.product([*plain, "#", *odd], repeat=n)
              if not all(c in plain or c == "#" for c in t)]
    theirs = _kept(group + "|\n", "\n".join(probes)).split("\n")
    pieces = pre_tokenizers.Split(Regex(group), "isolated")  # the matches and what lies between them
    between = pre_tokenizers.Split(Regex(group), "removed")  # what lies between them
    differ = []  # the characters of each probe the engines match otherwise
    for probe, matched in zip(probes, theirs):
        gaps = {span for _, span in between.pre_tokenize_str(probe)}
        ours = [piece for piece, span in pieces.pre_tokenize_str(probe) if span not in gaps]
        if ours != ([matched] if matched else []):
            differ.append({ord(c) for c in probe if not c.isascii()})
    hits = set().union(*(d for d in differ if len(d) == 1))  # a character that differs on its own
    for d in differ:  # two that differ only together: both (a text holding either goes to the tokenizer)
        if not d & hits:
            hits |= d
    return sorted(hits)


def _engine_folds(text: str) -> list[int]:
    """Non-ASCII characters of ``text`` (every code point once) that either regex engine matches
    case-insensitively to an ASCII letter: its own Unicode tables may fold what Python's do not."""
    theirs, ours = _matched("(?i:[a-z])", text)
    everything = _codes(text)
    return [c for c in everything[theirs[everything] | ours[everything]].tolist() if c >= 0x80]


def _unassigned(text: str) -> list[int]:
    category = unicodedata.category
    return [ord(c) for c in text if category(c) == "Cn"]


def _runs(points: list[int]) -> list[list[int]]:
    """Sorted code points as [first, last] runs (the cache stays small)."""
    out: list[list[int]] = []
    for c in sorted(points):
        if out and c == out[-1][1] + 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out
