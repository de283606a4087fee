"""Preference pairs (DPO): the prompt, chosen and rejected token ids as TRL's ``DPOTrainer``
prepares them, and what its ``max_length`` truncation leaves of each pair (``counter.py``)."""

from __future__ import annotations

from lengthscan.measure.records import FieldSpec

#: Per-row measurements of a preference field (lengths.parquet columns, rule metrics), primary first:
#: the longer side (prompt + the longer completion), the padded concatenated forward (2 x that), the parts
PAIR_METRICS = ("sequence_tokens", "pair_tokens", "prompt_tokens", "chosen_tokens", "rejected_tokens")
#: Per-row side columns: the chosen and rejected completions' common first tokens; with --max-length, the
#: completion tokens each side keeps after the collator's cut, whether the pair collapses (both sequences
#: the same after it), whether DPOTrainer drops the row (its prompt alone fills max_length, keep_start)
#: and whether the prompt loses tokens (keep_end); whether the prompt was implicit (TRL's extract_prompt)
PAIR_NOTES = {"shared_tokens": "int64", "chosen_kept": "int64", "rejected_kept": "int64", "pair_collapsed": "bool",
              "trainer_drops": "bool", "prompt_cut": "bool", "implicit_prompt": "bool"}
TRUNCATION_MODES = ("keep_start", "keep_end")


def pair_specs(column: str) -> tuple[FieldSpec, ...]:
    return tuple(FieldSpec("pair", column, "tokens", metric=m) for m in PAIR_METRICS)
