"""Conversation statistics that are not a length distribution: trained-token shares, rows with no
trained token or no final end-of-turn token, templates that rewrite history, content tokens per
message role. Counts only, so they merge exactly across batches, processes and machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthscan.measure.chat.metrics import CONTENT_ROLES as ROLE_TOTALS
from lengthscan.stats.audios import AudioTally
from lengthscan.stats.histograms import Histogram, merge_histograms
from lengthscan.stats.images import ImageTally
from lengthscan.stats.videos import VideoTally


@dataclass
class ChatTally:
    """Counts over the measured conversations of one split."""

    measured: int = 0                 # rows with a sequence length
    counted: int = 0                  # rows with a completion count
    sequence_tokens: int = 0          # over counted rows
    completion_tokens: int = 0        # over counted rows
    no_trained_tokens: int = 0
    without_final_eot: int = 0        # counted rows with trained tokens but no end-of-turn token after them
    rewrites_history: int = 0
    parts_not_rendered: int = 0
    from_sharegpt: int = 0
    by_role: dict = field(default_factory=lambda: {r: 0 for r in ROLE_TOTALS})
    #: where the first trained token is (rows with one): a cut at L leaves no trained token in the
    #: rows whose first trained token is at L or later
    trained_from: Histogram = field(default_factory=Histogram)
    images: ImageTally | None = None  # conversations with images
    videos: VideoTally | None = None  # conversations with videos
    audios: AudioTally | None = None  # conversations with audio
    reasoning: dict | None = None     # --reasoning: trained reasoning tokens (counted rows), spans dropped, rows

    def add(self, values: dict, notes: dict, rows=None, media: dict | None = None) -> None:
        """One batch: ``values`` metric -> per-row values (-1: none), ``notes`` the side columns,
        ``rows`` the rows' positions in the split."""
        if "image_tokens" in values and notes is not None:
            if self.images is None:
                self.images = ImageTally()
            self.images.add(values, notes, rows if rows is not None else np.arange(len(values["image_tokens"])))
        if "video_tokens" in values and notes is not None:
            if self.videos is None:
                self.videos = VideoTally()
            self.videos.add(values, notes, rows if rows is not None else np.arange(len(values["video_tokens"])),
                            media)
        if "audio_tokens" in values and notes is not None:
            if self.audios is None:
                self.audios = AudioTally()
            self.audios.add(values, notes, rows if rows is not None else np.arange(len(values["audio_tokens"])))
        seq, comp = values["sequence_tokens"], values["completion_tokens"]
        measured, counted = seq >= 0, comp >= 0
        if "reasoning_tokens" in values and notes is not None:
            self._add_reasoning(values["reasoning_tokens"], notes, counted)
        self.measured += int(measured.sum())
        self.counted += int(counted.sum())
        self.sequence_tokens += int(seq[counted].sum())
        self.completion_tokens += int(comp[counted].sum())
        self.no_trained_tokens += int((comp == 0).sum())
        if notes is None:
            return
        self.without_final_eot += int((counted & (comp > 0) & ~notes["ends_with_eot"]).sum())
        self.rewrites_history += int(notes["rewrites_history"].sum())
        self.parts_not_rendered += int(notes["parts_not_rendered"].sum())
        self.from_sharegpt += int(notes["from_sharegpt"].sum())
        start = notes["trained_from"]
        self.trained_from = merge_histograms([self.trained_from, Histogram.of(start[start >= 0])])
        for role in ROLE_TOTALS:
            column = notes.get(f"{role}_tokens")
            if column is not None:
                self.by_role[role] += int(np.maximum(column, 0).sum())

    def _add_reasoning(self, tokens, notes: dict, counted) -> None:
        dropped = np.maximum(notes["reasoning_dropped"], 0)
        mine = self.reasoning or {"reasoning_tokens": 0, "rows_with_reasoning": 0, "spans_dropped": 0,
                                  "rows_dropping": 0}
        add = {"reasoning_tokens": int(np.maximum(tokens, 0)[counted].sum()),
               "rows_with_reasoning": int(((tokens > 0) & counted).sum()),
               "spans_dropped": int(dropped.sum()), "rows_dropping": int((dropped > 0).sum())}
        self.reasoning = {k: mine[k] + add[k] for k in mine}

    def merge(self, other: "ChatTally") -> "ChatTally":
        for name in ("measured", "counted", "sequence_tokens", "completion_tokens", "no_trained_tokens",
                     "without_final_eot", "rewrites_history", "parts_not_rendered", "from_sharegpt"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for role, n in other.by_role.items():
            self.by_role[role] = self.by_role.get(role, 0) + n
        self.trained_from = merge_histograms([self.trained_from, other.trained_from])
        if other.images is not None:
            self.images = other.images if self.images is None else self.images.merge(other.images)
        if other.videos is not None:
            self.videos = other.videos if self.videos is None else self.videos.merge(other.videos)
        if other.audios is not None:
            self.audios = other.audios if self.audios is None else self.audios.merge(other.audios)
        if other.reasoning is not None:
            mine = self.reasoning or dict.fromkeys(other.reasoning, 0)
            self.reasoning = {k: mine[k] + other.reasoning[k] for k in other.reasoning}
        return self

    def to_dict(self) -> dict:
        share = self.completion_tokens / self.sequence_tokens if self.sequence_tokens else None
        return {"measured": self.measured, "counted": self.counted, "sequence_tokens": self.sequence_tokens,
                "completion_tokens": self.completion_tokens, "trained_share": share,
                "no_trained_tokens": self.no_trained_tokens, "without_final_eot": self.without_final_eot,
                "rewrites_history": self.rewrites_history, "parts_not_rendered": self.parts_not_rendered,
                "from_sharegpt": self.from_sharegpt,
                "content_tokens_by_role": dict(self.by_role), "trained_from": self.trained_from.to_dict(),
                **({"images": self.images.to_dict()} if self.images is not None else {}),
                **({"videos": self.videos.to_dict()} if self.videos is not None else {}),
                **({"audios": self.audios.to_dict()} if self.audios is not None else {}),
                **({"reasoning": dict(self.reasoning)} if self.reasoning is not None else {})}
