"""Property: whatever the rows, limits and action, ``clean`` accounts for every row exactly once.

Hypothesis writes a JSON Lines source of up to 40 rows with a unique ``id`` and bad rows mixed in
(null, empty, whitespace-only, very long, Unicode/emoji texts and summaries), picks 1-2 limit
rules (absolute or percentile upper limits, small lower bounds, per-rule ``:drop``/``:truncate``
suffixes), an ``action``, ``keep_empty_targets`` and ``max_chars``, and checks that kept +
truncated + dropped = rows in the result and in ``report.json``, and that ``dataset/`` and
``rejects/`` together hold every source id once, rejects each with a reason. The Ray engine's
variant (same strategy, compared with this engine) is ``ray/test_ray_property_accounting.py``.

Non-string values are not generated: a text column holding one is a usage error for the whole
source (``ColumnError``, exit 2), not a per-row reason.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from datasets import load_from_disk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lengthscan
from lengthscan.policy.rules import RuleError
from lengthscan.sources.source import SourceError
from tests.factories import write_jsonl
from tests.support.texts import EDGE_TEXTS

pytestmark = pytest.mark.slow  # a hypothesis search of 25 generated sources, each cleaned

# -- the generated cases (shared with the Ray variant) ---------------------------------------------

WHITESPACE = st.sampled_from([" ", "   ", "\t", "\n", " \t\r\n ", "\u00a0", "\u3000"])
LONG = st.builds(lambda word, n: (word + " ") * n, st.sampled_from(["word", "héllo", "😀", "中文", "a-b"]),
                 st.integers(30, 400))
UNICODE = st.one_of(st.sampled_from(EDGE_TEXTS),
                    st.text(alphabet=st.sampled_from(list("ab é😀👍🏽\u0301中\n\u200d🇫🇷")), min_size=1, max_size=30))
WORDS = st.lists(st.sampled_from(["the", "data", "row", "token", "naïve", "😀", "中文", "x", "\n", "--"]),
                 min_size=1, max_size=40).map(" ".join)
TEXT = st.one_of(st.none(), st.just(""), WHITESPACE, LONG, UNICODE, st.text(max_size=60), WORDS, WORDS)

#: Upper limits may truncate; lower bounds only drop (``:truncate`` on one is a usage error).
UPPER = st.tuples(st.sampled_from(["<=", "<"]),
                  st.one_of(st.integers(1, 60).map(str), st.sampled_from(["p50", "p90", "p99"])),
                  st.sampled_from(["", ":drop", ":truncate"]))
LOWER = st.tuples(st.sampled_from([">=", ">"]), st.integers(1, 8).map(str), st.sampled_from(["", ":drop"]))
RULE = st.builds(lambda metric, rule: metric + "".join(rule),
                 st.sampled_from(["input_tokens", "target_tokens"]), st.one_of(UPPER, UPPER, LOWER))


@dataclass(frozen=True)
class Case:
    rows: list  # dicts: id, text, summary
    limits: list
    action: str
    keep_empty_targets: bool
    max_chars: int

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return write_jsonl(folder / "source.jsonl", self.rows, ensure_ascii=False)

    def kwargs(self, bpe_dir) -> dict:
        return dict(tokenizer=str(bpe_dir), input="text", target="summary", limits=self.limits, action=self.action,
                    keep_empty_targets=self.keep_empty_targets, max_chars=self.max_chars)

    def refusal(self):
        """The usage error documented for this case (None: it must run): no rows at all, or a
        percentile rule over a field no row has a length of (None, or over ``max_chars``)."""
        if not self.rows:
            return SourceError, "holds no rows"
        for rule in self.limits:
            metric, value = re.fullmatch(r"(\w+)[<>]=?(\w+)(?::\w+)?", rule).groups()
            column = "text" if metric == "input_tokens" else "summary"
            if value.startswith("p") and not any(
                    isinstance(r[column], str) and len(r[column]) <= self.max_chars for r in self.rows):
                return RuleError, "no row of the train split has"
        return None


@st.composite
def cases(draw, max_rows: int = 40) -> Case:
    ids = draw(st.lists(st.integers(0, 10**9), unique=True, max_size=max_rows))
    rows = [{"id": i, "text": draw(TEXT), "summary": draw(TEXT)} for i in ids]
    return Case(rows, draw(st.lists(RULE, min_size=1, max_size=2)), draw(st.sampled_from(["drop", "truncate"])),
                draw(st.booleans()), draw(st.sampled_from([10_000_000, 10_000_000, 300])))


def clean_checked(run, case: Case, bpe_dir, folder: Path, **extra):
    """``run`` (``lengthscan.clean`` or ``clean_ray``) on ``case``, with the accounting checked;
    returns the split's counts, the kept ids (in order) and the rejected ids with their reasons,
    or None where the case is refused as documented."""
    source, out = case.write(folder), folder / "out"
    refusal = case.refusal()
    if refusal is not None:
        with pytest.raises(refusal[0], match=refusal[1]):
            run(str(source), out=out, **case.kwargs(bpe_dir), **extra)
        assert not out.exists()
        return None
    result = run(str(source), out=out, **case.kwargs(bpe_dir), **extra)
    assert result.published
    n, ids = len(case.rows), [r["id"] for r in case.rows]
    (split,) = result.decisions.to_dict()["splits"]
    (reported,) = json.loads((out / "report.json").read_text())["decisions"]["splits"]
    counts = {k: split[k] for k in ("rows", "kept", "truncated", "dropped")}
    assert counts == {k: reported[k] for k in counts}
    assert split["rows"] == n and split["kept"] + split["truncated"] + split["dropped"] == n

    kept, rejects = load_from_disk(str(out / "dataset")), load_from_disk(str(out / "rejects"))
    assert len(kept) == split["kept"] + split["truncated"] and len(rejects) == split["dropped"]
    kept_ids, rejected_ids = list(kept["id"]), list(rejects["id"])
    assert sorted(kept_ids + rejected_ids) == sorted(ids)  # every id once: nothing lost, nothing twice
    assert kept_ids == [i for i in ids if i in set(kept_ids)]  # source order
    assert [ids[r] for r in rejects["row"]] == rejected_ids  # `row` locates the source row
    assert all(isinstance(r, str) and r.strip() for r in rejects["reason"])
    assert all(reasons and r in reasons for r, reasons in zip(rejects["reason"], rejects["reasons"]))
    by_id = {r["id"]: r for r in case.rows}
    for i, text, summary in zip(kept_ids, kept["text"], kept["summary"]):  # truncation keeps prefixes
        assert by_id[i]["text"].startswith(text) and by_id[i]["summary"].startswith(summary)
    return counts, kept_ids, dict(zip(rejected_ids, rejects["reason"]))


# -- the local engine ------------------------------------------------------------------------------

@given(cases())
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_every_row_is_kept_truncated_or_dropped_once(bpe_dir, case):
    with tempfile.TemporaryDirectory() as folder:
        clean_checked(lengthscan.clean, case, bpe_dir, Path(folder), cache=False)
