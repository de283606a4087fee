r"""What happens before the BPE, made the count-only engine's: one split regex, a normalizer that
leaves the text alone, and the characters where the two regex engines disagree.

``tokenizers`` splits with Oniguruma (Ruby syntax), tiktoken with fancy-regex (Rust's ``regex``
underneath). They agree on the constructs the released byte-level patterns use (literals,
classes, ``\p{..}``, ``\s``, groups, ``(?i:..)``, lookahead, greedy and possessive ``? * +``,
``{m,n}``), so a pattern is taken only when it is built from those alone; anchors, ``\b``, ``\h``,
numeric escapes, named or atomic groups, POSIX classes and ``{m,n}+`` (possessive in one engine,
not the other) are refused.

Where the engines still differ is *which characters* a class holds: their Unicode tables are not
the same version, and ``(?i:..)`` may fold non-ASCII letters onto ASCII ones (``ſ`` onto ``s``,
the Kelvin sign onto ``k``). ``differences`` measures the first for every class of the pattern
over every code point, with both engines themselves: a text holding such a character goes to the
tokenizer. The second is handled the same way with Python's own case tables.

A normalizer is taken when it is NFC or NFKC (or none): a text the normalizer would leave alone is
counted as it is, and one it would change goes to the tokenizer. Python decides "would leave
alone" with its Unicode version; Unicode's stability policy makes a text normalized under one
version normalized under every later one when it holds only characters that version assigns, so
characters unassigned in Python's tables, and any code point whose normalization by the two
libraries differs, also go to the tokenizer.
"""

from __future__ import annotations

import re
import sys
import threading
import unicodedata
from dataclasses import dataclass

import numpy as np

from lengthscan.measure.text.countbpe.locks import acquire
from lengthscan.measure.text.countbpe.proof import Refused
from lengthscan.sources.cache_dir import read_cache_json, write_cache_json

#: The regex ``tokenizers``' ByteLevel pre-tokenizer splits with when ``use_regex`` is on (GPT-2's).
BYTE_LEVEL_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_ATOM_ESCAPES = "sSdDwW"
_PLAIN_ESCAPES = "rntfv"
#: Punctuation both engines take escaped as itself (``\\<``, ``\\>`` are word boundaries in one).
_PUNCT_ESCAPES = "\\.-[](){}|?*+^$/'\"#&~:!,=@%;`"
_GROUPS = ("(?:", "(?=", "(?!", "(?i:")


@dataclass(frozen=True)
class PreTokenizer:
    """The split the engine makes: one regex over each segment, after an optional prefix space."""

    regex: str
    prefix_space: bool
    atoms: tuple[str, ...]     # the character classes the regex uses (probed in both engines)
    folds: bool                # the regex has case-insensitive groups


def pre_tokenizer(spec: dict | None) -> PreTokenizer:
    """The pre-tokenizer of a ``tokenizer.json`` as one regex, or ``Refused``."""
    steps = _flatten(spec)
    types = [s.get("type") for s in steps]
    if types == ["ByteLevel"] and steps[0].get("use_regex", True):
        regex, prefix = BYTE_LEVEL_REGEX, bool(steps[0].get("add_prefix_space", True))
    elif types == ["Split", "ByteLevel"]:
        split, level = steps
        if level.get("use_regex", True):
            raise Refused("a split followed by ByteLevel's own regex is two regexes")
        if level.get("add_prefix_space"):
            raise Refused("ByteLevel after a split adds a space to every piece")
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise Refused(f"the split's behaviour is {split.get('behavior')} (invert={split.get('invert')}), "
                          "not Isolated")
        regex = (split.get("pattern") or {}).get("Regex")
        if regex is None:
            raise Refused("the split is on a string, not a regex")
        prefix = False
    else:
        raise Refused(f"the pre-tokenizer is {' + '.join(map(str, types)) or 'none'}; the engine takes "
                      "ByteLevel with its regex, or one Isolated regex split then ByteLevel")
    atoms, folds = scan(regex)
    return PreTokenizer(regex, prefix, atoms, folds)


