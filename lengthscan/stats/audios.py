"""Audio statistics of conversations with audio: how many tokens the clips take, and the clips the
processor cuts off silently (Qwen2-Audio at 30 s, Qwen2.5-Omni at 300 s). Counts only, so they
merge exactly across batches, processes and machines."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AudioTally:
    rows_with_audio: int = 0
    audios: int = 0
    audio_tokens: int = 0
    audio_ms: int = 0
    sequence_tokens: int = 0       # over measured rows (with or without audio)
    rows_truncated: int = 0        # rows with a clip the processor cuts
    lost_ms: int = 0               # what it cuts off, in all

    def add(self, values: dict, notes: dict, rows: np.ndarray) -> None:
        seq, count = values["sequence_tokens"], values["audios"]
        measured = seq >= 0
        self.sequence_tokens += int(seq[measured].sum())
        idx = np.flatnonzero(measured & (count > 0))
        self.rows_with_audio += int(idx.size)
        self.audios += int(count[idx].sum())
        self.audio_tokens += int(values["audio_tokens"][idx].sum())
        self.audio_ms += int(np.round(np.asarray(values["audio_seconds"], float)[idx] * 1000).sum())
        cut = np.asarray(notes["audio_truncated"], bool)[idx]
        self.rows_truncated += int(cut.sum())
        self.lost_ms += int(notes["audio_lost_ms"][idx].sum())

    def merge(self, other: AudioTally) -> AudioTally:
        for name in ("rows_with_audio", "audios", "audio_tokens", "audio_ms", "sequence_tokens", "rows_truncated",
                     "lost_ms"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def to_dict(self) -> dict:
        share = self.audio_tokens / self.sequence_tokens if self.sequence_tokens else None
        return {"rows_with_audio": self.rows_with_audio, "audios": self.audios, "audio_tokens": self.audio_tokens,
                "audio_seconds": self.audio_ms / 1000, "sequence_tokens": self.sequence_tokens, "audio_share": share,
                "rows_truncated": self.rows_truncated, "seconds_lost": self.lost_ms / 1000}
