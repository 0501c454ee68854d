"""TagmaKVCacheManager against vLLM's own KVCacheManager, driven in lockstep through real vLLM ``Request``s.

Each "twin" holds a stock (paged) manager and a tagma manager built from the same ``KVCacheConfig`` and
arguments, and applies every scheduler-like operation to both: outcomes (hit lengths, allocation success,
usage, free blocks, the set of cached hashes, prefix-cache stats, KV events) must be identical, and the tagma
side must keep its engine and vLLM's block state in sync (checked after every step).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from tagma.contract import ENV_PLACEMENT
from tagma.core.block_pool import TagmaBlockPool
from tagma.core.manager import TagmaKVCacheManager
from tagma.core.range_manager import RangeBlocks, RangeKVCacheManager
from tagma.core.registry import PREFIX_INDEX, build_kv_cache_manager, spec_manager_map
from tagma.engine import RangeEngine

init_none_hash(sha256)


@pytest.fixture(autouse=True)
def _block_object_manager_with_caching_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the block-object manager with prefix caching on (vLLM's hashes, what
    TAGMA_RANGE_MANAGER=0 keeps) and the range manager with it off; ``build_kv_cache_manager(...)`` with
    caching on builds the prefix-index manager by default, tested in test_prefix_manager.py."""
    monkeypatch.setitem(spec_manager_map[FullAttentionSpec], PREFIX_INDEX, TagmaKVCacheManager)

BLOCK = 4  # tokens per block: small, so short token lists exercise many blocks


def full_spec(block_size: int = BLOCK) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


def make_config(
    num_blocks: int, block_size: int = BLOCK, specs: list[KVCacheSpec] | None = None
) -> KVCacheConfig:
    specs = specs or [full_spec(block_size)]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)],
    )


def manager_kwargs(block_size: int = BLOCK, **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_model_len": 1 << 14,
        "scheduler_block_size": block_size,
        "hash_block_size": block_size,
        "enable_caching": True,
        "log_stats": True,
    }
    kwargs.update(overrides)
    return kwargs


def make_request(request_id: str, tokens: list[int], block_size: int = BLOCK) -> Request:
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(tokens),
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def cached_hashes(manager: KVCacheManager) -> Counter[Any]:
    """Each cached hash key with the number of blocks cached under it."""
    cache = manager.block_pool.cached_block_hash_to_block._cache
    return Counter({key: 1 if not isinstance(v, dict) else len(v) for key, v in cache.items()})


def check_range_state(manager: RangeKVCacheManager) -> None:
    """The range manager's counts and the engine agree; no vLLM block object is used."""
    pool = manager.block_pool
    engine = manager.engine
    req_refs, cache_refs = engine.block_state()
    assert not cache_refs.any()
    assert all(b.ref_cnt == 0 for b in pool.blocks), "the range manager touched a KVCacheBlock"
    assert not manager.coordinator.single_type_managers[0].req_to_blocks
    stats = engine.stats()
    assert stats.cached_only_blocks == 0
    assert pool.get_num_free_blocks() == stats.free_blocks
    assert pool.free_block_queue.num_free_blocks == pool.get_num_free_blocks()
    live = set(pool._engine_reqs)
    assert stats.live_requests == len(live) and set(manager._held) == live
    assert stats.used_blocks == int(np.count_nonzero(req_refs)) == sum(manager._held.values())
    for rid in live:
        (ids,) = manager.get_block_ids(rid)
        assert len(ids) == manager.num_blocks_held(rid) == engine.num_blocks_of(pool._engine_reqs[rid])
        assert len(set(ids)) == len(ids) and all(req_refs[i] == 1 for i in ids)


