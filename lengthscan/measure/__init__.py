"""Measure stage: one record batch in, per-role lengths out (``text/`` tokens, ``audio/``
durations), and the length cache."""
