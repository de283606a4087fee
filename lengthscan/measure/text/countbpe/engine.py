"""Token counts of byte-level BPE texts by tiktoken's merge loop on a rank table proven to merge as
the tokenizer does (``proof.py``), with the tokenizer's own steps around it reproduced:

* added tokens split out first, as ``tokenizers`` does: those matched on the raw text, then (in
  what is left) those matched on the normalized text, leftmost-longest; each is one token. A text
  holding an added token with ``lstrip``/``rstrip``/``single_word`` goes to the tokenizer;
* ByteLevel's prefix space added to every segment that does not start with one;
* the split regex (``pattern.py``); texts with characters the engines read differently, lone
  surrogates, and texts the normalizer would change go to the tokenizer (``count`` answers -1).

Speed: many texts are joined into one string with a separator that tiktoken knows as a special
token, so one call counts thousands of texts (no Python per text) and the segments between the
separators are split and merged independently, exactly as separate calls would. The calls run on
a thread pool (tiktoken releases the GIL), one share of the batch a thread.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from lengthscan.measure.text.chunking import chunks
from lengthscan.measure.text.countbpe.codepoints import differences
from lengthscan.measure.text.countbpe.pattern import covering, normalizer_form, pre_tokenizer
from lengthscan.measure.text.countbpe.proof import Derived, Refused
from lengthscan.measure.text.countbpe.tables import derived_of

#: The separator between joined texts: a tiktoken special token no real text holds.
SEP = "\x00\ue000lengthscan-sep\ue001\x00"
#: Characters one tiktoken call counts at most (memory stays flat; a share per thread below it).
JOB_CHARS = 1_000_000
#: Below this many characters a batch is not worth a second thread.
MIN_JOB_CHARS = 32_000

_SEP_CODES = np.array(sorted(set(map(ord, SEP))), np.int64)


@dataclass(frozen=True)
class _Added:
    """The added tokens the engine splits out: raw-text and normalized-text matchers, and a matcher
    of those it cannot (their texts go to the tokenizer)."""

    raw: re.Pattern | None
    normalized: re.Pattern | None
    hard: re.Pattern | None
    texts: tuple[str, ...] = ()  # what ``raw`` and ``normalized`` match


def threads_default() -> int:
    """Every core this process may use, or one in a worker whose tokenizer threads are off."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("false", "0"):
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class CountEngine:
    """Counts (before the post-processor's tokens) for one ``tokenizer.json``; ``build`` makes it."""

    def __init__(self, encoding, sep_id: int, route: np.ndarray, form: str | None, prefix_space: bool,
                 added: _Added, derived: Derived, threads: int):
        self._enc = encoding
        self._sep_id = sep_id
        self._route = route
        self._form = form
        self._prefix = prefix_space
        self._added = added
        self.derived = derived
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._codes: dict[str, int] | None = None

    @property
    def name(self) -> str:
        import tiktoken

        return f"tiktoken {tiktoken.__version__}"

    def describe(self) -> str:
        d = self.derived
        extra = f", {d.whole_only:,} whole-word entries (ignore_merges)" if d.ignore_merges else ""
        return f"count-only BPE proven exact: {d.merged:,} merged tokens merge as the tokenizer's merge list{extra}"

    # -- counting ----------------------------------------------------------------------------
    def count(self, texts: list[str]) -> np.ndarray:
        """Token counts of ``texts`` without the post-processor's tokens; -1 where the text must be
        counted by the tokenizer itself (characters or added tokens the engine does not take)."""
        n = len(texts)
        out = np.full(n, -1, np.int64)
        ranges = list(chunks(texts, self._job_chars(texts)))
        if len(ranges) > 1 and self.threads > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="lengthscan-count")
            jobs, pending = [], []
            for a, b in ranges:  # each job counted as soon as it is prepared, while the next is
                jobs.append(self._prepare(texts, a, b))
                pending.append(self._pool.submit(self._count_joined, jobs[-1][0]))
            counted = [f.result() for f in pending]
        else:
            jobs = [self._prepare(texts, a, b) for a, b in ranges]
            counted = [self._count_joined(j[0]) for j in jobs]
        for (a, b), (_, owners, base, exact), counts in zip(ranges, jobs, counted):
            got = counts if owners is None else np.bincount(owners, weights=counts, minlength=b - a).astype(np.int64)
            got = got + base
            got[exact] = -1
            out[a:b] = got
        return out

    def _job_chars(self, texts: list[str]) -> int:
        total = sum(map(len, texts))
        return min(JOB_CHARS, max(MIN_JOB_CHARS, -(-total // self.threads)))

    def _count_joined(self, joined: str) -> np.ndarray:
        """Per-segment counts of segments joined by ``SEP``."""
        ids = self._enc.encode_to_numpy(joined, allowed_special={SEP})
        cuts = np.flatnonzero(ids == self._sep_id)
        return np.diff(np.concatenate(([-1], cuts, [ids.size]))) - 1

    def _prepare(self, texts: list[str], a: int, b: int):
        """One job: (joined segments, owner of each segment or None for one per text, added tokens
        per text, texts to leave to the tokenizer)."""
        part = texts[a:b]
        k = b - a
        joined = SEP.join(part)
        exact = self._left_over(joined, part)
        base = np.zeros(k, np.int64)
        added = self._added
        split = [False] * k
        if (added.raw is not None and added.raw.search(joined)) or (
                added.normalized is not None and added.normalized.search(joined)):
            split = [bool((added.raw and added.raw.search(t)) or (added.normalized and added.normalized.search(t)))
                     for t in part]
        if not self._prefix and not any(split) and not exact.any():
            return joined, None, base, exact
        segments, owners = [], []
        for i, text in enumerate(part):
            if exact[i]:
                continue
            pieces = self._split(text, base, i) if split[i] else [text]
            for piece in pieces:
                if piece:
                    segments.append(" " + piece if self._prefix and not piece.startswith(" ") else piece)
                    owners.append(i)
        return SEP.join(segments), np.asarray(owners, np.int64), base, exact

    # -- tokens (the offsets of rendered conversations: tiling.py) -----------------------------
    @property
    def sep_id(self) -> int:
        """The separator's id: every rank is below it."""
        return self._sep_id

    @property
    def added_codes(self) -> dict[str, int]:
        """The codes ``tokens`` gives the added tokens, by the text they match (after the rank
        ids and the separator's)."""
        if self._codes is None:
            self._codes = {t: self._sep_id + 1 + k for k, t in enumerate(sorted(set(self._added.texts)))}
        return self._codes

    def tokens(self, texts: list[str]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The tokens of ``texts``, a job at a time: (the positions of the texts it took, their
        tokens' codes one text after another, each text's number of tokens). A code is a rank id,
        or an added token's (``added_codes``). Texts the tokenizer must take (as ``count`` answers
        -1) are left out, and every text where ByteLevel adds a prefix space (a byte no text holds)."""
        if self._prefix or any(c in t for t in self.added_codes for c in "\x00\ue000\ue001"):
            return
        for a, b in chunks(texts, JOB_CHARS):
            part = texts[a:b]
            joined = SEP.join(part)
            exact = self._left_over(joined, part)
            owners = np.flatnonzero(~exact)
            if not owners.size:
                continue
            if exact.any():
                joined = SEP.join([part[i] for i in owners])
            joined, kinds = self._added_to_sep(joined)
            ids = self._enc.encode_to_numpy(joined, allowed_special={SEP}).astype(np.int64)
            cuts = np.flatnonzero(ids == self._sep_id)
            ids[cuts] = kinds
            ends = cuts[np.asarray(kinds, np.int64) == -1]
            counts = np.diff(np.concatenate(([-1], ends, [ids.size]))) - 1
            yield a + owners, ids[ids != -1], counts

    def _added_to_sep(self, joined: str) -> tuple[str, list[int]]:
        """``joined`` (texts joined by SEP) with each added token turned into SEP (raw matches
        first, then normalized ones in what is left, as the tokenizer splits them out), and what
        each SEP of it stands for: -1 where a text ends, else the added token's code."""
        codes = self.added_codes
        kinds: list[int] = []
        for pattern in (self._added.raw, self._added.normalized):
            if pattern is None:
                continue
            earlier, kinds = iter(kinds), []

            def mark(m, earlier=earlier, kinds=kinds):
                text = m.group()
                kinds.append(next(earlier, -1) if text == SEP else codes[text])
                return SEP

            joined = re.sub(f"{re.escape(SEP)}|{pattern.pattern}", mark, joined)
        return joined, kinds if kinds else [-1] * joined.count(SEP)

    def _left_over(self, joined: str, part: list[str]) -> np.ndarray:
        """Which texts of ``part`` (joined by SEP) the tokenizer must take: NUL (it could spell a
        separator), characters of the routing table, texts the normalizer changes, hard added tokens."""
        k = len(part)
        exact = np.zeros(k, bool)
        if joined.count("\x00") != 2 * (k - 1):
            exact |= ["\x00" in t for t in part]
        if not joined.isascii():
            self._route_chars(joined, part, exact)
            if self._form is not None:
                exact |= [not (t.isascii() or unicodedata.is_normalized(self._form, t)) for t in part]
        if self._added.hard is not None and self._added.hard.search(joined):
            self._mark(joined, part, self._added.hard, exact)
        return exact

    def _route_chars(self, joined: str, part: list[str], exact: np.ndarray) -> None:
        """Mark the texts holding a character of the routing table (the separator's own characters
        are looked for text by text, where the table holds them)."""
        codes = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
        hits = np.flatnonzero(self._route[codes])
        if hits.size:
            ends = np.cumsum([len(t) + len(SEP) for t in part])
            owner = np.searchsorted(ends, hits, side="right")
            inside = hits < ends[np.minimum(owner, len(part) - 1)] - len(SEP)
            exact[np.unique(owner[inside & (owner < len(part))])] = True
        if self._route[_SEP_CODES].any():
            exact |= [any(c in t for c in SEP) for t in part]

    @staticmethod
    def _mark(joined: str, part: list[str], pattern: re.Pattern, exact: np.ndarray) -> None:
        """Mark the texts of ``part`` (joined by SEP) where ``pattern`` matches, one search a text."""
        ends = np.cumsum([len(t) + len(SEP) for t in part])
        pos = 0
        while (m := pattern.search(joined, pos)) is not None:
            i = int(np.searchsorted(ends, m.start(), side="right"))
            if i >= len(part):
                break
            if m.start() < ends[i] - len(SEP):  # not a match inside the separator after text i
                exact[i] = True
            pos = int(ends[i])

    def _split(self, text: str, base: np.ndarray, i: int) -> list[str]:
        """``text`` without its added tokens (counted into ``base[i]``), raw matches first."""
        out = []
        for piece in _cut(text, self._added.raw, base, i):
            out += _cut(piece, self._added.normalized, base, i)
        return out

    # -- pickling: the pool stays behind --------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _cut(text: str, pattern: re.Pattern | None, base: np.ndarray, i: int) -> list[str]:
    if pattern is None:
        return [text]
    pieces = pattern.split(text)
    base[i] += len(pieces) - 1
    return pieces


# -- building ---------------------------------------------------------------------------------------

def build(backend, *, cache_dir: Path | None = None, threads: int | None = None,
          cached_only: bool = False, ready: Callable[[], None] | None = None) -> CountEngine | None:
    """The engine for a ``tokenizers.Tokenizer`` (untruncated, unpadded), or ``Refused`` (or
    ImportError without tiktoken). ``cached_only``: None where its proof (the rank table, the
    code-point differences) is not in this process or ``cache_dir`` yet: nothing is proven now.
    ``ready``: called (waited for) once the backend is read, before the proof is looked up (a
    first run's prover process is making it into the cache meanwhile)."""
    import tiktoken

    pre = pre_tokenizer(component_state(backend.pre_tokenizer))
    form = normalizer_form(component_state(backend.normalizer))
    tokens = [{"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "single_word": t.single_word,
               "normalized": t.normalized, "special": t.special}
              for _, t in sorted(backend.get_added_tokens_decoder().items())]
    added = _added(tokens, form, bool(backend.encode_special_tokens))
    vocab = backend.get_vocab(with_added_tokens=False)  # the live map: a serialized model keeps one token per id
    if len(set(vocab.values())) != len(vocab):
        raise Refused("the vocabulary gives one id to several tokens (merges follow ids, not strings)")
    derived = derived_of(backend, cache_dir, cached_only=cached_only, ready=ready)
    if derived is None:
        return None
    sep_id = max(derived.ranks.values()) + 1
    try:
        enc = tiktoken.Encoding("lengthscan-count", pat_str=covering(pre.regex), mergeable_ranks=derived.ranks,
                                special_tokens={SEP: sep_id})
    except Exception as exc:  # the regex crate's message: the pattern does not compile there
        raise Refused(f"the split regex does not compile in tiktoken: {str(exc).splitlines()[0][:120]}") from exc
    route = differences(pre, form, cache_dir, cached_only=cached_only)
    if route is None:
        return None
    if route[:128].any():
        raise Refused("the two regex engines read ASCII characters of the split regex differently")
    return CountEngine(enc, sep_id, route, form, pre.prefix_space, added, derived, threads or threads_default())


def component_state(component) -> dict | None:
    """A tokenizers component as its ``tokenizer.json`` entry."""
    return None if component is None else json.loads(component.__getstate__())


def _added(tokens: list[dict], form: str | None, encode_special_tokens: bool) -> _Added:
    raw, normalized, hard = [], [], []
    for t in tokens:
        content = t.get("content") or ""
        if not content:
            continue
        if (t.get("special") and encode_special_tokens) or t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            # matched, then kept as text (encode_special_tokens) or stretched over spaces: the tokenizer counts
            hard += [content, unicodedata.normalize(form, content)] if form else [content]
        elif t.get("normalized", not t.get("special")):
            normalized.append(unicodedata.normalize(form, content) if form else content)
        else:
            raw.append(content)
    return _Added(_alternation(raw), _alternation(normalized), _alternation(hard), tuple(raw + normalized))


def _alternation(contents: list[str]) -> re.Pattern | None:
    """Leftmost-longest matching of literal strings (longest first at each position)."""
    if not contents:
        return None
    ordered = sorted(set(contents), key=lambda c: (-len(c), c))
    return re.compile("|".join(re.escape(c) for c in ordered))