def check_tagma_state(manager: TagmaKVCacheManager) -> None:
    """vLLM's view (ref_cnt, hashes, request block lists) and the engine's agree."""
    if isinstance(manager, RangeKVCacheManager):
        check_range_state(manager)
        return
    pool = manager.block_pool
    engine = manager.engine
    req_refs, cache_refs = engine.block_state()
    ref_cnt = np.array([b.ref_cnt for b in pool.blocks], dtype=np.int32)
    hashed = np.array([b.block_hash is not None for b in pool.blocks])
    assert ref_cnt[0] == 0 and req_refs[0] == 0 and cache_refs[0] == 0
    np.testing.assert_array_equal(ref_cnt, req_refs)
    np.testing.assert_array_equal(cache_refs > 0, hashed)
    stats = engine.stats()
    assert pool.get_num_free_blocks() == stats.free_blocks + stats.cached_only_blocks
    assert pool.free_block_queue.num_free_blocks == pool.get_num_free_blocks()
    assert stats.used_blocks == int(np.count_nonzero(ref_cnt))
    req_to_blocks = manager.coordinator.single_type_managers[0].req_to_blocks
    live = {rid for rid, blocks in req_to_blocks.items() if blocks}
    assert stats.live_requests == len(live)
    for rid in live:
        (ids,) = manager.get_block_ids(rid)
        assert ids == manager.engine_block_ids(rid).tolist()


class Twin:
    """A paged and a tagma manager driven by the same scheduler-like operations; outcomes compared."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK, policy: str = "headroom", **overrides: Any):
        config = make_config(num_blocks, block_size)
        kwargs = manager_kwargs(block_size, **overrides)
        self.block_size = block_size
        self.paged = KVCacheManager(config, **kwargs)
        self.tagma = build_kv_cache_manager(config, placement_policy=policy, **kwargs)
        self.requests: dict[str, tuple[Request, Request]] = {}
        self.handed_out: dict[str, list[int]] = {}  # tagma block ids given to each running request
        self.hits: list[int] = []
        self.full_sequence_must_fit = False

    def add(self, request_id: str, tokens: list[int]) -> None:
        self.requests[request_id] = (
            make_request(request_id, tokens, self.block_size),
            make_request(request_id, tokens, self.block_size),
        )

    def pairs(self, request_id: str) -> list[tuple[KVCacheManager, Request]]:
        p, t = self.requests[request_id]
        return [(self.paged, p), (self.tagma, t)]

    def _schedule(self, request_id: str, first: bool, budget: int | None = None) -> bool:
        """Schedule the request's next tokens (at most ``budget``: chunked prefill), as the scheduler does."""
        outcomes = []
        for manager, req in self.pairs(request_id):
            hit = 0
            computed = None
            if first:
                computed, hit, _ = manager.get_computed_blocks(req)
            num_new = req.num_tokens - req.num_computed_tokens - hit
            if budget is not None:
                num_new = min(num_new, budget)
            if first or self.full_sequence_must_fit:
                new = manager.allocate_slots(
                    req, num_new, hit, computed, full_sequence_must_fit=self.full_sequence_must_fit
                )
            else:
                new = manager.allocate_slots(req, num_new)  # the scheduler's call for a running request
            if new is not None:
                if first:
                    manager.record_prefix_cache_stats(req, hit)
                    req.status = RequestStatus.RUNNING
                req.num_computed_tokens += hit + num_new
                outcomes.append((hit, len(new.get_block_ids()[0])))
                if manager is self.tagma:
                    self._check_handed_out(request_id, new.get_block_ids()[0])
            else:
                outcomes.append((hit, None))
        assert outcomes[0] == outcomes[1], f"{request_id}: paged {outcomes[0]} != tagma {outcomes[1]}"
        if first:
            self.hits.append(outcomes[0][0])
        self.check()
        return outcomes[0][1] is not None

    def _check_handed_out(self, request_id: str, new_ids: list[int]) -> None:
        (ids,) = self.tagma.get_block_ids(request_id)
        seen = self.handed_out.setdefault(request_id, [])
        assert ids[: len(seen)] == seen, "a block id given to a running request changed"
        assert all(0 < i < self.tagma.block_pool.num_gpu_blocks for i in ids)
        assert ids[len(ids) - len(new_ids):] == new_ids or not new_ids
        seen[:] = ids

    def admit(self, request_id: str, budget: int | None = None) -> bool:
        return self._schedule(request_id, first=True, budget=budget)

    def decode(self, request_id: str, token: int) -> bool:
        """Append a sampled token and give it a slot (one decode step)."""
        for _, req in self.pairs(request_id):
            req.append_output_token_ids(token)
        return self._schedule(request_id, first=False)

    def free(self, request_id: str, preempt: bool = False) -> None:
        for manager, req in self.pairs(request_id):
            manager.free(req)
            if preempt:
                req.status = RequestStatus.PREEMPTED
                req.num_computed_tokens = 0
                req.num_preemptions += 1
        self.handed_out.pop(request_id, None)
        self.check()

    def new_step(self) -> None:
        self.paged.new_step_starts()
        self.tagma.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        a, b = self.paged.reset_prefix_cache(), self.tagma.reset_prefix_cache()
        assert a == b
        self.check()
        return a

    def check(self) -> None:
        p, t = self.paged, self.tagma
        assert p.usage == t.usage
        assert p.block_pool.get_num_free_blocks() == t.block_pool.get_num_free_blocks()
        assert cached_hashes(p) == cached_hashes(t)
        check_tagma_state(t)

    def check_stats(self) -> None:
        assert self.paged.make_prefix_cache_stats() == self.tagma.make_prefix_cache_stats()

    def events(self) -> tuple[list[Any], list[Any]]:
        return self.paged.take_events(), self.tagma.take_events()


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


