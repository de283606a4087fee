"""A model of PyTorch's CUDA caching allocator: what ``max_memory_reserved`` becomes, not only
``max_memory_allocated`` (the out-of-memory error is raised against what the allocator reserves).

It follows ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.13's rules; the line numbers cited in
``tests/memory/test_allocator.py`` and docs/memory.md) for one device and one stream:

* a request is rounded to 512 bytes (``round_size``; with ``roundup_power2_divisions`` to the next
  of N divisions of its power-of-2 interval), goes to the small pool (up to 1 MiB) or the large one;
* the free block of the pool that fits best is used (``get_free_block``: smallest size, then lowest
  address); with ``max_split_size_mb`` a request below it never takes a block at or above it, and a
  request at or above it takes one only if it wastes less than ``max_non_split_rounding`` (20 MiB);
* none fits: a new segment is reserved (``get_allocation_size``: 2 MiB for the small pool, 20 MiB for
  requests under 10 MiB, else the request rounded up to 2 MiB), unless it passes the per-process
  memory fraction (``set_per_process_memory_fraction``) or the device's capacity; then the cached
  whole segments are released (oversize ones first with ``max_split_size_mb``, then all) and it is
  tried again; failing that, out of memory;
* the block is split (the request takes its front) when the rest is at least 512 bytes (small pool,
  expandable segments) or more than 1 MiB (large pool, below ``max_split_size``); otherwise the whole
  block is handed out (and counted as allocated);
* a freed block merges with its free neighbours in its segment and stays cached: reserved memory only
  falls when segments are released (``empty_cache``, the retry above, ``garbage_collection_threshold``);
* ``expandable_segments``: one growing segment per pool, mapped in pages (2 MiB small, 20 MiB large) as
  demand grows, so free neighbours always merge and a new request extends the free tail.

Streams, ``record_stream``, CUDA graphs' private pools and IPC are not modelled (a training loop on
one stream does not use them).
"""

from __future__ import annotations

import bisect
import itertools

from lengthscan.memory.alloc_blocks import Block, Pool, Segment, Stats
from lengthscan.memory.alloc_conf import LARGE_SEGMENT, AllocatorConfig, MiB

#: c10/core/AllocatorConfig.h: kMinBlockSize, kSmallSize, kSmallBuffer, kMinLargeAlloc, kRoundLarge
MIN_BLOCK, SMALL_SIZE, SMALL_BUFFER, MIN_LARGE_ALLOC, ROUND_LARGE = 512, MiB, 2 * MiB, 10 * MiB, 2 * MiB


class AllocatorOOM(Exception):
    """``torch.OutOfMemoryError``: the segment ``alloc_size`` could not be reserved."""

    def __init__(self, size: int, alloc_size: int, reserved: int, allocated: int, limit: int | None):
        self.size, self.alloc_size, self.limit = size, alloc_size, limit
        self.reserved, self.allocated = reserved, allocated
        super().__init__(f"CUDA out of memory: tried to allocate {alloc_size / MiB:.2f} MiB with {reserved / MiB:.2f} "
                         f"MiB reserved ({allocated / MiB:.2f} MiB allocated)")


