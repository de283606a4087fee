"""Image statistics of conversations with images: how many tokens the images take, the rows whose
images cost most, and the size of each row's costliest image. Counts and a bounded top list, so they
merge exactly across batches, processes and machines."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from lengthscan.stats.histograms import Histogram, merge_histograms

#: Rows kept in each top list (the costliest images; the longest rows with images).
TOP = 10


@dataclass
class ImageTally:
    """Per split: image counts, the image tokens' share of the sequence, top lists, a size histogram."""

    rows_with_images: int = 0
    images: int = 0
    image_tokens: int = 0
    sequence_tokens: int = 0       # over measured rows (with or without images)
    #: (tokens, row, width, height) of each row's costliest image: the TOP costliest
    costliest: list = field(default_factory=list)
    #: (sequence_tokens, row, image_tokens, images): the TOP longest rows with images
    longest: list = field(default_factory=list)
    #: megapixels (x1000: kilopixels) of each row's costliest image
    kilopixels: Histogram = field(default_factory=Histogram)

    def add(self, values: dict, notes: dict, rows: np.ndarray) -> None:
        seq, tokens, count = values["sequence_tokens"], values["image_tokens"], values["images"]
        measured = seq >= 0
        self.sequence_tokens += int(seq[measured].sum())
        has = measured & (count > 0)
        self.rows_with_images += int(has.sum())
        self.images += int(count[has].sum())
        self.image_tokens += int(tokens[has].sum())
        idx = np.flatnonzero(has)
        if idx.size == 0:
            return
        top, width, height = notes["max_image_tokens"], notes["max_image_width"], notes["max_image_height"]
        self.kilopixels = merge_histograms([self.kilopixels, Histogram.of(width[idx] * height[idx] // 1000)])
        for k in idx[np.argsort(-top[idx], kind="stable")[:TOP]]:
            self.costliest.append((int(top[k]), int(rows[k]), int(width[k]), int(height[k])))
        for k in idx[np.argsort(-seq[idx], kind="stable")[:TOP]]:
            self.longest.append((int(seq[k]), int(rows[k]), int(tokens[k]), int(count[k])))
        self._trim()

    def _trim(self) -> None:
        self.costliest = heapq.nlargest(TOP, self.costliest, key=lambda t: (t[0], -t[1]))
        self.longest = heapq.nlargest(TOP, self.longest, key=lambda t: (t[0], -t[1]))

    def merge(self, other: "ImageTally") -> "ImageTally":
        for name in ("rows_with_images", "images", "image_tokens", "sequence_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.costliest += other.costliest
        self.longest += other.longest
        self.kilopixels = merge_histograms([self.kilopixels, other.kilopixels])
        self._trim()
        return self

    def to_dict(self) -> dict:
        share = self.image_tokens / self.sequence_tokens if self.sequence_tokens else None
        return {"rows_with_images": self.rows_with_images, "images": self.images, "image_tokens": self.image_tokens,
                "sequence_tokens": self.sequence_tokens, "image_share": share,
                "costliest": [{"row": r, "image_tokens": t, "width": w, "height": h}
                              for t, r, w, h in self.costliest],
                "longest": [{"row": r, "sequence_tokens": s, "image_tokens": t, "images": n}
                            for s, r, t, n in self.longest],
                "kilopixels": self.kilopixels.to_dict()}