def run_workload(
    twin: Twin, seed: int, num_requests: int, max_running: int, reset_every: int = 0, chunk: int | None = None
) -> None:
    """A seeded scheduler-like run: shared prefixes, FIFO admission, chunked prefill (at most ``chunk`` tokens
    a step), decode, preemption of the last admitted request when allocation fails, finish."""
    rng = random.Random(seed)
    bs = twin.block_size
    prefixes = [[rng.randrange(50_000) for _ in range(bs * rng.randint(1, 6))] for _ in range(4)]
    waiting: list[str] = []
    out_len: dict[str, int] = {}
    generated: dict[str, int] = {}
    for i in range(num_requests):
        prefix = rng.choice(prefixes)
        suffix = [rng.randrange(50_000) for _ in range(rng.randint(1, 3 * bs))]
        tokens = prefix[: rng.randint(0, len(prefix))] + suffix
        rid = f"r{i}"
        twin.add(rid, tokens)
        waiting.append(rid)
        out_len[rid] = rng.randint(1, 6 * bs)
        generated[rid] = 0
    running: list[str] = []
    step = 0
    while waiting or running:
        step += 1
        twin.new_step()
        if reset_every and step % reset_every == 0:
            twin.reset_prefix_cache()
        for rid in list(running):
            if rid not in running:
                continue  # preempted earlier this step
            req = twin.requests[rid][0]
            prefilling = req.num_computed_tokens < req.num_tokens
            if not prefilling:
                if generated[rid] >= out_len[rid]:
                    running.remove(rid)
                    twin.free(rid)
                    continue
                token = rng.randrange(50_000)
                for _, r in twin.pairs(rid):
                    r.append_output_token_ids(token)
                generated[rid] += 1
            while not twin._schedule(rid, first=False, budget=chunk):
                victim = running.pop()  # lowest priority: the last admitted
                twin.free(victim, preempt=True)
                waiting.insert(0, victim)
                if victim == rid:
                    break
        while waiting and len(running) < max_running:
            rid = waiting[0]
            if not twin.admit(rid, budget=chunk):
                break
            waiting.pop(0)
            running.append(rid)
        if step % 7 == 0:
            twin.check_stats()
    twin.check_stats()


# --------------------------------------------------------------------------------------------- tests


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
    assert any(twin.hits), "the workload should produce prefix hits"
    assert twin.tagma.engine.stats().evictions > 0, "the workload should evict cached blocks"
    assert_no_leak(twin.tagma)


@pytest.mark.parametrize("policy", ["first_fit", "headroom"])
def test_randomized_parity_other_policies_and_resets(policy: str) -> None:
    twin = Twin(num_blocks=48, policy=policy)
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


def assert_no_leak(manager: TagmaKVCacheManager) -> None:
    stats = manager.engine.stats()
    assert stats.used_blocks == 0
    assert stats.live_requests == 0
    assert stats.free_blocks + stats.cached_only_blocks == stats.usable_blocks
    assert all(b.ref_cnt == 0 for b in manager.block_pool.blocks)
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_gpu_blocks - 1
    assert not manager.block_pool._engine_reqs and not manager.block_pool._deferred