class CachingAllocator:
    """One device's caching allocator, one stream (see the module's text)."""

    def __init__(self, config: AllocatorConfig = AllocatorConfig()):
        self.config = config
        self.small, self.large = Pool(True), Pool(False)
        self.stats = Stats()
        self._addresses = itertools.count(1)
        self._expandable: dict[bool, Segment] = {}

    # -- sizes -------------------------------------------------------------------------------------

    def round_size(self, size: int) -> int:
        """``round_size`` (CUDACachingAllocator.cpp 2585-2597)."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        d = self._divisions(size)
        if d > 1 and size > MIN_BLOCK * d:
            return _next_division(size, d)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    def _divisions(self, size: int) -> int:
        table = self.config.roundup_power2_divisions
        if not table:
            return 0
        return table[min(max(0, size.bit_length() - 1 - 20), 15)]

    @staticmethod
    def allocation_size(size: int) -> int:
        """``get_allocation_size`` (3115-3123): the segment reserved for a request of ``size``."""
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_SEGMENT
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    # -- malloc and free ---------------------------------------------------------------------------

    def malloc(self, request: int) -> Block:
        """A block for ``request`` bytes (``AllocatorOOM`` when none can be had)."""
        size = self.round_size(request)
        pool = self.small if size <= SMALL_SIZE else self.large
        alloc_size = self.allocation_size(size)
        block = self._free_block(pool, size)
        if block is None and self.config.allowed is not None and self.config.garbage_collection_threshold > 0:
            self._collect()
        if block is None:
            block = (self._new_block(pool, size, alloc_size)
                     or (self._release_oversize(pool, size) and self._new_block(pool, size, alloc_size))
                     or (self.release_cached() and self._new_block(pool, size, alloc_size, retry=True)))
        if not block:
            self.stats.ooms += 1
            raise AllocatorOOM(request, alloc_size, self.stats.reserved, self.stats.allocated, self.config.allowed)
        if self._should_split(block, size):
            rest = Block(block.addr + size, block.size - size, pool, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.insert(rest)
        block.allocated = True
        s = self.stats
        s.allocated += block.size
        s.allocated_peak = max(s.allocated_peak, s.allocated)
        if s.reserved == s.reserved_peak:
            s.fragmentation_at_peak = s.reserved - s.allocated
        return block

    def free(self, block: Block) -> None:
        """Give ``block`` back: merged with its free neighbours, cached in its pool (``free_block``)."""
        assert block.allocated
        block.allocated = False
        self.stats.allocated -= block.size
        pool = block.pool
        for side in (block.prev, block.next):
            if side is not None and not side.allocated and side.mapped == block.mapped and side.mapped:
                pool.remove(side)
                self._merge(block, side)
        pool.insert(block)

    @staticmethod
    def _merge(dst: Block, src: Block) -> None:
        if src is dst.prev:
            dst.addr, dst.prev = src.addr, src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split`` (3095-3113)."""
        remaining = block.size - size
        if block.pool.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK
        limit = self.config.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    def _free_block(self, pool: Pool, size: int) -> Block | None:
        """``get_free_block`` (3125-3183): best fit, the expandable tail's preference, the oversize rules."""
        if self.config.allowed is not None and self.config.garbage_collection_threshold > 0:
            pool.calls += 1
        i = bisect.bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        if self.config.expandable_segments:
            def grows(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while i + 1 < len(pool.free) and pool.free[i][2].segment.expandable \
                    and grows(pool.free[i + 1][2]) < grows(pool.free[i][2]):
                i += 1
        block = pool.free[i][2]
        limit = self.config.max_split_size
        if limit is not None:
            if size < limit <= block.size:
                return None
            if size >= limit and block.size >= size + self.config.max_non_split_rounding:
                return None
        del pool.free[i]
        return block

    def _new_block(self, pool: Pool, size: int, alloc_size: int, retry: bool = False) -> Block | None:
        """``alloc_block`` (3258-3366): a new segment (or expandable pages), within the limits."""
        if retry:
            self.stats.alloc_retries += 1
        allowed = self.config.allowed
        if allowed is not None and self.stats.reserved + alloc_size > allowed:
            return None
        if self.config.expandable_segments:
            return self._expand(pool, size)
        if self.config.capacity is not None and self.stats.reserved + alloc_size > self.config.capacity:
            return None
        start = next(self._addresses) * (1 << 48)
        block = Block(start, alloc_size, pool, Segment(start))
        self._reserve(alloc_size)
        self.stats.segments += 1
        return block

    def _reserve(self, nbytes: int) -> None:
        s = self.stats
        s.reserved += nbytes
        s.reserved_peak = max(s.reserved_peak, s.reserved)

    # -- expandable segments -----------------------------------------------------------------------

    def _expand(self, pool: Pool, size: int) -> Block | None:
        """``try_allocate_expandable_block`` (2915-2946): free and unmapped space at least ``size``."""
        page = SMALL_BUFFER if pool.small else LARGE_SEGMENT
        if pool.small not in self._expandable:
            start = next(self._addresses) * (1 << 48)
            segment = self._expandable[pool.small] = Segment(start, expandable=True)
            tail = Block(start, 1 << 47, pool, segment, mapped=False)  # the virtual range: never the limit
            pool.unmapped.append((tail.addr, tail))
        candidate = self._expandable_candidate(pool, size)
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size), page):
            return None
        while candidate.size < size:
            nxt = candidate.next
            if not self._map(nxt, min(size - candidate.size, nxt.size), page):
                return None
            candidate = nxt
        pool.remove(candidate)
        return candidate

    def _expandable_candidate(self, pool: Pool, size: int) -> Block:
        """``find_expandable_block`` (2799-2844): the lowest unmapped range, with the free block before it."""
        def free(b):
            return b is not None and not b.allocated

        for _, c in sorted(pool.unmapped, key=lambda e: e[0]):
            if free(c.prev) and c.prev.mapped:
                c = c.prev
            b, got = c, 0
            while got < size and free(b):
                got, b = got + b.size, b.next
            if got >= size:
                return c
        raise AssertionError("an expandable segment's virtual range is never exhausted")

    def _map(self, block: Block, size: int, page: int) -> bool:
        """``map_block`` (2846-2913): whole pages from ``block``'s start, merged with free neighbours."""
        mapped = min(-(-size // page) * page, block.size)
        if self.config.capacity is not None and self.stats.reserved + mapped > self.config.capacity:
            return False
        pool = block.pool
        pool.unmapped.remove((block.addr, block))
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, pool, block.segment, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            pool.unmapped.append((rest.addr, rest))
        block.mapped = True
        for side in (block.prev, block.next):
            if side is not None and not side.allocated and side.mapped:
                pool.remove(side)
                self._merge(block, side)
        pool.insert(block)
        self._reserve(mapped)
        return True

    # -- releasing ---------------------------------------------------------------------------------

    def release_cached(self) -> bool:
        """``release_cached_blocks`` (``empty_cache``; the last retry): every free whole segment
        released, expandable segments' free whole pages unmapped. Always true (it never fails)."""
        for pool in (self.large, self.small):
            for _, _, b in list(pool.free):
                if b.segment.expandable:
                    self._unmap(b)
                elif b.prev is None and b.next is None:
                    self._release(b)
        return True

    def _release(self, b: Block) -> None:
        b.pool.remove(b)
        self.stats.reserved -= b.size
        self.stats.segments -= 1

    def _unmap(self, b: Block) -> None:
        """``unmap_block`` (3536-3606): the whole pages inside a free block go back; partial ones stay."""
        page = SMALL_BUFFER if b.pool.small else LARGE_SEGMENT
        origin = b.segment.start
        lo = origin + -(-(b.addr - origin) // page) * page
        hi = origin + ((b.addr + b.size - origin) // page) * page
        if hi <= lo:
            return
        pool = b.pool
        pool.remove(b)
        pieces = [(b.addr, lo - b.addr, True), (lo, hi - lo, False), (hi, b.addr + b.size - hi, True)]
        prev, nxt = b.prev, b.next
        made = []
        for addr, size, mapped in pieces:
            if size:
                piece = Block(addr, size, pool, b.segment, mapped=mapped)
                made.append(piece)
        for left, right in zip([prev, *made], [*made, nxt]):
            if left is not None:
                left.next = right
            if right is not None:
                right.prev = left
        for piece in made:
            if piece.mapped:
                pool.insert(piece)
            else:
                pool.unmapped.append((piece.addr, piece))
        self.stats.reserved -= hi - lo
        for piece in made:  # neighbouring unmapped ranges become one
            for side in (piece.prev, piece.next):
                if not piece.mapped and side is not None and not side.mapped and not side.allocated \
                        and (side.addr, side) in pool.unmapped and (piece.addr, piece) in pool.unmapped:
                    pool.unmapped.remove((side.addr, side))
                    pool.unmapped.remove((piece.addr, piece))
                    self._merge(piece, side)
                    pool.unmapped.append((piece.addr, piece))

    def _release_oversize(self, pool: Pool, size: int) -> bool:
        """``release_available_cached_blocks`` (3371-3417): with ``max_split_size``, the cached oversize
        segments of the pool (the best fit at least max(size, max_split), else the largest first)."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        whole = [e for e in pool.free if e[2].prev is None and e[2].next is None and not e[2].segment.expandable]
        fit = next((e for e in whole if e[0] >= key), None)
        if fit is not None:
            self._release(fit[2])
            return True
        freed = 0
        for s, _, b in sorted((e for e in whole if e[0] >= limit), key=lambda e: (-e[0], -e[1])):
            if freed >= key:
                break
            self._release(b)
            freed += s
        return freed >= key

    def _collect(self) -> None:
        """``garbage_collect_cached_blocks`` (3194-3251): cached whole large segments, oldest first."""
        threshold = self.config.garbage_collection_threshold * self.config.allowed
        if self.stats.reserved <= threshold:
            return
        target, reclaimed = self.stats.reserved - threshold, 0
        pool = self.large
        while reclaimed < target:
            whole = [b for _, _, b in pool.free if b.prev is None and b.next is None and not b.segment.expandable]
            if not whole:
                return
            ages = [pool.calls - b.base for b in whole]
            average = sum(ages) / len(ages)
            freed = 0
            for b, age in zip(whole, ages):
                if age >= average:
                    self._release(b)
                    freed += b.size
            if not freed:
                return
            reclaimed += freed


def _next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division`` (2565-2583)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return 2 * floor
    low = size & ~(step - 1)
    return size if low == size else low + step
