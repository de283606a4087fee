"""The caching allocator model's records: segments, blocks (a segment's pieces, linked by address),
the pools of cached blocks (best fit first) and the statistics ``torch.cuda.memory_stats()`` keeps."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


class Segment:
    """A ``cudaMalloc``'d segment, or an expandable segment's virtual range (pages from ``start``)."""

    __slots__ = ("expandable", "start")

    def __init__(self, start: int, expandable: bool = False):
        self.start, self.expandable = start, expandable


class Block:
    __slots__ = ("addr", "allocated", "base", "mapped", "next", "pool", "prev", "segment", "size")

    def __init__(self, addr: int, size: int, pool: Pool, segment: Segment, mapped: bool = True):
        self.addr, self.size, self.pool, self.segment, self.mapped = addr, size, pool, segment, mapped
        self.allocated, self.prev, self.next, self.base = False, None, None, 0

    def key(self) -> tuple:
        return self.size, self.addr


@dataclass
class Pool:
    small: bool
    free: list = field(default_factory=list)  # (size, addr, block), sorted: best fit first
    unmapped: list = field(default_factory=list)  # (addr, block) of expandable segments' unmapped ranges
    calls: int = 0  # get_free_block calls (the garbage collector's clock)

    def insert(self, b: Block) -> None:
        bisect.insort(self.free, (b.size, b.addr, b))
        b.base = self.calls

    def remove(self, b: Block) -> None:
        i = bisect.bisect_left(self.free, (b.size, b.addr))
        assert self.free[i][2] is b
        del self.free[i]


@dataclass
class Stats:
    """``torch.cuda.memory_stats()``'s aggregate figures the model keeps."""

    allocated: int = 0
    allocated_peak: int = 0
    reserved: int = 0
    reserved_peak: int = 0
    segments: int = 0
    alloc_retries: int = 0
    ooms: int = 0
    fragmentation_at_peak: int = 0  # reserved - allocated when reserved last reached its peak
