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
the Kelvin sign onto ``k``). ``codepoints.differences`` measures the first for every class of the pattern
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
from dataclasses import dataclass

from lengthscan.measure.text.countbpe.proof import Refused

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
    folds: tuple[str, ...]     # the regex's case-insensitive groups, as written (probed in both engines)


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


def scan(regex: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The single-character classes of a regex and its case-insensitive groups (``(?i:...)`` as
    written, outermost), or ``Refused`` for a construct the two engines may read differently
    (module docstring). Inside ``(?i:...)`` only ASCII literals and ASCII classes are taken: case
    folding beyond ASCII (``ß``/``ss``, ``\\p{Lu}``) differs between the engines."""
    atoms: list[str] = []
    folds: list[str] = []
    groups: list[bool] = []  # per open group: is it (?i:...)
    fold_at = -1  # where the outermost open (?i:...) group begins
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
                if fold and not any(groups):
                    fold_at = i
                i += len(group)
            else:
                i += 1
            groups.append(fold)
            continue
        if c == ")":
            if not groups:
                raise Refused("unbalanced brackets in the regex")
            if groups.pop() and not any(groups):
                folds.append(regex[fold_at:i + 1])
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
    return tuple(dict.fromkeys(atoms)), tuple(dict.fromkeys(folds))


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
    piece, up to the next position where one does. The contractions' alternatives are written
    with their apostrophe once (``factored``)."""
    regex = factored(regex)
    return f"(?:{regex})|(?:(?!(?:{regex}))[\\s\\S])+"


#: The contractions the released byte-level regexes try first, one alternative each
CONTRACTION_RUN = "'s|'t|'re|'ve|'m|'ll|'d"
#: Its factored form: the same ordered choice, the apostrophe tried once
FACTORED_RUN = "'(?:s|t|re|ve|m|ll|d)"


def factored(regex: str) -> str:
    """``regex`` with the contractions' run of alternatives (GPT-2's ``'s|'t|'re|'ve|'m|'ll|'d``)
    written ``'(?:s|t|re|ve|m|ll|d)`` where the run is a whole run of alternatives: the regex's
    first ones (GPT-2's), or a group's whole content (``(?i:...)``: GPT-4's, Llama 3's, Qwen's).
    A literal prefix taken out of adjacent alternatives keeps what they match, in their order;
    fancy-regex tries it about a third faster on GPT-2's regex (the apostrophe once at each
    position, not seven times). A group opened by an escaped parenthesis is a literal: left alone."""
    out, at = [], 0
    while (k := regex.find(CONTRACTION_RUN, at)) >= 0:
        end = k + len(CONTRACTION_RUN)
        first = k == 0 and regex[end:end + 1] in ("", "|")
        opener = next((g for g in ("(?i:", "(?:") if k >= len(g) and regex.startswith(g, k - len(g))), None)
        whole = (opener is not None and regex[end:end + 1] == ")"
                 and not _escaped(regex, k - len(opener)))
        out.append(regex[at:k])
        out.append(FACTORED_RUN if first or whole else CONTRACTION_RUN)
        at = end
    out.append(regex[at:])
    return "".join(out)


def _escaped(regex: str, i: int) -> bool:
    """The character at ``i`` follows an odd run of backslashes."""
    n = 0
    while i - n - 1 >= 0 and regex[i - n - 1] == "\\":
        n += 1
    return n % 2 == 1
