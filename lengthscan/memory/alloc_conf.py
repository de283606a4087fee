"""``PYTORCH_CUDA_ALLOC_CONF`` and the device's limits, as the caching allocator model reads them
(``allocator.py``; torch's ``c10/core/AllocatorConfig.cpp`` parses the same keys)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MiB = 1 << 20
#: AcceleratorAllocatorConfig::large_segment_size() (the old kLargeBuffer), default 20 MiB
LARGE_SEGMENT = 20 * MiB


@dataclass(frozen=True)
class AllocatorConfig:
    """``PYTORCH_CUDA_ALLOC_CONF`` and the limits of the device (bytes).

    ``capacity``: what ``cudaMalloc`` can take (the device's memory less the CUDA context); None:
    unbounded. ``memory_fraction``: ``set_per_process_memory_fraction`` (of ``total``)."""

    max_split_size: int | None = None
    max_non_split_rounding: int = LARGE_SEGMENT
    roundup_power2_divisions: tuple = ()  # 16 entries (intervals [2^(20+i), 2^(21+i))), or () for none
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    memory_fraction: float = 1.0
    total: int | None = None
    capacity: int | None = None

    @property
    def allowed(self) -> int | None:
        """``allowed_memory_maximum``: the fraction of the device the process may reserve (None: no limit)."""
        if self.memory_fraction >= 1.0 or self.total is None:
            return None
        return int(self.memory_fraction * self.total)

    @classmethod
    def parse(cls, text: str, **limits) -> AllocatorConfig:
        """``PYTORCH_CUDA_ALLOC_CONF`` (``expandable_segments:True,max_split_size_mb:128,...``)."""
        values: dict = {}
        for item in filter(None, (p.strip() for p in re.split(r",(?![^\[]*\])", text or ""))):
            key, sep, value = item.partition(":")
            key, value = key.strip(), value.strip()
            if not sep:
                raise ValueError(f"{item!r}: write KEY:VALUE (e.g. expandable_segments:True)")
            if key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError("expandable_segments: True or False")
                values["expandable_segments"] = value == "True"
            elif key == "max_split_size_mb":
                mb = _number(key, value)
                if mb != int(mb) or mb <= 20:
                    raise ValueError("max_split_size_mb: a whole number of MB, more than 20 (torch refuses smaller)")
                values["max_split_size"] = int(mb * MiB)
            elif key == "max_non_split_rounding_mb":
                mb = _number(key, value)
                if mb != int(mb) or mb < 20:
                    raise ValueError("max_non_split_rounding_mb: a whole number of MB, at least 20")
                values["max_non_split_rounding"] = int(mb * MiB)
            elif key == "garbage_collection_threshold":
                threshold = _number(key, value)
                if not 0 < threshold < 1:
                    raise ValueError("garbage_collection_threshold: between 0 and 1")
                values["garbage_collection_threshold"] = threshold
            elif key == "roundup_power2_divisions":
                values["roundup_power2_divisions"] = _divisions(value)
            else:
                raise ValueError(f"{key}: not an allocator option lengthscan models (expandable_segments, "
                                 "max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold, "
                                 "roundup_power2_divisions)")
        return cls(**values, **limits)


def _number(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key}: {value!r} is not a number") from None


def _divisions(value: str) -> tuple:
    """``N`` or ``[B1:v1,B2:v2,>:vN]`` (boundaries in MB, powers of 2) -> 16 divisions."""
    def checked(v: str) -> int:
        d = int(v)
        if d and d & (d - 1):
            raise ValueError("roundup_power2_divisions: each value 0 or a power of 2")
        return d

    if not value.startswith("["):
        return (checked(value),) * 16
    out, last = [0] * 16, -1
    for pair in value.strip("[]").split(","):
        bound, _, v = pair.partition(":")
        if bound.strip() == ">":
            out[last + 1:] = [checked(v)] * (15 - last)
            break
        mb = int(bound)
        if mb < 1 or mb & (mb - 1):
            raise ValueError("roundup_power2_divisions: each boundary a power of 2 (MB)")
        index = min(int(math.log2(mb)), 15)
        if last < 0:
            out[:index] = [checked(v)] * index
        out[index], last = checked(v), index
    return tuple(out)
