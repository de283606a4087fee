"""Truncating preference pairs without losing the preference: a pair cut to ``cap`` tokens keeps
each sequence's first ``cap`` tokens (the collator's ``keep_start``), and is dropped instead, with
the reason, where the cut would leave nothing to learn:

* its prompt alone fills ``cap`` (DPOTrainer drops such a row too): ``prompt_fills_limit``;
* chosen and rejected become the same sequence (both cut inside their common start, or equal):
  ``pair_collapsed``.

All of it follows from the measured lengths: a DPO pair's two sequences share their first
``prompt_tokens + shared_tokens`` tokens, so cut to ``cap`` they are equal where both cut lengths
are equal and within that common start. (RewardTrainer filters long pairs and never cuts them:
lengthscan does not truncate its pairs either.)"""

from __future__ import annotations

import numpy as np


def pair_truncation(base: dict, bad: np.ndarray, cap: int, fail) -> np.ndarray:
    """The rows of ``bad`` (over the limit) that can be cut to ``cap``; the others failed with their reason."""
    prompt, chosen, rejected = base["prompt_tokens"], base["chosen_tokens"], base["rejected_tokens"]
    common = prompt + np.maximum(base["shared_tokens"], 0)
    cut_c, cut_r = np.minimum(prompt + chosen, cap), np.minimum(prompt + rejected, cap)
    fills = bad & (prompt >= cap)
    fail(fills, f"prompt_fills_limit (a prompt of {cap:,} tokens or more leaves no completion token)", "drop")
    collapsed = bad & ~fills & (cut_c == cut_r) & (common >= cut_c)
    fail(collapsed, f"pair_collapsed (after truncating to {cap:,} tokens chosen and rejected are the same)", "drop")
    return bad & ~fills & ~collapsed