@pytest.mark.parametrize("policy", ["first_fit", "best_fit", "headroom"])
def test_interleaved_decode_never_rejects_and_headroom_grows_in_place(policy: str) -> None:
    bs = 16
    n = 16
    twin = Twin(num_blocks=260, block_size=bs, policy=policy, enable_caching=False)
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
    assert twin.hits[-1] == 8  # two full blocks hit; the last token is recomputed
    second = twin.tagma.block_pool.engine_request("a")
    assert second is not None and second != first
    twin.free("a")
    assert_no_leak(twin.tagma)


def test_reset_prefix_cache_and_events_match_paged() -> None:
    twin = Twin(num_blocks=16, enable_kv_cache_events=True)
    twin.add("a", list(range(13)))
    twin.add("b", list(range(13)))
    assert twin.admit("a") and twin.admit("b")
    assert twin.hits == [0, 12]
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


def test_unsupported_configurations_are_refused() -> None:
    sw = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8
    )
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cases: list[tuple[KVCacheConfig, dict[str, Any], str]] = [
        (make_config(16, specs=[sw]), {}, "sliding window"),
        (make_config(16, specs=[mla]), {}, "MLA"),
        (make_config(16, specs=[full_spec(), sw]), {}, "KV cache groups"),
        (make_config(16), {"dcp_world_size": 2}, "decode context parallelism"),
        (make_config(16), {"pcp_world_size": 2}, "prefill context parallelism"),
        (make_config(16), {"use_eagle": True}, "EAGLE"),
        (make_config(16), {"num_prefill_lookahead": 2}, "lookahead"),
    ]
    for config, extra, feature in cases:
        with pytest.raises(ValueError, match=f"^tagma: unsupported: .*{feature}"):
            build_kv_cache_manager(config, **manager_kwargs(**extra))


def test_constructor_accepts_vllm_arguments_and_passes_them_through() -> None:
    config = make_config(16)
    positional = build_kv_cache_manager(config, 1024, BLOCK, BLOCK, None, True, placement_policy="first_fit")
    assert positional.policy_name == "first_fit" and positional.enable_caching
    with pytest.raises(TypeError):
        build_kv_cache_manager(config, **manager_kwargs(no_such_argument=1))


def test_policy_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PLACEMENT, "best_fit")
    assert build_kv_cache_manager(make_config(16), **manager_kwargs()).policy_name == "best_fit"
    chosen = build_kv_cache_manager(make_config(16), placement_policy="first_fit", **manager_kwargs())
    assert chosen.policy_name == "first_fit"
    monkeypatch.delenv(ENV_PLACEMENT)
    assert build_kv_cache_manager(make_config(16), **manager_kwargs()).policy_name == "headroom"


def test_block_pool_is_converted_in_place_for_every_holder() -> None:
    manager = build_kv_cache_manager(make_config(16), **manager_kwargs())
    pool = manager.block_pool
    assert isinstance(pool, TagmaBlockPool)
    assert manager.coordinator.block_pool is pool
    assert manager.coordinator.single_type_managers[0].block_pool is pool
    assert all(b.pool is pool for b in pool.blocks)
    assert pool.free_block_queue.num_free_blocks == 15
    with pytest.raises(NotImplementedError, match="tagma: unsupported: free_block_queue.popleft"):
        pool.free_block_queue.popleft()
    with pytest.raises(NotImplementedError, match="tagma: unsupported"):
        pool.get_new_blocks(1)  # outside a request's allocation


