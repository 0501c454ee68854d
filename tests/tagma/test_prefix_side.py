"""tagma.engine.prefix_side: a window group's blocks cached at the full group's nodes, through the binding."""

from __future__ import annotations

import numpy as np
import pytest

from tagma.engine import BlockStateError, InvalidArgumentError, RangeEngine
from tagma.engine.prefix_index import PrefixIndex
from tagma.engine.prefix_side import PrefixSideGroups

BS = 4


def _setup(num_blocks: int = 64, groups: int = 1) -> tuple[RangeEngine, PrefixIndex, PrefixSideGroups]:
    engine = RangeEngine(num_blocks)
    index = PrefixIndex(engine, BS)
    return engine, index, PrefixSideGroups(index, groups)


def _request(
    engine: RangeEngine, index: PrefixIndex, side: PrefixSideGroups, tokens: list[int]
) -> tuple[int, int]:
    """A request computed from scratch in both groups, its full blocks indexed and its side blocks cached."""
    n = len(tokens) // BS
    full = engine.create_request()
    engine.append_runs(full, n)
    index.insert(0, full, tokens)
    window = engine.create_request()
    engine.append_runs(window, n)
    assert side.insert(full, 0, window, 0, 0, n) == n
    return full, window


def _free_count(engine: RangeEngine) -> tuple[int, int]:
    s = engine.stats()
    return s.free_blocks, s.cached_only_blocks


def test_side_blocks_are_found_at_the_full_groups_nodes_and_attach_to_a_new_request() -> None:
    engine, index, side = _setup()
    tokens = list(range(1000, 1000 + 6 * BS))
    full, window = _request(engine, index, side, tokens)
    window_ids = engine.blocks(window).tolist()
    nodes = index.lookup_ids(0, tokens)
    assert side.lookup(0, nodes).tolist() == window_ids
    engine.free_front(window, 4)  # the window moved: its first 4 blocks are cache-only now
    assert _free_count(engine)[1] == 4
    assert side.lookup(0, nodes).tolist() == window_ids  # still cached
    engine.release(full)
    engine.release(window)
    assert _free_count(engine)[1] == 12
    # a hit of all 6 blocks for a window of 2 blocks: the last 2 side blocks
    again = engine.create_request()
    side.attach(again, window_ids[4:])
    assert engine.blocks(again).tolist() == window_ids[4:]
    assert _free_count(engine)[1] == 10
    assert side.stats().cached_blocks == 6


def test_evicting_a_side_block_leaves_the_nodes_and_the_later_side_blocks() -> None:
    engine, index, side = _setup(num_blocks=25)  # 24 usable blocks
    tokens = list(range(6 * BS))
    full, window = _request(engine, index, side, tokens)
    window_ids = engine.blocks(window).tolist()
    engine.free_front(window, 4)  # these 4 enter the LRU first
    engine.release(window)
    engine.release(full)
    nodes = index.lookup_ids(0, tokens)
    other = engine.create_request()
    engine.append_runs(other, 16)  # 12 free blocks: 4 evicted, the window's oldest
    found = side.lookup(0, nodes).tolist()
    assert found[:4] == [-1] * 4
    assert found[4:] == window_ids[4:]
    assert index.lookup(0, tokens) == 6  # the full group's chain is whole
    assert side.stats().evicted_blocks == 4


def test_evicting_a_node_evicts_the_side_blocks_cached_at_it() -> None:
    engine, index, side = _setup(num_blocks=25)
    tokens = list(range(6 * BS))
    full, window = _request(engine, index, side, tokens)
    window_ids = engine.blocks(window).tolist()
    engine.release(full)  # the full chain enters the LRU first, its last block first
    engine.release(window)
    other = engine.create_request()
    engine.append_runs(other, 13)  # 12 free: one eviction, the chain's last node, frees its side block too
    assert index.lookup(0, tokens) == 5
    assert side.lookup(0, index.lookup_ids(0, tokens)).tolist() == window_ids[:5]
    assert side.stats().cached_blocks == 5
    assert _free_count(engine) == (24 - 13 - 10, 10)


def test_a_duplicate_block_caches_its_side_block_at_the_node_it_duplicates() -> None:
    engine, index, side = _setup()
    tokens = list(range(4 * BS))
    first = engine.create_request()
    engine.append_runs(first, 4)
    index.insert(0, first, tokens)  # no side blocks for the first request
    second = engine.create_request()
    engine.append_runs(second, 4)
    index.insert(0, second, tokens)  # every block a duplicate of the first's
    window = engine.create_request()
    engine.append_runs(window, 4)
    mask = np.array([False, False, True, True])
    assert side.insert(second, 0, window, 0, 0, 4, mask) == 2
    nodes = index.lookup_ids(0, tokens)
    assert nodes.tolist() == engine.blocks(first).tolist()
    assert side.lookup(0, nodes).tolist() == [-1, -1, *engine.blocks(window).tolist()[2:]]


def test_positions_the_full_request_has_not_indexed_and_freed_side_blocks_are_skipped() -> None:
    engine, index, side = _setup()
    tokens = list(range(4 * BS))
    full = engine.create_request()
    engine.append_runs(full, 4)
    index.insert(0, full, tokens[: 2 * BS])  # 2 of its 4 blocks indexed
    window = engine.create_request()
    engine.append_runs(window, 4)
    engine.free_front(window, 1)  # local block 0 is logical 1 now
    assert side.insert(full, 0, window, 1, 0, 4) == 1  # logical 1 only: 0 is freed, 2 and 3 are not indexed
    assert side.lookup(0, index.lookup_ids(0, tokens)).tolist() == [-1, engine.blocks(window).tolist()[0]]


def test_bad_input_is_refused_and_changes_nothing() -> None:
    engine, index, side = _setup()
    tokens = list(range(2 * BS))
    full, window = _request(engine, index, side, tokens)
    before = _free_count(engine), side.stats()
    with pytest.raises(InvalidArgumentError):
        side.insert(full, 1, window, 0, 0, 2)  # no group 1
    with pytest.raises(InvalidArgumentError):
        side.insert(full, 0, window, 0, 2, 1)
    with pytest.raises(InvalidArgumentError):
        side.insert(full, 0, full, 0, 0, 2)
    fresh = engine.create_request()
    with pytest.raises(BlockStateError):
        side.attach(fresh, engine.blocks(full))  # nodes, not side blocks
    with pytest.raises(BlockStateError):
        side.attach(fresh, [engine.blocks(window)[0]] * 2)
    with pytest.raises(BlockStateError):
        side.attach(window, engine.blocks(window))  # holds blocks already
    with pytest.raises(BlockStateError):
        engine.free_front(full, 1)  # a request in the index keys its blocks from logical 0
    with pytest.raises(BlockStateError):
        PrefixSideGroups(index, 1)  # once
    assert (_free_count(engine), side.stats()) == before
    assert engine.blocks(fresh).size == 0


def test_side_groups_need_an_empty_index() -> None:
    engine = RangeEngine(16)
    index = PrefixIndex(engine, BS)
    req = engine.create_request()
    engine.append_runs(req, 1)
    index.insert(0, req, list(range(BS)))
    with pytest.raises(BlockStateError):
        PrefixSideGroups(index, 1)


def test_clear_drops_side_blocks() -> None:
    engine, index, side = _setup()
    full, window = _request(engine, index, side, list(range(3 * BS)))
    engine.release(full)
    engine.release(window)
    assert index.clear() == 6
    assert side.stats().cached_blocks == 0
    assert _free_count(engine) == (63, 0)
