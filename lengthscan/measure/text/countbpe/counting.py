"""The count-only engine as one role's counter: the post-processor's tokens added, the texts it
leaves to the tokenizer counted there, ``--verify-counts`` rows recounted by the tokenizer itself,
and what it did, for the report."""

from __future__ import annotations

import heapq
import itertools

import numpy as np

#: Texts the engine is checked on before a role uses it (besides the counter's probes and the
#: role's first texts): the places where two BPE implementations part.
ADVERSARIAL = (
    "don't DON'T it's IT'S we'Re they'VE I'M you'LL he'D 'S 'T",
    "   leading spaces", "trailing spaces   ", "a  b   c    d\t\te\n\n\nf \n g\r\n\r\nh",
    "\u00a0nbsp\u2009thin\u3000ideographic\u2028line\u2029para\u0085nel",
    "1 12 123 1234 12345 123456 1234567 3.14159 1e-10 0x1F ١٢٣ ۴۵۶ ३४५ ５６７",
    "中文字符测试，日本語のテキスト。한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "e\u0301 a\u0308 n\u0303 combining \u0301\u0301\u0301 Z\u0351\u0352\u0353",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "================================================================",
    "                                                                x",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 8,
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}  # ok\n",
    "<html><body class=\"x\">&nbsp;&amp;</body></html>",
    "Ελληνικά русский עברית العربية हिन्दी ไทย",
)


class CountMismatch(RuntimeError):
    """``--verify-counts`` found a row the engine counted otherwise than the tokenizer (a bug)."""


class RoleEngine:
    """Counts one role's strings with a proven ``CountEngine``; ``verify`` rows recounted by
    ``recount`` (the tokenizer's own call)."""

    def __init__(self, engine, backend, role: str, specials: int, *, verify: int = 0, recount=None, seed: int = 0):
        self.engine = engine
        self.backend = backend
        self.role = role
        self.specials = specials
        self.verify = verify
        self.recount = recount
        self._rng = np.random.default_rng(seed)
        self._kept: list = []   # bottom-``verify`` keys seen (a max-heap by negation)
        self._tie = itertools.count()
        self.counted = 0        # texts the engine counted
        self.by_tokenizer = 0   # texts it left to the tokenizer
        self.verified = 0       # rows recounted by the tokenizer itself
        self.failed: str | None = None  # why the engine stopped counting (the tokenizer counts from then on)

    def _by_tokenizer(self, texts: list[str], rows: int) -> np.ndarray:
        self.by_tokenizer += rows
        add = self.role != "chat"
        return np.array([len(e) for e in self.backend.encode_batch_fast(texts, add_special_tokens=add)], np.int64)

    def count(self, texts: list[str], rows=None) -> np.ndarray:
        """Counts of ``texts``; ``rows`` (a mask, None: all) marks the rows of the tallies and the
        ``verify`` sample: prefixes and probes are counted alike but are no rows."""
        rows = np.ones(len(texts), bool) if rows is None else np.array(rows, bool)
        if "" in texts:  # "" is the specials' length (asked for itself, or an empty row): no text counted
            rows[[i for i, t in enumerate(texts) if not t]] = False
        if self.failed is not None:
            return self._by_tokenizer(texts, int(rows.sum()))
        try:
            counts = self.engine.count(texts)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - tiktoken's Rust panics are BaseExceptions
            self.failed = (f"the count-only engine failed ({type(exc).__name__}: {str(exc)[:100]}); "
                           "the tokenizer counted from there")
            return self._by_tokenizer(texts, int(rows.sum()))
        left = np.flatnonzero(counts < 0)
        counts[counts >= 0] += self.specials
        if left.size:
            counts[left] = self._by_tokenizer([texts[i] for i in left], int(rows[left].sum()))
            rows[left] = False  # the engine's rows: not those left to the tokenizer
        self.counted += int(rows.sum())
        if self.verify:
            self._verify(texts, counts, rows)
        return counts

    def _verify(self, texts: list[str], counts: np.ndarray, rows: np.ndarray) -> None:
        """Recount the ``rows`` (those the engine counted) that enter a uniform bottom-k sample of
        them (every row of the final sample was recounted when it entered): never more than
        ``counted``, each row at most once."""
        keys = self._rng.random(len(texts))
        keys[~rows] = 2.0  # counted by the tokenizer already, or ""
        chosen = []
        for i in np.argsort(keys):
            key = keys[i]
            if key > 1.0 or (len(self._kept) >= self.verify and key >= -self._kept[0][0]):
                break
            heapq.heappush(self._kept, (-key, next(self._tie)))
            if len(self._kept) > self.verify:
                heapq.heappop(self._kept)
            chosen.append(int(i))
        if not chosen:
            return
        theirs = self.recount([texts[i] for i in chosen], self.role)
        self.verified += len(chosen)
        for i, n in zip(chosen, theirs):
            if n != counts[i]:
                raise CountMismatch(
                    f"--verify-counts: the count-only engine ({self.engine.name}) counted {int(counts[i]):,} "
                    f"{self.role} tokens where the tokenizer counts {n:,}, for the text {texts[i][:80]!r}; "
                    "rerun with --count-engine tokenizers, and please report it")

    def to_dict(self, reason: str) -> dict:
        """The report's entry. The tallies depend on how the run was laid out (workers, actors, a
        second pass), so they are reported with ``--verify-counts`` only, where they say what
        was checked."""
        if self.failed is not None:
            reason = f"{reason}; {self.failed}"
        out = {"engine": self.engine.name, "reason": reason}
        if self.verify:
            out.update(texts=self.counted, by_tokenizer=self.by_tokenizer, verified=self.verified)
        return out


def engine_for(backend, cache_dir, *, cached_only: bool = False, ready=None):
    """(CountEngine, reason) when the count-only engine is proven for this backend, else (None, why not);
    ``cached_only``: None where the proof is not made yet (``build``'s ``cached_only``); ``ready``:
    waited for once the backend is read (``build``'s)."""
    from lengthscan.measure.text.countbpe.engine import build
    from lengthscan.measure.text.countbpe.proof import Refused

    try:
        engine = build(backend, cache_dir=cache_dir, cached_only=cached_only, ready=ready)
        if engine is None:
            return None
    except ImportError:
        return None, "tiktoken is not installed (pip install tiktoken): counted by tokenizers"
    except Refused as exc:
        return None, f"count-only engine not proven: {exc}"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a tokenizer the engine cannot read (Rust panics included)
        return None, f"count-only engine not built ({type(exc).__name__}: {str(exc)[:100]}): counted by tokenizers"
    return engine, engine.describe()


def role_engine(engine, backend, role: str, probe: list[str], *, verify: int, recount):
    """(RoleEngine, None) when ``engine`` agrees with the backend on the adversarial texts and
    ``probe`` for this role; (None, why not) otherwise."""
    add = role != "chat"
    specials = len(backend.encode("x", add_special_tokens=add)) - len(backend.encode("x", add_special_tokens=False))
    texts = [t for t in list(ADVERSARIAL) + list(probe) if t]
    try:
        counts = engine.count(texts)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - tiktoken's Rust panics are BaseExceptions
        return None, f"count-only engine failed on the probes ({type(exc).__name__}): counted by tokenizers"
    theirs = [len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=add)]
    for text, ours, n in zip(texts, counts, theirs):
        if ours >= 0 and ours + specials != n:
            return None, f"count-only engine disagrees with the tokenizer on {text[:40]!r}: counted by tokenizers"
    return RoleEngine(engine, backend, role, specials, verify=verify, recount=recount), None