def test_telemetry_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    path = tmp_path / "telemetry.jsonl"
    monkeypatch.setenv("TAGMA_TELEMETRY_FILE", str(path))
    monkeypatch.setenv("TAGMA_TELEMETRY_INTERVAL_S", "0")
    twin = Twin(num_blocks=32)
    twin.add("a", list(range(30)))
    assert twin.admit("a")
    twin.new_step()
    twin.new_step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    expected = {
        "t", "ranges_per_request", "live_requests", "in_place_growths", "new_ranges", "merges", "evictions",
        "free_blocks", "cached_only_blocks", "used_blocks", "largest_free_range", "external_fragmentation",
        "num_blocks", "policy", "peak_ranges_per_request", "peak_live_requests",
    }
    assert set(lines[-1]) == expected
    assert lines[-1]["live_requests"] == 1 and lines[-1]["used_blocks"] == 8
    assert lines[-1]["ranges_per_request"] == {"mean": 1.0, "p99": 1.0, "max": 1}
    assert lines[-1]["peak_ranges_per_request"] == 1 and lines[-1]["peak_live_requests"] == 1
    assert lines[-1]["policy"] == "headroom" and lines[-1]["num_blocks"] == 32
    assert set(twin.tagma.telemetry_snapshot()) == expected


def test_telemetry_off_without_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("TAGMA_TELEMETRY_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    manager = build_kv_cache_manager(make_config(16), **manager_kwargs())
    manager.new_step_starts()
    assert manager.telemetry.path is None
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- range manager (caching off)


def test_caching_off_builds_the_range_manager_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(32)
    off = build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))
    assert type(off) is RangeKVCacheManager and not off.enable_caching
    positional = build_kv_cache_manager(config, 1 << 14, 4, 4, None, False)  # enable_caching by position
    assert type(positional) is RangeKVCacheManager
    on = build_kv_cache_manager(config, **manager_kwargs(enable_caching=True))
    assert type(on) is TagmaKVCacheManager
    monkeypatch.setenv("TAGMA_RANGE_MANAGER", "0")
    assert type(build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))) is TagmaKVCacheManager
    with pytest.raises(ValueError, match="prefix caching off only"):
        RangeKVCacheManager(config, **manager_kwargs(enable_caching=True))


@pytest.mark.parametrize(("seed", "chunk"), [(0, None), (1, None), (3, 6), (4, 9)])
def test_range_manager_parity_with_paged_under_pressure(seed: int, chunk: int | None) -> None:
    twin = Twin(num_blocks=40, enable_caching=False)
    assert type(twin.tagma) is RangeKVCacheManager
    run_workload(twin, seed, num_requests=60, max_running=6, chunk=chunk)
    assert_no_leak(twin.tagma)


def test_range_manager_full_sequence_admission_watermark_and_reserved() -> None:
    twin = Twin(num_blocks=40, watermark=0.1, enable_caching=False)
    for i in range(12):
        twin.add(f"w{i}", list(range(1000 * i, 1000 * i + 8 + i)))
    twin.full_sequence_must_fit = True
    admitted = [f"w{i}" for i in range(12) if twin.admit(f"w{i}")]
    assert admitted and len(admitted) < 12
    # reserved_blocks: the same refusal on both sides.
    for manager, req in twin.pairs(admitted[0]):
        req.append_output_token_ids(5)
        free = manager.block_pool.get_num_free_blocks()
        assert manager.allocate_slots(req, 1 + BLOCK * 3, reserved_blocks=free) is None
    for rid in admitted:
        twin.free(rid)
    assert_no_leak(twin.tagma)