def _flatten(spec: dict | None) -> list[dict]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [s for inner in spec.get("pretokenizers") or [] for s in _flatten(inner)]
    return [spec]


def normalizer_form(spec: dict | None) -> str | None:
    """"NFC", "NFKC" or None (no normalizer) for a ``tokenizer.json`` normalizer, or ``Refused``."""
    if not spec:
        return None
    if spec.get("type") == "Sequence":
        inner = [s for s in spec.get("normalizers") or [] if s]
        if not inner:
            return None
        if len(inner) == 1:
            return normalizer_form(inner[0])
        raise Refused(f"a sequence of {len(inner)} normalizers")
    if spec.get("type") in ("NFC", "NFKC"):
        return spec["type"]
    raise Refused(f"the {spec.get('type')} normalizer changes text the engine would count unchanged")


def scan(regex: str) -> tuple[tuple[str, ...], bool]:
    """The single-character classes of a regex and whether it folds case, or ``Refused`` for a
    construct the two engines may read differently (module docstring). Inside ``(?i:...)`` only
    ASCII literals and ASCII classes are taken: case folding beyond ASCII (``ß``/``ss``,
    ``\\p{Lu}``) differs between the engines."""
    atoms: list[str] = []
    folds = False
    groups: list[bool] = []  # per open group: is it (?i:...)
    i, n = 0, len(regex)
    klass: list[str] | None = None  # the characters of the class being read
    while i < n:
        c = regex[i]
        folding = any(groups)
        if c == "\\":
            if i + 1 >= n:
                raise Refused("the regex ends in a backslash")
            e = regex[i + 1]
            if e in "pP":
                m = re.match(r"\\[pP]\{[A-Za-z_]+\}", regex[i:])
                if m is None:
                    raise Refused(f"the property escape at {regex[i:i + 8]!r} is not read alike by both regex engines "
                                  "(write \\p{Name})")
                if folding:
                    raise Refused("a property class inside (?i:...) folds case differently in the two regex engines")
                atoms.append("\\p" + m.group(0)[2:])
                i += m.end()
                continue
            if e in _ATOM_ESCAPES:
                if folding and e in "wW":
                    raise Refused("\\w inside (?i:...) folds case differently in the two regex engines")
                atoms.append("\\" + e.lower())
            elif e not in _PLAIN_ESCAPES and e not in _PUNCT_ESCAPES:
                raise Refused(f"the escape \\{e} is not read alike by both regex engines")
            if klass is not None:
                klass.append(e)
            i += 2
            continue
        if not c.isascii() and folding:
            raise Refused(f"the non-ASCII {c!r} inside (?i:...) folds differently in the two regex engines")
        if klass is not None:
            if c == "[":
                raise Refused("nested or POSIX character classes")
            if c in "&-~" and regex.startswith(c * 2, i):
                raise Refused(f"the class operator {c * 2} (set operations are read differently)")
            if c == "]":
                klass = None
            else:
                klass.append(c)
            i += 1
            continue
        if c == "[":
            klass = []
            i += 1
            if regex.startswith("^", i):
                if folding:
                    raise Refused("a negated class inside (?i:...) folds differently in the two regex engines")
                i += 1
            if regex.startswith("]", i):
                i += 1  # a literal ] first in the class
            continue
        if c == "(":
            fold = False
            if regex.startswith("(?", i):
                group = next((g for g in _GROUPS if regex.startswith(g, i)), None)
                if group is None:
                    raise Refused(f"the group {regex[i:i + 4]!r}... is not read alike by both regex engines")
                fold = group == "(?i:"
                folds |= fold
                i += len(group)
            else:
                i += 1
            groups.append(fold)
            continue
        if c == ")":
            if not groups:
                raise Refused("unbalanced brackets in the regex")
            groups.pop()
        elif c in "^$":
            raise Refused("anchors (^, $) mean lines in one regex engine and the text in the other")
        elif c == ".":
            atoms.append(".")
        elif c == "}" and regex.startswith("}+", i):
            raise Refused("{m,n}+ is possessive in one regex engine and not in the other")
        i += 1
    if klass is not None or groups:
        raise Refused("unbalanced brackets in the regex")
    _never_empty(regex)
    return tuple(dict.fromkeys(atoms)), folds


