"""The caching allocator model against hand-built allocation sequences whose outcome follows from
``c10/cuda/CUDACachingAllocator.cpp`` (line numbers of the version read, torch 2.13's rules; see
docs/memory.md). R: ``memory_reserved()``, A: ``memory_allocated()``."""

from __future__ import annotations

import pytest

from lengthscan.memory.alloc_conf import AllocatorConfig
from lengthscan.memory.allocator import AllocatorOOM, CachingAllocator

MiB = 1 << 20


def _ra(a: CachingAllocator) -> tuple[int, int]:
    return a.stats.reserved, a.stats.allocated


def test_a_tiny_request_rounds_to_512_and_reserves_a_small_segment():
    """round_size 2585-2597 (512-byte multiples); get_pool 3080 (<= 1 MiB: small); get_allocation_size 3117
    (2 MiB); should_split 3107 (small pool: a rest of at least 512 bytes is split off)."""
    a = CachingAllocator()
    b1 = a.malloc(1000)
    assert b1.size == 1024 and _ra(a) == (2 * MiB, 1024)
    b2 = a.malloc(1000)  # the rest of the segment, split again
    assert _ra(a) == (2 * MiB, 2048) and a.stats.segments == 1
    a.free(b1)
    b3 = a.malloc(600)  # best fit (3134): the freed 1024 block, smaller than the rest
    assert b3.addr == b1.addr and _ra(a) == (2 * MiB, 2048)
    a.free(b2)
    a.free(b3)  # everything merges back (try_merge_blocks 3027-3058) and stays cached (no release on free)
    assert _ra(a) == (2 * MiB, 0) and len(a.small.free) == 1
    a.release_cached()  # emptyCache: whole free segments released (release_blocks 3621)
    assert _ra(a) == (0, 0) and a.stats.reserved_peak == 2 * MiB


def test_the_one_mib_boundary_between_the_pools():
    """kSmallSize: a rounded 1 MiB is small (3080); 1 MiB + 1 rounds to 1049088, large, a 20 MiB segment
    (3119) split (3111: rest > 1 MiB)."""
    a = CachingAllocator()
    a.malloc(MiB)
    a.malloc(MiB)
    assert _ra(a) == (2 * MiB, 2 * MiB)
    a.malloc(MiB + 1)
    assert _ra(a) == (22 * MiB, 2 * MiB + 1049088)