class CountingBatch:
    """Wraps a manager's prepared batch call; records the counts of every engine crossing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, n: int) -> None:
        self.calls.append(list(self.inner.counts[:n]))
        self.inner(n)


def test_range_manager_decode_fast_path_makes_no_engine_call() -> None:
    manager = build_kv_cache_manager(make_config(64), **manager_kwargs(enable_caching=False))
    assert isinstance(manager, RangeKVCacheManager)
    batch = manager._batch = CountingBatch(manager._batch)
    req = make_request("r", list(range(1, 6)))  # 5 tokens: 2 blocks of 4
    new = manager.allocate_slots(req, req.num_tokens)
    assert isinstance(new, RangeBlocks) and new.pending and len(new) == 2 and batch.calls == []
    assert len(new.get_block_ids()[0]) == 2 and batch.calls == [[2]]  # applied when the ids are read
    req.num_computed_tokens = req.num_tokens
    req.status = RequestStatus.RUNNING
    outcomes = []
    for step in range(8):
        req.append_output_token_ids(step)
        new = manager.allocate_slots(req, 1)
        assert new is not None
        outcomes.append(len(new.get_block_ids()[0]))
        req.num_computed_tokens += 1
    # Tokens 6..13: blocks are crossed at tokens 9 and 13; every other step is the no-call fast path.
    assert outcomes == [0, 0, 0, 1, 0, 0, 0, 1]
    assert batch.calls == [[2], [1], [1]]
    engine_ids = manager.engine.blocks(manager.block_pool.engine_request("r")).tolist()
    assert manager.get_block_ids("r")[0] == engine_ids
    manager.free(req)
    assert_no_leak(manager)


def test_range_blocks_view_matches_kv_cache_blocks() -> None:
    manager = build_kv_cache_manager(make_config(64), **manager_kwargs(enable_caching=False))
    req = make_request("r", list(range(1, 30)))
    view = manager.allocate_slots(req, req.num_tokens)
    assert isinstance(view, RangeBlocks)
    (ids,) = view.get_block_ids()
    assert len(ids) == 8 and ids == manager.get_block_ids("r")[0]
    assert view.get_block_ids(allow_none=True) == (ids,)
    assert view.get_block_ids(group_ids=[0]) == (ids,)
    with pytest.raises(IndexError, match="one group"):
        view.get_block_ids(group_ids=[1])
    assert [b.block_id for b in view.blocks[0]] == ids  # KVCacheBlock objects only on demand
    assert view.get_unhashed_block_ids() == ids
    both = manager.empty_kv_cache_blocks + view
    assert both.get_block_ids() == (ids,)
    assert view.new_empty().get_block_ids(allow_none=True) is None
    assert RangeBlocks([], 0, [], manager.block_pool).get_block_ids(allow_none=True) is None
    assert view.runs == [(ids[0], 8)]  # one range
    got = manager.get_blocks("r")
    assert isinstance(got, RangeBlocks) and got.get_block_ids() == (ids,)
    assert manager.get_blocks("unknown") is manager.empty_kv_cache_blocks
    assert manager.get_block_ids_for_computed_tokens("r", 5) == (ids[:2],)
    assert manager.estimate_cached_tokens(req) == 0
    assert manager.get_computed_blocks(req) == (manager.empty_kv_cache_blocks, 0, 0)
    manager.free(req)
    manager.free(req)  # a second free is a no-op, as vLLM's
    assert_no_leak(manager)


def test_range_manager_deferred_free_and_coordinator_count() -> None:
    twin = Twin(num_blocks=32, enable_caching=False)
    twin.add("a", list(range(10)))
    assert twin.admit("a")
    paged_req, req = twin.requests["a"]
    for manager, _ in twin.pairs("a"):
        got = manager.coordinator.get_num_blocks_to_allocate(
            request_id="a", num_tokens=30, new_computed_blocks=((),), num_encoder_tokens=0,
            total_computed_tokens=10, num_local_computed_tokens=10, num_tokens_main_model=30,
        )  # fmt: skip
        assert got == 8 - 3
    manager = twin.tagma
    released = manager.pop_blocks_for_free(req)
    assert len(released) == 3 and released
    assert manager.engine.stats().used_blocks == 3  # still held until freed
    assert manager.block_pool.get_num_free_blocks() == 31 - 3
    manager.block_pool.free_blocks(reversed(released))
    manager.block_pool.free_blocks(released)  # already released: no-op
    assert_no_leak(manager)
    paged_blocks = twin.paged.pop_blocks_for_free(paged_req)
    twin.paged.block_pool.free_blocks(reversed(paged_blocks))
    twin.check()


def test_range_manager_refuses_what_caching_off_cannot_have() -> None:
    manager = build_kv_cache_manager(make_config(32), **manager_kwargs(enable_caching=False))
    req = make_request("r", list(range(10)))
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        manager.allocate_slots(req, 0)
    with pytest.raises(NotImplementedError, match="prefix-cache hits"):
        manager.allocate_slots(req, 4, num_new_computed_tokens=4)
    with pytest.raises(NotImplementedError, match="encoder"):
        manager.allocate_slots(req, 4, num_encoder_tokens=4)
    assert manager.engine.stats().live_requests == 0


@pytest.mark.parametrize(("external", "new"), [(8, 3), (6, 0), (5, 7)])
def test_range_manager_external_tokens_match_paged(external: int, new: int) -> None:
    """Tokens a KV connector computed get blocks first, and those are not among the returned new blocks."""
    twin = Twin(num_blocks=32, enable_caching=False)
    twin.add("x", list(range(20)))
    outcomes = []
    for manager, req in twin.pairs("x"):
        got = manager.allocate_slots(req, new, num_external_computed_tokens=external)
        assert got is not None
        outcomes.append((len(got.get_block_ids()[0]), len(manager.get_block_ids("x")[0]), manager.usage))
    assert outcomes[0] == outcomes[1]
    twin.check()
    twin.free("x")
    assert_no_leak(twin.tagma)


def test_range_manager_python_bytes_per_request_are_small() -> None:
    import tracemalloc

    n_blocks = 2048
    kwargs = manager_kwargs(16, enable_caching=False)
    manager = build_kv_cache_manager(make_config(8 * n_blocks + 8, 16), **kwargs)
    reqs = [make_request(f"m{i}", [1] * (16 * n_blocks)) for i in range(4)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for req in reqs:
            assert manager.allocate_slots(req, req.num_tokens) is not None
        resident = (tracemalloc.get_traced_memory()[0] - before) / len(reqs)
    finally:
        tracemalloc.stop()
    # vLLM keeps a list of 2,048 KVCacheBlock references per such request (16 KiB); tagma a few counters.
    assert resident < 1024, resident
    for req in reqs:
        manager.free(req)
    assert_no_leak(manager)


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


def _reserve_request(request_id: str, prompt: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(request_id=request_id, prompt_token_ids=list(range(1, prompt + 1)), sampling_params=params,
                   pooling_params=None, block_hasher=None)  # fmt: skip


def test_range_manager_reserve_hints_prompt_plus_max_tokens_and_waits_for_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAGMA_RESERVE_ADMISSION", "100/1")
    manager = build_kv_cache_manager(
        make_config(41), placement_policy="reserve", **manager_kwargs(enable_caching=False)
    )  # usable blocks [1, 41)
    assert isinstance(manager, RangeKVCacheManager)
    hints: list[int] = []
    append = RangeEngine.append_runs  # a request's first append goes to the engine at once under RESERVE

    def recording(engine: RangeEngine, request: int, count: int, hint: int = 0) -> Any:
        hints.append(hint)
        return append(engine, request, count, hint)

    monkeypatch.setattr(RangeEngine, "append_runs", recording)
    a = _reserve_request("a", 8, 72)  # 80 tokens expected: 20 blocks, [1, 21) kept for it
    assert manager.get_block_ids("a") == ([],)
    assert manager.allocate_slots(a, 8) is not None and hints == [20]
    b = _reserve_request("b", 8, 80)  # 22 blocks: only 20 are clear of a's reservation
    free_before = manager.block_pool.get_num_free_blocks()
    assert manager.allocate_slots(b, 8) is None  # enough blocks are free: the engine declined admission
    assert manager.block_pool.get_num_free_blocks() == free_before and manager.num_blocks_held("b") == 0
    c = _reserve_request("c", 8, 72)  # 20 blocks fit right after a's reservation
    assert manager.allocate_slots(c, 8) is not None
    assert manager.get_block_ids("a") == ([1, 2],) and manager.get_block_ids("c") == ([21, 22],)
    # growth goes through the step's batched crossing, hinted: a grows in place into its reservation
    a.num_computed_tokens = 8
    grown = manager.allocate_slots(a, 8)
    assert grown is not None and grown.get_block_ids() == ([3, 4],) and len(hints) == 3  # no direct call
    for req in (a, b, c):
        manager.free(req)
    assert_no_leak(manager)


def test_reserve_admission_setting_is_checked() -> None:
    from tagma.core.manager import reserve_admission

    assert reserve_admission("") == (100, 4) and reserve_admission("75/2") == (75, 2)
    assert reserve_admission("0") == (0, 1)
    for bad in ("101", "50/0", "x"):
        with pytest.raises(ValueError, match="TAGMA_RESERVE_ADMISSION"):
            reserve_admission(bad)
