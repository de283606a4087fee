"""Video statistics of conversations with videos: how many tokens and frames the videos take, and
the rows whose videos cost most. Counts and bounded top lists, so they merge exactly across
batches, processes and machines."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

#: Rows kept in each top list (the costliest videos; the longest rows with videos).
TOP = 10


@dataclass
class VideoTally:
    """Per split: video counts, the video tokens' share of the sequence, top lists."""

    rows_with_videos: int = 0
    videos: int = 0
    video_tokens: int = 0
    video_frames: int = 0          # frames the processor keeps
    video_ms: int = 0              # the videos' length
    sequence_tokens: int = 0       # over measured rows (with or without videos)
    #: (tokens, row, kept frames, the row's video milliseconds) of each row's costliest video: the TOP costliest
    costliest: list = field(default_factory=list)
    #: (sequence_tokens, row, video_tokens, videos, their metadata): the TOP longest rows with videos
    longest: list = field(default_factory=list)

    def add(self, values: dict, notes: dict, rows: np.ndarray, media: dict | None = None) -> None:
        """One batch; ``media``: row position -> its videos' ``[frames, fps, width, height, rotation]``."""
        seq, tokens, count = values["sequence_tokens"], values["video_tokens"], values["videos"]
        measured = seq >= 0
        self.sequence_tokens += int(seq[measured].sum())
        has = measured & (count > 0)
        idx = np.flatnonzero(has)
        if idx.size == 0:
            return
        self.rows_with_videos += int(idx.size)
        self.videos += int(count[idx].sum())
        self.video_tokens += int(tokens[idx].sum())
        self.video_frames += int(values["video_frames"][idx].sum())
        ms = np.round(np.asarray(values["video_seconds"], float) * 1000).astype(np.int64)
        self.video_ms += int(ms[idx].sum())
        top, frames = notes["max_video_tokens"], notes["max_video_frames"]
        for k in idx[np.argsort(-top[idx], kind="stable")[:TOP]]:
            self.costliest.append((int(top[k]), int(rows[k]), int(frames[k]), int(ms[k])))
        for k in idx[np.argsort(-seq[idx], kind="stable")[:TOP]]:
            self.longest.append((int(seq[k]), int(rows[k]), int(tokens[k]), int(count[k]),
                                 tuple((media or {}).get(int(k), ()))))
        self._trim()

    def _trim(self) -> None:
        self.costliest = heapq.nlargest(TOP, self.costliest, key=lambda t: (t[0], -t[1]))
        self.longest = heapq.nlargest(TOP, self.longest, key=lambda t: (t[0], -t[1]))

    def merge(self, other: VideoTally) -> VideoTally:
        for name in ("rows_with_videos", "videos", "video_tokens", "video_frames", "video_ms", "sequence_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.costliest += other.costliest
        self.longest += other.longest
        self._trim()
        return self

    def to_dict(self) -> dict:
        share = self.video_tokens / self.sequence_tokens if self.sequence_tokens else None
        return {"rows_with_videos": self.rows_with_videos, "videos": self.videos, "video_tokens": self.video_tokens,
                "video_frames": self.video_frames, "video_seconds": self.video_ms / 1000,
                "sequence_tokens": self.sequence_tokens, "video_share": share,
                "costliest": [{"row": r, "video_tokens": t, "frames": f, "row_video_seconds": ms / 1000}
                              for t, r, f, ms in self.costliest],
                "longest": [{"row": r, "sequence_tokens": s, "video_tokens": t, "videos": n, "metadata": list(m)}
                            for s, r, t, n, m in self.longest]}
