"""The records of the measure step: fields, per-batch measurements, row flags, the tokenizer entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROLES = ("input", "target")


#: Per-row flag codes, as stored in ``lengths.parquet`` (``{role}_flag``). A row is measured
#: (has a length) when its flag is OK or EMPTY; every other flag means no length, with a reason.
(FLAG_OK, FLAG_MISSING, FLAG_EMPTY, FLAG_TOO_LONG, FLAG_MISSING_FILE, FLAG_UNREADABLE, FLAG_TRUNCATED,
 FLAG_WITHIN_BOUND, FLAG_OVER_BOUND, FLAG_OVER_PIECES, FLAG_INVALID_CONVERSATION, FLAG_TEMPLATE_ERROR,
 FLAG_UNSUPPORTED_CONTENT) = range(13)


FLAG_NAMES = {FLAG_OK: None, FLAG_MISSING: "missing", FLAG_EMPTY: "empty", FLAG_TOO_LONG: "too_long",
              FLAG_MISSING_FILE: "missing_file", FLAG_UNREADABLE: "unreadable", FLAG_TRUNCATED: "truncated",
              FLAG_WITHIN_BOUND: "within_by_bound", FLAG_OVER_BOUND: "over_by_prefix",
              FLAG_OVER_PIECES: "over_by_pieces", FLAG_INVALID_CONVERSATION: "invalid_conversation",
              FLAG_TEMPLATE_ERROR: "template_error", FLAG_UNSUPPORTED_CONTENT: "unsupported_content"}


#: Flags of rows decided without a full count (decide-only mode): a bound, no exact length.
BOUNDED_FLAGS = (FLAG_WITHIN_BOUND, FLAG_OVER_BOUND, FLAG_OVER_PIECES)


#: Flags of rows that have a length (a truncated audio file is measured by the frames it holds).
MEASURED_FLAGS = (FLAG_OK, FLAG_EMPTY, FLAG_TRUNCATED)


FLAG_CODES = {name: code for code, name in FLAG_NAMES.items() if name}


#: Units of text and of audio measurements; seconds are kept in statistics as integer milliseconds.
TEXT_UNITS = ("tokens",)


AUDIO_UNITS = ("seconds", "samples", "frames")


UNIT_SCALE = {"seconds": 1000}


@dataclass(frozen=True)
class FieldSpec:
    """One measurement of a column: its role (input or target), source column and unit."""

    role: str
    column: str
    unit: str = "tokens"
    metric: str | None = None  # the measurement's name when it is not ``{role}_{unit}`` (chat metrics)

    @property
    def name(self) -> str:
        return self.metric or f"{self.role}_{self.unit}"

    @property
    def kind(self) -> str:
        return "audio" if self.unit in AUDIO_UNITS else "text"

    @property
    def scale(self) -> int:
        """Statistics hold ``round(value * scale)`` as integers (milliseconds for seconds)."""
        return UNIT_SCALE.get(self.unit, 1)


@dataclass(frozen=True, eq=False)
class Measured:
    """One batch of one role's measurements: a value array per measurement, one flag per row.

    Values are int64 with -1, or float64 (seconds) with NaN, where a row has no length; ``errors``
    holds a message per row (None when fine), or is None when no row has one; ``decoded`` marks
    audio measured by decoding (None when none was).
    """

    values: dict
    flags: np.ndarray
    errors: list | None = None
    decoded: np.ndarray | None = None
    bounds: dict | None = None  # FieldSpec -> (at_least, at_most) arrays (-1: none), decide-only mode
    ids: list | None = None     # token ids per row (None where no length), kept for ``clean --tokenize``
    notes: dict | None = None   # per-row side columns of a chat field (name -> array), see ``RoleField.notes``
    labels: list | None = None  # chat: the labels per row (-100 outside the trained tokens), with ``ids``
    media: dict | None = None   # chat with videos: row -> its videos' [frames, fps, width, height, rotation]

    @property
    def rows(self) -> int:
        return int(self.flags.size)


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer as measured: its name, class, a hash of its files, and the count method per role."""

    name: str
    cls: str
    is_fast: bool
    hash: str
    methods: dict[str, str]
    model_max_length: int | None
    counting: dict = field(default_factory=dict)  # role -> engine, reason (and the count-only engine's tallies)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "class": self.cls,
            "is_fast": self.is_fast,
            "hash": self.hash,
            "methods": dict(self.methods),
            "model_max_length": self.model_max_length,
            "counting": {role: dict(c) for role, c in self.counting.items()},
        }