def test_requests_under_10_mib_share_20_mib_segments():
    """get_allocation_size 3118-3121: under kMinLargeAlloc a 20 MiB segment, at or above it the request
    rounded to 2 MiB; a released segment is only a whole free one (3621)."""
    a = CachingAllocator()
    x = a.malloc(3 * MiB // 2)
    a.malloc(8 * MiB)
    assert _ra(a) == (20 * MiB, 3 * MiB // 2 + 8 * MiB)
    y = a.malloc(12 * MiB)  # the 10.5 MiB rest is too small: a 12 MiB segment, exact
    assert _ra(a) == (32 * MiB, 3 * MiB // 2 + 20 * MiB)
    a.free(x)
    a.free(y)
    a.release_cached()
    assert _ra(a) == (20 * MiB, 8 * MiB)


def test_a_large_block_is_not_split_for_a_rest_of_one_mib():
    """should_split 3109-3111: the large pool splits only for a rest over 1 MiB; otherwise the whole
    block is handed out and counted allocated (alloc_found_block 1729)."""
    a = CachingAllocator()
    a.malloc(21 * MiB)  # a 22 MiB segment (rounded to 2 MiB), 1 MiB left: not split
    assert _ra(a) == (22 * MiB, 22 * MiB)


def test_a_cached_large_block_is_reused_and_split():
    a = CachingAllocator()
    a.free(a.malloc(50 * MiB))
    first = a.malloc(30 * MiB)  # best fit: the cached 50 MiB, split (a 20 MiB rest)
    assert _ra(a) == (50 * MiB, 30 * MiB)
    second = a.malloc(30 * MiB)  # the 20 MiB rest is too small: a new segment
    assert _ra(a) == (80 * MiB, 60 * MiB)
    a.free(first)
    a.free(second)
    assert _ra(a) == (80 * MiB, 0) and sorted(s for s, _, _ in a.large.free) == [30 * MiB, 50 * MiB]


def test_max_split_size_keeps_oversize_blocks_for_large_requests():
    """get_free_block 3171-3179 with max_split_size_mb:100: a request below it never takes an oversize
    block; one above takes it only within max_non_split_rounding (20 MiB); oversize blocks never split
    (3110)."""
    a = CachingAllocator(AllocatorConfig.parse("max_split_size_mb:100"))
    a.free(a.malloc(200 * MiB))
    a.malloc(50 * MiB)
    assert _ra(a) == (250 * MiB, 50 * MiB)
    big = a.malloc(190 * MiB)  # 200 < 190 + 20: the cached 200 MiB, whole
    assert _ra(a) == (250 * MiB, 250 * MiB) and big.size == 200 * MiB
    a.free(big)
    a.malloc(150 * MiB)  # 200 >= 150 + 20: refused, a new 150 MiB segment
    assert _ra(a) == (400 * MiB, 200 * MiB)


def test_the_memory_fraction_releases_the_cache_then_retries():
    """alloc_block 3278-3282: reserved + the segment past allowed_memory_maximum fails without cudaMalloc;
    release_cached_blocks then one retry (1487-1489, num_alloc_retries 3269)."""
    a = CachingAllocator(AllocatorConfig(memory_fraction=0.5, total=200 * MiB))
    a.free(a.malloc(60 * MiB))
    a.malloc(80 * MiB)
    assert _ra(a) == (80 * MiB, 80 * MiB) and a.stats.alloc_retries == 1


def test_out_of_memory_reports_the_segment_and_keeps_the_state():
    """1517, 1587-1612: num_ooms, the message names the segment size; nothing changes."""
    a = CachingAllocator(AllocatorConfig(memory_fraction=0.5, total=200 * MiB))
    a.malloc(60 * MiB)
    with pytest.raises(AllocatorOOM) as oom:
        a.malloc(50 * MiB)
    assert oom.value.alloc_size == 50 * MiB and _ra(a) == (60 * MiB, 60 * MiB)
    assert a.stats.ooms == 1 and a.stats.alloc_retries == 1


def test_the_device_capacity_is_the_limit_without_a_fraction():
    a = CachingAllocator(AllocatorConfig(capacity=100 * MiB))
    a.free(a.malloc(60 * MiB))
    a.malloc(80 * MiB)  # cudaMalloc fails, the cache is released, the retry succeeds
    assert _ra(a) == (80 * MiB, 80 * MiB)
    with pytest.raises(AllocatorOOM):
        a.malloc(30 * MiB)


def test_garbage_collection_releases_the_oldest_cached_segments():
    """garbage_collect_cached_blocks 3194-3251: over threshold x allowed, whole cached large segments
    at least as old as the average (age: get_free_block calls since cached) are released."""
    a = CachingAllocator(AllocatorConfig.parse("garbage_collection_threshold:0.6", memory_fraction=0.5,
                                               total=200 * MiB))
    x, y = a.malloc(30 * MiB), a.malloc(30 * MiB)
    a.free(x)
    a.free(y)
    a.free(a.malloc(40 * MiB))
    assert _ra(a) == (100 * MiB, 0)
    a.malloc(50 * MiB)  # 100 > 60: A and B (age 2 >= 5/3) released, then 40 + 50 <= 100
    assert _ra(a) == (90 * MiB, 50 * MiB)


def test_expandable_segments_grow_one_range_in_pages():
    """expandable_segments: pages of 20 MiB (large pool, 2832-2834), the free tail extended (2818-2830,
    map_block 2846-2913), split at 512 bytes (3107); free pages stay mapped until emptyCache."""
    a = CachingAllocator(AllocatorConfig.parse("expandable_segments:True"))
    x = a.malloc(5 * MiB)
    assert _ra(a) == (20 * MiB, 5 * MiB)
    y = a.malloc(30 * MiB)  # the free 15 MiB and 15 more mapped (a page: 20 MiB): 40 MiB, not 20 + 30
    assert _ra(a) == (40 * MiB, 35 * MiB)
    a.free(x)
    a.free(y)
    assert _ra(a) == (40 * MiB, 0) and len(a.large.free) == 1
    a.release_cached()
    assert _ra(a) == (0, 0)


def test_roundup_power2_divisions():
    """roundup_power2_next_division 2565-2583: with 4 divisions, a size above 2 KiB rounds to the next
    quarter of its power-of-2 interval; a power of 2 stays."""
    a = CachingAllocator(AllocatorConfig.parse("roundup_power2_divisions:4"))
    assert [a.round_size(s) for s in (1200, 5000, 1_100_000, 3_145_729, 4 * MiB)] == \
        [1536, 5120, 1_310_720, 3_670_016, 4 * MiB]
    staged = CachingAllocator(AllocatorConfig.parse("roundup_power2_divisions:[256:1,>:4]"))
    assert staged.round_size(1_100_000) == 1_100_288 and staged.round_size(600 * MiB + 1) == 640 * MiB


def test_fragmentation_grows_as_shapes_vary_and_expandable_segments_avoid_it():
    """The reason for the issue: blocks of growing sizes freed between steps leave cached segments too
    small for the next size; the reserve grows past what is allocated at once. Expandable segments
    extend one range instead."""
    plain, expandable = CachingAllocator(), CachingAllocator(AllocatorConfig.parse("expandable_segments:True"))
    for a in (plain, expandable):
        for step in range(1, 9):
            blocks = [a.malloc(step * 12 * MiB) for _ in range(3)]
            for b in blocks:
                a.free(b)
    assert plain.stats.allocated_peak == expandable.stats.allocated_peak == 3 * 96 * MiB
    assert plain.stats.reserved_peak > 1.5 * plain.stats.allocated_peak
    assert expandable.stats.reserved_peak <= plain.stats.allocated_peak + 20 * MiB


def test_bad_allocator_options_are_refused():
    for text, message in (("expandable_segments:yes", "True or False"), ("max_split_size_mb:10", "more than 20"),
                          ("garbage_collection_threshold:1.5", "between 0 and 1"), ("pinned_use_x:1", "not an"),
                          ("roundup_power2_divisions:3", "power of 2"), ("max_split_size_mb", "KEY:VALUE")):
        with pytest.raises(ValueError, match=message):
            AllocatorConfig.parse(text)
