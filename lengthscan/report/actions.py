"""What a limit rule did to a row, named as it was done: ``truncate``, ``drop-turns`` or ``crop``.

The decision table has three decisions (``keep``, ``truncate``, ``drop``): a row that is changed
but kept is ``truncate`` whatever changed it. The report names the action performed, read from the
rule that decided the row (its ``reason`` is the rule's text; ``decisions.rules`` holds each rule's
action): "97 turns dropped", "12 cropped", not "97 truncated".
"""

from __future__ import annotations

#: The actions that change a kept row, in the order the report lists them.
CHANGING = ("truncate", "drop-turns", "crop")
#: What the rows an action changed are called: "12 cropped".
DONE = {"truncate": "truncated", "drop-turns": "turns dropped", "crop": "cropped"}
#: The verb of what the rules would do ("would truncate 12") and did ("truncated 12").
WOULD = {"truncate": "truncate", "drop-turns": "drop turns of", "crop": "crop"}
DID = {"truncate": "truncated", "drop-turns": "dropped turns of", "crop": "cropped"}


def rule_actions(decisions: dict | None) -> dict:
    """rule text -> the action it takes on a failing row."""
    return {r["rule"]: r["action"] for r in (decisions or {}).get("rules") or []}


def row_action(decision: str | None, reason: str | None, actions: dict) -> str | None:
    """The action performed on a row: its decision, with ``truncate`` named by the deciding rule."""
    if decision != "truncate":
        return decision
    found = actions.get(reason)
    return found if found in CHANGING else "truncate"


def changed_rows(split: dict, actions: dict) -> dict:
    """action -> rows it changed in a split of ``decisions.splits`` (from ``by_reason``), in
    ``CHANGING`` order; rows no reason accounts for count as truncated."""
    out: dict = {}
    for item in split.get("by_reason") or []:
        if item["decision"] == "truncate":
            action = row_action("truncate", item["reason"], actions)
            out[action] = out.get(action, 0) + item["rows"]
    rest = split.get("truncated", 0) - sum(out.values())
    if rest > 0:
        out["truncate"] = out.get("truncate", 0) + rest
    return {a: out[a] for a in CHANGING if out.get(a)}


def changed_label(decisions: dict | None, words: dict = DONE) -> str:
    """The rows the rules change, named by the actions of its rules: ``truncated``, ``cropped``,
    ``turns dropped``, or several joined (``truncated or cropped``)."""
    present = [a for a in CHANGING if a in set(rule_actions(decisions).values())] or ["truncate"]
    return " or ".join(words[a] for a in present)
