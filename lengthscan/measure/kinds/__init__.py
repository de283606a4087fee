"""The field kinds: one measurer per kind (``base.Kind``), registered here.

A new kind is one module beside these and one entry in ``KINDS``."""

from __future__ import annotations

from lengthscan.measure.kinds.audio import AudioKind
from lengthscan.measure.kinds.base import Kind, MeasureContext
from lengthscan.measure.kinds.chat import ChatKind
from lengthscan.measure.kinds.preference import PreferenceKind, RLPromptKind
from lengthscan.measure.kinds.text import TextKind

TEXT, AUDIO, CHAT, PREFERENCE, RL_PROMPT = TextKind(), AudioKind(), ChatKind(), PreferenceKind(), RLPromptKind()
#: every kind, by the name report.json gives it
KINDS: dict[str, Kind] = {k.name: k for k in (TEXT, AUDIO, CHAT, PREFERENCE, RL_PROMPT)}

__all__ = ["Kind", "MeasureContext", "KINDS", "TEXT", "AUDIO", "CHAT", "PREFERENCE", "RL_PROMPT"]