def _never_empty(regex: str) -> None:
    """``Refused`` when the regex can match the empty string: tiktoken's and the tokenizer's
    loops step over empty matches differently (tiktoken may drop the next character)."""
    if _Nullable(regex).alternation():
        raise Refused("the split regex can match the empty string")


class _Nullable:
    """Whether a regex (already read by ``scan``) can match the empty string: an alternation is if
    one branch is, a sequence if every item is, an item if its quantifier allows zero or its atom
    can; lookarounds match empty; a class, an escape or a character never does."""

    def __init__(self, regex: str):
        self.s, self.i = regex, 0

    def alternation(self) -> bool:
        empty = self.sequence()
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            empty = self.sequence() or empty
        return empty

    def sequence(self) -> bool:
        empty = True
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            empty = self.item() and empty
        return empty

    def item(self) -> bool:
        empty = self.atom()
        s = self.s
        while self.i < len(s) and s[self.i] in "?*+{":
            c = s[self.i]
            if c == "{":
                end = s.index("}", self.i)
                low = s[self.i + 1:end].split(",")[0].strip()
                empty = empty or not low or int(low) == 0
                self.i = end + 1
            else:
                empty = empty or c in "?*"
                self.i += 1
            if self.i < len(s) and s[self.i] in "?+":  # lazy or possessive: the same lengths
                self.i += 1
        return empty

    def atom(self) -> bool:
        s, c = self.s, self.s[self.i]
        if c == "(":
            look = s.startswith(("(?=", "(?!"), self.i)
            self.i += next((len(g) for g in _GROUPS if s.startswith(g, self.i)), 1)
            empty = self.alternation()
            self.i += 1  # ")"
            return True if look else empty
        if c == "[":
            self.i += 1
            if s.startswith("^", self.i):
                self.i += 1
            if s.startswith("]", self.i):
                self.i += 1
            while s[self.i] != "]":
                self.i += 2 if s[self.i] == "\\" else 1
            self.i += 1
            return False
        if c == "\\":
            m = re.match(r"\\[pP]\{[A-Za-z_]+\}", s[self.i:])
            self.i += m.end() if m else 2
            return False
        self.i += 1
        return False


def covering(regex: str) -> str:
    """The split regex for tiktoken, which keeps only what the regex matches, made to keep the
    rest too as ``tokenizers``' Isolated split does: a run of text where no match starts is one
    piece, up to the next position where one does."""
    return f"(?:{regex})|(?:(?!(?:{regex}))[\\s\\S])+"


# -- where the engines disagree ---------------------------------------------------------------------

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
    (surrogates always; the classes' and normalizer's disagreements; case folds onto ASCII).
    ``cached_only``: None where a part is not known yet, or is being probed by another thread
    (``prefetch.py``), which a call without it waits for (nothing is probed twice)."""
    import tiktoken
    import tokenizers

    wanted = ([f"class {a}" for a in pre.atoms] + ([f"normalizer {form}", "unassigned"] if form else [])
              + (["folds"] if pre.folds else []))
    key = f"v2-{tiktoken.__version__}-{tokenizers.__version__}-{sys.version_info[0]}.{sys.version_info[1]}"
    known = _KNOWN.setdefault(key, {})
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
            points = _ascii_folds(text) if kind == "folds" else _unassigned(text)
        known[what] = _runs(points)


def _class_differences(atom: str, text: str) -> list[int]:
    """Code points one engine's ``atom`` matches and the other's does not (each engine removes or
    keeps the matches of ``text``, every code point once)."""
    import tiktoken
    from tokenizers import Regex, normalizers

    enc = tiktoken.Encoding("lengthscan-probe", pat_str=atom, mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={})
    theirs = np.zeros(0x110000, bool)
    theirs[_codes(bytes(enc.encode_ordinary(text)).decode("utf-8"))] = True
    ours = np.ones(0x110000, bool)
    ours[_codes(normalizers.Replace(Regex(atom), "").normalize_str(text))] = False  # what is left did not match
    everything = _codes(text)
    return everything[ours[everything] != theirs[everything]].tolist()


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
