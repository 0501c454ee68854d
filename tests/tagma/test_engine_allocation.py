"""The engine's allocator through the binding: in-place growth, placement policies, sharing and the
cache's LRU, evictions, free ranges, histograms and statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tagma.engine import (
    AppendResult,
    EngineStats,
    InvalidArgumentError,
    NoSpaceError,
    Policy,
    Range,
    RangeEngine,
)
from tests.tagma.engine_helpers import EngineFactory, expect_error

# ----------------------------------------------------------------------------------------- behaviour


def test_in_place_growth(eng: RangeEngine) -> None:
    req = eng.create_request()
    first = eng.append(req, 4)
    assert isinstance(first, AppendResult)
    assert first.new_blocks.dtype == np.int32
    assert first.new_blocks.tolist() == [1, 2, 3, 4]
    assert first.evicted.tolist() == []
    assert eng.append(req, 2).new_blocks.tolist() == [5, 6]
    assert eng.ranges(req) == [Range(1, 6, 0)]
    assert eng.num_ranges(req) == 1
    assert eng.num_blocks_of(req) == 6
    stats = eng.stats()
    assert stats.in_place_growths == 1
    assert stats.new_ranges == 1
    assert stats.appended_blocks == 6


def test_new_range_when_the_neighbour_is_taken(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 2)
    eng.append(b, 2)
    assert eng.append(a, 2).new_blocks.tolist() == [5, 6]
    assert eng.ranges(a) == [Range(1, 2, 0), Range(5, 2, 2)]
    assert eng.ranges_array(a).tolist() == [[1, 2, 0], [5, 2, 2]]
    assert eng.blocks(a).tolist() == [1, 2, 5, 6]
    assert eng.blocks(a, 1, 2).tolist() == [2, 5]
    assert [eng.block(a, i) for i in range(4)] == [1, 2, 5, 6]


def test_partial_growth_then_new_range(eng: RangeEngine) -> None:
    a, b, c = (eng.create_request() for _ in range(3))
    eng.append(a, 2)  # 1-2
    eng.append(b, 3)  # 3-5
    eng.append(c, 2)  # 6-7
    eng.release(b)
    assert eng.free_ranges() == [(3, 3), (8, 24)]
    res = eng.append(a, 5)
    assert res.new_blocks.tolist() == [3, 4, 5, 8, 9]
    assert eng.ranges(a) == [Range(1, 5, 0), Range(8, 2, 5)]


@pytest.mark.parametrize(
    ("policy", "start"), [(Policy.FIRST_FIT, 4), (Policy.BEST_FIT, 9), (Policy.HEADROOM, 21)]
)
def test_policies_place_a_new_range(make_engine: EngineFactory, policy: Policy, start: int) -> None:
    eng = make_engine(32, policy=Policy.FIRST_FIT)  # lays the blocks out left to right
    a, hole1, b, hole2, c = (eng.create_request() for _ in range(5))
    for req, n in ((a, 3), (hole1, 4), (b, 1), (hole2, 2), (c, 1)):
        eng.append(req, n)
    eng.release(hole1)
    eng.release(hole2)
    assert eng.free_ranges() == [(4, 4), (9, 2), (12, 20)]
    eng.set_policy(policy)
    new = eng.create_request()
    assert eng.append(new, 2).new_blocks.tolist() == [start, start + 1]


def test_headroom_at_the_first_usable_block_starts_there(make_engine: EngineFactory) -> None:
    eng = make_engine(32, policy=Policy.HEADROOM)
    req = eng.create_request()
    assert eng.append(req, 3).new_blocks.tolist() == [1, 2, 3]


def test_several_ranges_largest_first(make_engine: EngineFactory) -> None:
    eng = make_engine(16, policy=Policy.BEST_FIT)
    reqs = [eng.create_request() for _ in range(15)]
    for req in reqs:
        eng.append(req, 1)  # block i+1
    for i in (1, 2, 5, 6, 7, 10):  # free blocks 2-3, 6-8, 11
        eng.release(reqs[i])
    assert eng.free_ranges() == [(2, 2), (6, 3), (11, 1)]
    new = eng.create_request()
    assert eng.append(new, 6).new_blocks.tolist() == [6, 7, 8, 2, 3, 11]
    assert eng.free_ranges() == []


def test_sharing_and_release_to_cache(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 4)
    eng.cache_mark([1, 2, 3, 4])
    eng.attach(b, [1, 2, 3])
    req_refs, cache_refs = eng.block_state()
    assert req_refs[:6].tolist() == [0, 2, 2, 2, 1, 0]
    assert cache_refs[:6].tolist() == [0, 1, 1, 1, 1, 0]
    assert eng.ranges(b) == [Range(1, 3, 0)]
    eng.release(a)
    assert eng.lru_order().tolist() == [4]
    stats = eng.stats()
    assert (stats.used_blocks, stats.cached_only_blocks, stats.free_blocks) == (3, 1, 27)
    eng.attach(b, [4])  # a cache-only block leaves the LRU; adjacent: merges into one range
    assert eng.lru_order().tolist() == []
    assert eng.ranges(b) == [Range(1, 4, 0)]
    eng.release(b)
    assert eng.lru_order().tolist() == [4, 3, 2, 1]  # reverse logical order: last blocks evicted first


def test_lru_eviction_order(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 3)
    eng.append(b, 2)
    eng.cache_mark([1, 2, 3, 4, 5])
    eng.release(b)
    eng.release(a)
    assert eng.lru_order().tolist() == [5, 4, 3, 2, 1]
    assert eng.cache_evict(2).tolist() == [5, 4]
    assert eng.lru_order().tolist() == [3, 2, 1]
    expect_error(eng, [], InvalidArgumentError, lambda: eng.cache_evict(0))
    assert eng.cache_evict(100).tolist() == [3, 2, 1]
    assert eng.stats().evictions == 5
    assert eng.free_ranges() == [(1, 31)]


def test_append_evicts_exactly_what_it_needs(make_engine: EngineFactory) -> None:
    eng = make_engine(8)
    a = eng.create_request()
    eng.append(a, 7)
    eng.cache_mark(list(range(1, 8)))
    eng.release(a)
    assert eng.lru_order().tolist() == [7, 6, 5, 4, 3, 2, 1]
    b = eng.create_request()
    res = eng.append(b, 3)
    assert res.evicted.tolist() == [7, 6, 5]
    assert sorted(res.new_blocks.tolist()) == [5, 6, 7]
    assert eng.lru_order().tolist() == [4, 3, 2, 1]
    c = eng.create_request()
    expect_error(eng, [b, c], NoSpaceError, lambda: eng.append(c, 5))


def test_cache_clear_and_unmark(eng: RangeEngine) -> None:
    a = eng.create_request()
    eng.append(a, 4)
    eng.cache_mark([1, 2, 3])
    eng.cache_mark([3])
    eng.cache_unmark([3])
    eng.release(a)
    assert eng.lru_order().tolist() == [3, 2, 1]
    eng.cache_unmark([2])  # last reference gone: free again
    assert eng.lru_order().tolist() == [3, 1]
    assert eng.cache_clear() == 2
    assert eng.stats().free_blocks == 31
    assert eng.free_ranges() == [(1, 31)]


def test_many_ranges_and_free_ranges_are_fetched_whole(make_engine: EngineFactory) -> None:
    eng = make_engine(200)
    owner, sharer = eng.create_request(), eng.create_request()
    eng.append(owner, 199)
    odd = list(range(1, 200, 2))
    eng.attach(sharer, odd)
    assert eng.num_ranges(sharer) == 100
    assert eng.ranges_array(sharer)[:, 0].tolist() == odd
    eng.release(owner)
    assert eng.free_ranges() == [(b, 1) for b in range(2, 200, 2)]
    hist = eng.ranges_histogram(4)
    assert hist.tolist() == [0, 0, 0, 1]


def test_ranges_histogram(eng: RangeEngine) -> None:
    a, b, c = (eng.create_request() for _ in range(3))
    eng.append(a, 2)
    eng.append(b, 2)
    eng.append(a, 2)  # a: 2 ranges
    assert eng.ranges_histogram(4).tolist() == [1, 1, 1, 0]  # c has 0 ranges
    assert eng.ranges_histogram(2).tolist() == [1, 2]
    del c


def test_stats_are_consistent(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 5)
    eng.append(b, 3)
    eng.release(a)
    stats = eng.stats()
    assert isinstance(stats, EngineStats)
    assert stats.num_blocks == 32
    assert stats.usable_blocks == 31
    assert stats.free_blocks + stats.cached_only_blocks + stats.used_blocks == stats.usable_blocks
    assert (stats.free_ranges, stats.largest_free_range, stats.free_blocks) == (2, 23, 28)
    assert stats.external_fragmentation == pytest.approx(1 - 23 / 28)
    assert (stats.live_requests, stats.total_request_ranges, stats.max_request_ranges) == (1, 1, 1)
