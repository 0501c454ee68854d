"""TagmaKVCacheManager (the block-object manager, prefix caching on with vLLM's hashes) against vLLM's own
KVCacheManager, driven in lockstep through real vLLM ``Request``s by a ``Twin`` (tests/tagma/twin.py).

Outcomes (hit lengths, allocation success, usage, free blocks, the set of cached hashes, prefix-cache stats,
KV events) must be identical, and the tagma side must keep its engine and vLLM's block state in sync
(checked after every step). Caching on builds the prefix-index manager by default (test_prefix_manager.py);
these tests swap the block-object manager in.
"""

from __future__ import annotations

from typing import Any

import pytest
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector

from tests.tagma.twin import (
    BLOCK,
    Twin,
    assert_no_leak,
    cached_hashes,
    check_tagma_state,
    run_workload,
    use_block_object_manager,
)


@pytest.fixture(autouse=True)
def _block_object_manager_with_caching_on(monkeypatch: pytest.MonkeyPatch) -> None:
    use_block_object_manager(monkeypatch)


def event_signature(events: list[Any]) -> list[tuple[Any, ...]]:
    """Events without block ids: type and hashes (block placement differs, content does not)."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(("stored", tuple(e.block_hashes), e.parent_block_hash, tuple(e.token_ids)))
        elif isinstance(e, BlockRemoved):
            out.append(("removed", tuple(e.block_hashes)))
        elif isinstance(e, AllBlocksCleared):
            out.append(("cleared",))
        else:
            out.append((type(e).__name__,))
    return out


def test_block_ids_are_physical_stable_and_the_engines() -> None:
    twin = Twin(num_blocks=64)
    for i in range(6):
        twin.add(f"r{i}", list(range(100 * i, 100 * i + 5 + 3 * i)))
        assert twin.admit(f"r{i}")
    for step in range(20):
        for i in range(6):
            assert twin.decode(f"r{i}", 7 + step)
    for i in range(6):
        (ids,) = twin.tagma.get_block_ids(f"r{i}")
        assert ids == twin.tagma.engine_block_ids(f"r{i}").tolist()
        assert min(ids) >= 1 and max(ids) < 64
    for i in range(6):
        twin.free(f"r{i}")
    assert_no_leak(twin.tagma)


@pytest.mark.parametrize(("seed", "chunk"), [(0, None), (1, None), (2, None), (3, 6), (4, 9)])
def test_randomized_parity_with_paged_under_pressure(seed: int, chunk: int | None) -> None:
    twin = Twin(num_blocks=40)
    run_workload(twin, seed, num_requests=60, max_running=6, chunk=chunk)
    assert any(twin.paged_hits), "the workload should produce prefix hits"
    assert twin.tagma.engine.stats().evictions > 0, "the workload should evict cached blocks"
    assert_no_leak(twin.tagma)


@pytest.mark.parametrize("policy", ["first_fit", "headroom"])
def test_randomized_parity_other_policies_and_resets(policy: str) -> None:
    twin = Twin(num_blocks=48, placement_policy=policy)
    run_workload(twin, seed=11, num_requests=40, max_running=8, reset_every=13)
    assert_no_leak(twin.tagma)


def test_parity_with_full_sequence_admission_and_watermark() -> None:
    twin = Twin(num_blocks=40, watermark=0.1)
    for i in range(12):
        twin.add(f"w{i}", list(range(1000 * i, 1000 * i + 8 + i)))
    twin.full_sequence_must_fit = True
    admitted = []
    for i in range(12):
        if twin.admit(f"w{i}"):
            admitted.append(f"w{i}")
    assert admitted and len(admitted) < 12
    for rid in admitted:
        twin.free(rid)
    assert_no_leak(twin.tagma)


def test_parity_without_prefix_caching() -> None:
    twin = Twin(num_blocks=32, enable_caching=False)
    run_workload(twin, seed=5, num_requests=25, max_running=5)
    assert twin.tagma.engine.stats().cached_only_blocks == 0
    assert_no_leak(twin.tagma)


@pytest.mark.parametrize("policy", ["first_fit", "best_fit", "headroom"])
def test_interleaved_decode_never_rejects_and_headroom_grows_in_place(policy: str) -> None:
    bs = 16
    n = 16
    twin = Twin(num_blocks=260, block_size=bs, placement_policy=policy, enable_caching=False)
    for i in range(n):
        twin.add(f"d{i}", [i + 1] * 20)
        assert twin.admit(f"d{i}")
    for step in range(bs * 12):
        twin.new_step()
        for i in range(n):
            # Twin asserts that tagma's allocate_slots fails exactly when paged's does.
            assert twin.decode(f"d{i}", step)
    stats = twin.tagma.engine.stats()
    ranges = twin.tagma.telemetry_snapshot()["ranges_per_request"]
    blocks_per_request = stats.used_blocks // n  # 14
    assert blocks_per_request == 14
    if policy == "headroom":
        # Each request starts in the middle of the largest gap: decode grows its one range in place.
        assert stats.in_place_growths >= n * (blocks_per_request - 2) - 4
        assert ranges["max"] <= 2
    else:
        # First/best fit put a request's next range right after its neighbour's: interleaved decode then
        # gets a range per block (the known fragmentation case). It must still never reject a request.
        assert ranges["max"] <= blocks_per_request
    for i in range(n):
        twin.free(f"d{i}")
    assert_no_leak(twin.tagma)


def test_preemption_releases_and_readmission_creates_a_new_engine_request() -> None:
    twin = Twin(num_blocks=32)
    twin.add("a", list(range(10)))
    assert twin.admit("a")
    first = twin.tagma.block_pool.engine_request("a")
    assert first is not None
    twin.free("a", preempt=True)
    assert twin.tagma.block_pool.engine_request("a") is None
    assert twin.tagma.engine.stats().live_requests == 0
    assert twin.admit("a")
    assert twin.paged_hits[-1] == 8  # two full blocks hit; the last token is recomputed
    second = twin.tagma.block_pool.engine_request("a")
    assert second is not None and second != first
    twin.free("a")
    assert_no_leak(twin.tagma)


def test_reset_prefix_cache_and_events_match_paged() -> None:
    twin = Twin(num_blocks=16, enable_kv_cache_events=True)
    twin.add("a", list(range(13)))
    twin.add("b", list(range(13)))
    assert twin.admit("a") and twin.admit("b")
    assert twin.paged_hits == [0, 12]
    assert not twin.reset_prefix_cache()  # blocks in use
    twin.free("a")
    twin.free("b")
    # Pressure: a request that needs every block evicts the cached ones (BlockRemoved).
    twin.add("c", list(range(1000, 1000 + 15 * BLOCK - 1)))
    assert twin.admit("c")
    twin.free("c")
    assert twin.tagma.engine.stats().cached_only_blocks > 0
    assert twin.reset_prefix_cache()
    assert not cached_hashes(twin.tagma)
    stats = twin.tagma.engine.stats()
    assert stats.cached_only_blocks == 0 and stats.free_blocks == 15
    assert all(b.block_hash is None for b in twin.tagma.block_pool.blocks)
    paged_events, tagma_events = twin.events()
    kinds = {type(e) for e in tagma_events}
    assert {BlockStored, BlockRemoved, AllBlocksCleared} <= kinds
    assert event_signature(paged_events) == event_signature(tagma_events)
    stats_p, stats_t = twin.paged.make_prefix_cache_stats(), twin.tagma.make_prefix_cache_stats()
    assert stats_t is not None and stats_t.reset and stats_p == stats_t


def test_events_match_paged_over_a_random_workload() -> None:
    twin = Twin(num_blocks=40, enable_kv_cache_events=True)
    run_workload(twin, seed=3, num_requests=30, max_running=6)
    paged_events, tagma_events = twin.events()
    assert any(isinstance(e, BlockRemoved) for e in tagma_events)
    assert event_signature(paged_events) == event_signature(tagma_events)


def test_metrics_collector_hooks_run() -> None:
    twin = Twin(num_blocks=40)
    collectors = []
    for manager in (twin.paged, twin.tagma):
        collector = KVCacheMetricsCollector(sample_rate=1.0)
        manager.block_pool.metrics_collector = collector
        collectors.append(collector)
    run_workload(twin, seed=4, num_requests=30, max_running=6)
    paged_events, tagma_events = (c.drain_events() for c in collectors)
    assert paged_events and tagma_events  # reused/evicted blocks end their residency on both sides
    assert len(collectors[1].block_metrics) <= twin.tagma.block_pool.num_gpu_blocks


def test_free_block_queue_lists_the_free_and_cache_only_blocks() -> None:
    twin = Twin(num_blocks=24)
    for i in range(3):
        twin.add(f"q{i}", list(range(10 * i, 10 * i + 9)))
        assert twin.admit(f"q{i}")
    twin.free("q1")
    pool = twin.tagma.block_pool
    listed = pool.free_block_queue.get_all_free_blocks()
    assert len(listed) == pool.free_block_queue.num_free_blocks
    assert {b.block_id for b in listed} == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}


def test_deferred_free_through_pop_blocks_for_free() -> None:
    twin = Twin(num_blocks=32)
    twin.add("a", list(range(10)))
    assert twin.admit("a")
    manager = twin.tagma
    _, req = twin.requests["a"]
    blocks = manager.pop_blocks_for_free(req)
    assert manager.engine.stats().used_blocks == len(blocks) == 3  # still held until freed
    manager.block_pool.free_blocks(reversed(blocks))
    assert_no_leak(manager)
    paged_blocks = twin.paged.pop_blocks_for_free(twin.requests["a"][0])
    twin.paged.block_pool.free_blocks(reversed(paged_blocks))
    twin.check()


def test_evict_blocks_drops_cache_marks() -> None:
    twin = Twin(num_blocks=32)
    twin.add("a", list(range(10)))
    twin.add("b", list(range(10)))
    assert twin.admit("a")
    (ids,) = twin.tagma.get_block_ids("a")
    twin.free("a")
    twin.tagma.evict_blocks({ids[0]})
    assert twin.tagma.block_pool.blocks[ids[0]].block_hash is None
    check_tagma_state(twin.tagma)
    _, req = twin.requests["b"]
    _, hit, _ = twin.tagma.get_computed_blocks(req)
    assert hit == 0  # the first block's hash is gone, so nothing chains


def test_caching_on_decode_fast_path_skips_the_coordinator() -> None:
    twin = Twin(num_blocks=64)
    twin.add("r", list(range(1, 6)))
    assert twin.admit("r")
    manager = twin.tagma
    calls: list[int] = []
    counted = manager.coordinator.get_num_blocks_to_allocate

    def counting(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return counted(*args, **kwargs)

    manager.coordinator.get_num_blocks_to_allocate = counting  # type: ignore[method-assign]
    for step in range(8):
        assert twin.decode("r", 50 + step)  # compared with paged, hashes included, after every step
    # 5 prompt tokens; decode tokens 6..13: a block fills (to be cached) or a new one is needed at tokens
    # 8/9 and 12/13; the four other steps take the fast path.
    assert len(calls) == 4
    twin.free("r")
    assert_no_leak(manager)
