"""Limit rules (``--limit``) and the per-row decision table: pure functions, no I/O.

A rule is ``METRIC OP VALUE[:ACTION]``; ``parse_rule`` reads it, ``resolve_rules`` turns its value
into an absolute threshold (a percentile of the train split, the model's own limit, a robust
z-score), and ``decide`` gives every row ``keep``, ``truncate`` or ``drop`` with the reason.

The decision table, in the order the conditions are checked (``reason`` is the first condition
that decided the row's outcome; ``reasons`` lists every condition it failed):

1. ``{role}_missing``: the input or target is None. Drop.
2. ``{role}_{flag}``: it has no length: ``too_long`` (over --max-chars), ``missing_file``,
   ``unreadable``. Drop.
3. ``empty_target``: the target has no content tokens (its length is the empty string's: nothing
   to compute a loss on). Drop, unless ``keep_empty_targets``.
4. every rule, in the order given. A failed rule drops the row unless its action is ``truncate``
   and the rule is an upper limit (``<=``/``<``) on a token count (``input_tokens``,
   ``target_tokens``): then the text is truncated to the smallest such limit. Lower bounds,
   ratios and z-score rules always drop. Upper limits on audio drop (cropping speech breaks its
   transcript) unless ``crop_audio``, which crops the audio to an ``input_seconds`` limit instead
   (limits on samples or frames still drop: state them in seconds to crop). A truncating limit
   below the text's special tokens cannot be met by truncation: drop.

A row is dropped if any failed condition drops it, else truncated if any truncates it, else kept.
Rules are evaluated on the lengths as measured, before any truncation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from lengthscan.measure.audio.parts import AUDIO_PART_METRICS
from lengthscan.measure.chat.metrics import CHAT_METRICS
from lengthscan.measure.images import IMAGE_METRICS
from lengthscan.measure.video import VIDEO_METRICS
from lengthscan.sources.source import did_you_mean
from lengthscan.stats.histograms import (
    Histogram,
    metric_values,
    nearest_rank_index,
    value_at_rank,
)

KEEP, TRUNCATE, DROP = 0, 1, 2
DECISIONS = {KEEP: "keep", TRUNCATE: "truncate", DROP: "drop"}
_DECISION_NAMES = np.array([DECISIONS.get(i, "") for i in range(max(DECISIONS) + 1)], dtype=object)
ACTIONS = ("drop", "truncate", "drop-turns")
TOKEN_METRICS = ("input_tokens", "target_tokens")
AUDIO_METRICS = ("input_seconds", "input_samples", "input_frames")
#: Upper limits on a conversation's ``sequence_tokens`` may truncate (as TRL slices) or drop turns.
SEQUENCE = "sequence_tokens"
MEASUREMENTS = TOKEN_METRICS + AUDIO_METRICS + CHAT_METRICS + IMAGE_METRICS + VIDEO_METRICS + AUDIO_PART_METRICS
MAD_SCALE = 1.4826  # MAD x 1.4826 estimates the standard deviation of a normal distribution

RULE_FORMS = """a limit rule is METRIC OP VALUE[:ACTION]
  METRIC  a measurement: input_tokens, target_tokens, input_seconds, input_samples, input_frames;
          conversations: sequence_tokens, prompt_tokens, completion_tokens, turns, assistant_turns,
          longest_message_tokens; with images: image_tokens, images; with videos: video_tokens,
          videos, video_frames, video_seconds; with audio: audio_tokens, audios, audio_seconds;
          or a ratio of two: target_tokens/input_seconds, target_tokens/input_tokens
  OP      <=  <  >=  >            (the rows to keep)
  VALUE   a number (1024, 0.5); pNN (p99, p99.9: that percentile of the train split);
          model (the --model's own limit); zK (z4: median + 4 x 1.4826 x MAD, median - ... for >=)
  ACTION  drop, truncate or drop-turns (sequence_tokens only), overriding --action for this rule
  e.g.    'input_tokens<=1024'  'target_tokens<=p99:truncate'  'sequence_tokens<=4096:drop-turns'"""

#: the one-line hint a malformed rule's message ends with (``RULE_FORMS`` is in ``--help``)
RULE_HINT = ("write METRIC OP VALUE[:ACTION], e.g. 'input_tokens<=1024' or 'target_tokens<=p99:truncate' "
             "(lengthscan clean --help lists every metric and value)")

_RULE = re.compile(r"^\s*([a-z_]+(?:\s*/\s*[a-z_]+)?)\s*(<=|>=|<|>)\s*([^:\s]+)\s*(?::\s*([a-z-]+))?\s*$")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
OPS = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater}


class RuleError(ValueError):
    """A malformed or unusable limit rule (exit code 2); the message shows the accepted forms."""


@dataclass(frozen=True)
class Rule:
    """A limit rule as written: which rows to keep."""

    text: str
    metric: str
    op: str
    value: str
    action: str | None = None

    @property
    def upper(self) -> bool:
        return self.op in ("<=", "<")

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.metric.split("/"))

    @property
    def is_ratio(self) -> bool:
        return "/" in self.metric

    @property
    def kind(self) -> str:
        v = self.value
        return "model" if v == "model" else "percentile" if v[0] == "p" else "z" if v[0] == "z" else "number"


def parse_rule(text: str) -> Rule:
    """``'target_tokens<=p99:truncate'`` -> Rule; RuleError with the accepted forms otherwise."""
    m = _RULE.match(text or "")
    if not m:
        raise RuleError(f"cannot read limit rule {text!r}: {RULE_HINT}")
    metric, op, value, action = m.group(1).replace(" ", ""), m.group(2), m.group(3), m.group(4)
    for part in metric.split("/"):
        if part not in MEASUREMENTS:
            guess = did_you_mean(part, MEASUREMENTS)
            raise RuleError(f"limit rule {text!r}: unknown metric {part}; "
                            + (f"did you mean {guess}?" if guess else f"metrics: {', '.join(MEASUREMENTS)}"))
    if action is not None and action not in ACTIONS:
        guess = did_you_mean(action, ACTIONS)
        raise RuleError(f"limit rule {text!r}: unknown action {action}; "
                        + (f"did you mean {guess}?" if guess else "drop, truncate or drop-turns"))
    ok = (value == "model" or (_NUMBER.match(value) and math.isfinite(float(value)))
          or (value[0] in "pz" and _NUMBER.match(value[1:]) and 0 < float(value[1:]) < math.inf
              and (value[0] == "z" or float(value[1:]) <= 100)))
    if not ok:
        raise RuleError(f"limit rule {text!r}: cannot read the value {value!r}: a finite number, pNN (a "
                        "percentile over 0, up to 100), model, or zK (a finite K over 0)")
    if _NUMBER.match(value) and float(value) < 0:
        raise RuleError(f"limit rule {text!r}: {value} is below 0, and no length or ratio is: every row would "
                        f"{'fail' if op in ('<=', '<') else 'pass'} it")
    rule = Rule(text.strip(), metric, op, value, action)
    if action == "truncate" and not (rule.upper and metric in TOKEN_METRICS + (SEQUENCE,) and rule.kind != "z"):
        raise RuleError(f"limit rule {text!r}: truncate applies to upper limits (<=, <) on input_tokens, "
                        f"target_tokens or sequence_tokens, not to "
                        f"{'z-scores' if rule.kind == 'z' else metric + ' ' + op}")
    if action == "drop-turns" and not (rule.upper and metric == SEQUENCE and rule.kind != "z"):
        raise RuleError(f"limit rule {text!r}: drop-turns applies to upper limits (<=, <) on sequence_tokens")
    if rule.kind == "model" and rule.is_ratio:
        raise RuleError(f"limit rule {text!r}: a model has no limit on a ratio")
    return rule


@dataclass(frozen=True)
class ResolvedRule:
    """A rule with its absolute threshold and the action it takes on a failing row."""

    rule: Rule
    threshold: float
    origin: str
    action: str  # "drop", "truncate" or "crop"

    def to_dict(self) -> dict:
        return {"rule": self.rule.text, "metric": self.rule.metric, "op": self.rule.op, "value": self.rule.value,
                "threshold": self.threshold, "origin": self.origin, "action": self.action}


def effective_action(rule: Rule, default: str, crop_audio: bool) -> str:
    """What a failing row gets: truncate only for upper token limits, crop for audio when asked."""
    wanted = rule.action or default
    if rule.upper and rule.kind != "z" and not rule.is_ratio:
        if rule.metric in TOKEN_METRICS + (SEQUENCE,) and wanted == "truncate":
            return "truncate"
        if rule.metric == SEQUENCE and wanted == "drop-turns":
            return "drop-turns"
        if rule.metric == "input_seconds" and crop_audio:
            return "crop"
    return "drop"


def resolve_rules(rules, *, histograms: dict[str, tuple[Histogram, int]], default_action: str = "drop",
                  model_limits=None, crop_audio: bool = False, basis: str = "train") -> tuple[ResolvedRule, ...]:
    """Absolute thresholds: ``histograms`` maps a metric to (histogram in integer units, scale)."""
    if default_action not in ACTIONS:
        raise RuleError(f"--action {default_action!r}: choose drop or truncate")
    out = []
    for rule in rules:
        if rule.kind == "number":
            threshold, origin = float(rule.value), "as given"
        elif rule.kind == "model":
            limit = model_limits.get(rule.metric) if model_limits is not None else None
            if limit is None:
                why = "no --model given" if model_limits is None else f"{model_limits.model} has no {rule.metric} limit"
                raise RuleError(f"limit rule {rule.text!r}: {why}")
            threshold, origin = float(limit.value), f"model: {limit.origin}"
        else:
            if rule.metric not in histograms:
                raise RuleError(f"limit rule {rule.text!r}: {rule.metric} is not measured here")
            hist, scale = histograms[rule.metric]
            if hist.n == 0:
                raise RuleError(f"limit rule {rule.text!r}: no row of the {basis} split has a {rule.metric}")
            threshold, origin = _from_distribution(rule, hist, scale, basis)
        out.append(ResolvedRule(rule, threshold, origin, effective_action(rule, default_action, crop_audio)))
    return tuple(out)


def _from_distribution(rule: Rule, hist: Histogram, scale: int, basis: str) -> tuple[float, str]:
    n = hist.n
    q = float(rule.value[1:])
    if rule.kind == "percentile":
        value = value_at_rank(hist, nearest_rank_index(n, q)) / scale
        return value, f"{rule.value} of {rule.metric} on the {basis} split ({n:,} rows, nearest rank)"
    median = value_at_rank(hist, nearest_rank_index(n, 50))
    deviation = _abs_dev(hist, median)
    mad = value_at_rank(deviation, nearest_rank_index(n, 50))
    sign = 1 if rule.upper else -1
    value = (median + sign * q * MAD_SCALE * mad) / scale
    return value, (f"{rule.value}: median {median / scale:g} {'+' if sign > 0 else '-'} {q:g} x 1.4826 x MAD "
                   f"{mad / scale:g} of {rule.metric} on the {basis} split ({n:,} rows)")


def _abs_dev(hist: Histogram, center: int) -> Histogram:
    """Histogram of |x - center| (exact: same counts, folded values)."""
    from lengthscan.stats.histograms import merge_histograms

    return merge_histograms([Histogram(np.abs(hist.values - center), hist.counts.copy())])


@dataclass(frozen=True, eq=False)
class Decisions:
    """Per row: decision code, the deciding reason, every failed condition, and truncation targets."""

    decision: np.ndarray
    reason: list
    reasons: list
    truncate_to: dict = field(default_factory=dict)  # role -> int64 limit per row (-1: none)
    crop_seconds: np.ndarray | None = None           # seconds per row (NaN: none)
    drop_turns: np.ndarray | None = None             # conversations cut by turns, not tokens (bool per row)

    def names(self) -> list[str]:
        return _DECISION_NAMES[self.decision].tolist()


def decide(base: dict[str, np.ndarray], flags: dict[str, np.ndarray], rules, *, special: dict[str, int],
           keep_empty_targets: bool = False, errors: dict | None = None) -> Decisions:
    """The decision table (see the module docstring) over one batch of rows.

    ``base``: measurement -> values (-1/NaN where none; in decide-only mode a proven bound stands
    in for the exact length of rows decided without a full count); ``flags``: role -> flag codes;
    ``special``: role -> length of the empty string for that role (its special tokens); ``errors``:
    role -> per-row messages that the reasons of rows without a length carry (conversations).
    """
    from lengthscan.measure.records import BOUNDED_FLAGS, FLAG_MISSING, FLAG_NAMES, FLAG_OK, MEASURED_FLAGS

    n = next(iter(flags.values())).size
    failed: list[list[tuple[str, str]]] = [[] for _ in range(n)]

    def fail(mask: np.ndarray, reason: str, action: str) -> None:
        for i in np.flatnonzero(mask):
            failed[i].append((reason, action))

    for role, codes in flags.items():
        fail(codes == FLAG_MISSING, f"{role}_missing", "drop")
        for code in np.unique(codes):
            if int(code) not in MEASURED_FLAGS + BOUNDED_FLAGS and int(code) not in (FLAG_MISSING, FLAG_OK):
                if (errors or {}).get(role) is not None:  # the template's (or the check's) own message
                    for i in np.flatnonzero(codes == code):
                        failed[i].append((f"{FLAG_NAMES[int(code)]}: {errors[role][i]}", "drop"))
                    continue
                fail(codes == code, f"{role}_{FLAG_NAMES[int(code)]}", "drop")
    if "target_tokens" in base and not keep_empty_targets and "target" in special:
        t = base["target_tokens"]
        fail((t >= 0) & (t <= special["target"]), "empty_target", "drop")
    if SEQUENCE in base and "completion_tokens" in base:  # a conversation (not a preference pair)
        chat_conditions(base, fail, keep_empty_targets)
    if "pair_collapsed" in base and not keep_empty_targets:  # a pair with nothing to learn (as the trainer cuts it)
        fail(base["pair_collapsed"] > 0, "pair_collapsed", "drop")
        fail((base["chosen_tokens"] == 0) | (base["rejected_tokens"] == 0), "empty_answer", "drop")

    pairs = "chosen_tokens" in base  # a preference field: its sequences cut as pairs (policy/pairs.py)
    truncate_to = {role: np.full(n, -1, np.int64) for role in ("input", "target") if f"{role}_tokens" in base}
    if SEQUENCE in base:
        truncate_to["pair" if pairs else "chat"] = np.full(n, -1, np.int64)
    turns = np.zeros(n, bool)
    crop = np.full(n, np.nan)
    for r in rules:
        values = metric_values(r.rule.metric, base)
        # a row without the measurement never passes a limit on it (its flag usually says why first)
        lacking = np.zeros(n, bool)
        for part in r.rule.parts:
            lacking |= np.isnan(metric_values(part, base))
        if lacking.any():
            fail(lacking, f"{r.rule.text} (no {' or '.join(r.rule.parts)})", "drop")
        bad = ~OPS[r.rule.op](values, r.threshold) & ~np.isnan(values) & ~lacking
        if not bad.any():
            continue
        if r.action in ("truncate", "drop-turns"):
            role = ("pair" if pairs else "chat") if r.rule.metric == SEQUENCE else r.rule.metric.split("_")[0]
            cap = int_cap(r.threshold, r.rule.op)
            if cap < special.get(role, 0):
                fail(bad, f"{r.rule.text} (below the {special[role]} special tokens)", "drop")
                continue
            if r.action == "truncate" and role == "pair":
                from lengthscan.policy.pairs import pair_truncation

                bad = pair_truncation(base, bad, cap, fail)
            if r.action == "truncate" and role == "chat":
                # as TRL slices: a conversation whose trained tokens all lie past the cut is dropped
                start = base["trained_from"]
                lost = bad & (base["completion_tokens"] >= 0) & ((start < 0) | (start >= cap))
                fail(lost, f"no_trained_tokens (after truncating to {cap:,} tokens)", "drop")
                bad = bad & ~lost
            fail(bad, r.rule.text, "truncate")
            if r.action == "drop-turns":
                turns |= bad
            current = truncate_to[role]
            current[bad] = np.where(current[bad] < 0, cap, np.minimum(current[bad], cap))
        elif r.action == "crop":
            fail(bad, r.rule.text, "crop")
            crop[bad] = np.fmin(crop[bad], r.threshold)
        else:
            fail(bad, r.rule.text, "drop")

    decision = np.zeros(n, np.int8)
    reason: list = [None] * n
    for i, items in enumerate(failed):
        if not items:
            continue
        drops = [name for name, action in items if action == "drop"]
        decision[i] = DROP if drops else TRUNCATE
        reason[i] = drops[0] if drops else items[0][0]
    for role, caps in truncate_to.items():
        caps[decision == DROP] = -1
    crop[decision == DROP] = np.nan
    turns &= decision == TRUNCATE
    return Decisions(decision, reason, [[name for name, _ in items] for items in failed], truncate_to,
                     crop if np.isfinite(crop).any() else None, turns if turns.any() else None)


def chat_conditions(base: dict, fail, keep_empty: bool) -> None:
    """The decision table's conversation rows: content parts the template did not render, and
    conversations with no trained token (no loss to compute; TRL drops or refuses them)."""
    if "parts_not_rendered" in base:
        fail(base["parts_not_rendered"] > 0, "content_parts_not_rendered", "drop")
    if not keep_empty:
        fail(base["completion_tokens"] == 0, "no_trained_tokens", "drop")


def int_cap(threshold: float, op: str) -> int:
    """The largest integer count that satisfies ``count OP threshold`` for an upper limit."""
    if op == "<=":
        return math.floor(threshold)
    return math.ceil(threshold) - 1
