"""PrefixKVCacheManager (prefix caching on, the engine's prefix index) against vLLM's own KVCacheManager.

Both managers get the same scheduler-like operations on real vLLM ``Request``s: vLLM's requests carry its
sha256 block hasher, tagma's carry none (its engine core builds them without one). Outcomes must match:
hit lengths, allocation success and sizes, usage, free blocks, prefix-cache stats. With no eviction
pressure the hit lengths equal vLLM's exactly (same cold request sequence); under pressure the eviction
order is the engine's, so only invariants are checked there. After every step the engine's block state
is checked against the manager's counts. The driver is tests/tagma/twin.py's ``Twin`` with the
``PREFIX_INDEX`` flavour (the contiguity-aware eviction mode unless a test picks another).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from vllm.lora.request import LoRARequest
from vllm.v1.request import RequestStatus

from tagma.contract import ENV_RANGE_MANAGER
from tagma.core.manager import TagmaKVCacheManager
from tagma.core.prefix_manager import PrefixKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.errors import TagmaUnsupported
from tests.tagma.twin import (
    BLOCK,
    PREFIX_INDEX,
    Twin,
    check_prefix_state,
    make_config,
    manager_kwargs,
    run_workload,
    tagma_request,
)

# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_eviction_keeps_vllm_s_hits_under_pressure(seed: int) -> None:
    # exact LRU: vLLM's eviction order, so vLLM's hits
    twin = Twin(num_blocks=40, flavour=PREFIX_INDEX, prefix_eviction="lru")
    run_workload(twin, seed, num_requests=30, max_running=8)
    assert sum(p for p, _ in twin.hits) > 0


def test_caching_on_builds_the_prefix_manager_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    manager = build_kv_cache_manager(make_config(32), **manager_kwargs())
    assert type(manager) is PrefixKVCacheManager
    assert manager.enable_caching and manager.uses_block_hashes is False
    assert manager.prefix_eviction == "lru"  # exact LRU by default (contiguous is opt-in)
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    old = build_kv_cache_manager(make_config(32), **manager_kwargs())
    assert type(old) is TagmaKVCacheManager and getattr(old, "uses_block_hashes", True)


@pytest.mark.parametrize("eviction", ["lru", "contiguous"])
@pytest.mark.parametrize("seed,chunk", [(0, None), (1, 5), (2, None), (3, 3)])
def test_hits_and_outcomes_equal_vllm_without_eviction_pressure(
    eviction: str, seed: int, chunk: int | None
) -> None:
    # the whole workload stays cached
    twin = Twin(num_blocks=2048, flavour=PREFIX_INDEX, prefix_eviction=eviction)
    run_workload(twin, seed, num_requests=40, max_running=6, chunk=chunk)
    assert sum(p for p, _ in twin.hits) > 0, "the workload had no prefix hit to compare"


@pytest.mark.parametrize("eviction", ["lru", "contiguous"])
@pytest.mark.parametrize("seed", [0, 1])
def test_preemption_and_resume_under_pressure_keep_the_invariants(eviction: str, seed: int) -> None:
    twin = Twin(num_blocks=40, flavour=PREFIX_INDEX, prefix_eviction=eviction)
    twin.exact_hits = False  # the engine picks eviction victims
    run_workload(twin, seed, num_requests=30, max_running=8)
    assert all(len(twin.tagma.get_block_ids(r)[0]) == 0 for r in twin.requests)
    assert twin.tagma.block_pool.get_num_free_blocks() == 39
    assert twin.tagma.usage == 0.0


def test_a_fully_cached_prompt_hits_all_but_its_last_block_as_vllm() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    tokens = list(range(1, 4 * BLOCK + 1))  # exactly 4 full blocks: the last token is recomputed
    twin.add("a", tokens)
    assert twin.schedule("a", first=True)
    twin.free("a")
    twin.add("b", tokens)
    assert twin.schedule("b", first=True)
    assert twin.hits[-1] == (3 * BLOCK, 3 * BLOCK)
    twin.add("c", tokens + [7])  # one more token: the 4th block is a hit too
    assert twin.schedule("c", first=True)
    assert twin.hits[-1] == (4 * BLOCK, 4 * BLOCK)


# An EAGLE drafter (use_eagle; vLLM 0.32 passes num_prefill_lookahead 1 with it): every hit loses its last
# block, whose hidden states the drafter must see recomputed.
EAGLE = {"use_eagle": True, "num_prefill_lookahead": 1}


def test_an_eagle_drafter_s_hits_drop_their_last_block_as_vllm() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX, **EAGLE)
    assert twin.tagma.use_eagle
    tokens = list(range(1, 4 * BLOCK + 1))
    twin.add("a", tokens)
    assert twin.schedule("a", first=True)
    twin.free("a")
    twin.add("b", tokens)  # 3 full blocks before the last token, less the EAGLE block
    assert twin.schedule("b", first=True)
    assert twin.hits[-1] == (2 * BLOCK, 2 * BLOCK)
    twin.add("c", tokens[: BLOCK + 1])  # one cached block: dropped, no hit
    assert twin.schedule("c", first=True)
    assert twin.hits[-1] == (0, 0)


@pytest.mark.parametrize("seed,chunk", [(0, None), (1, 5)])
def test_eagle_hits_and_outcomes_equal_vllm(seed: int, chunk: int | None) -> None:
    twin = Twin(num_blocks=2048, flavour=PREFIX_INDEX, **EAGLE)
    run_workload(twin, seed, num_requests=40, max_running=6, chunk=chunk)
    assert sum(p for p, _ in twin.hits) > 0, "the workload had no prefix hit to compare"


def test_decode_filled_blocks_are_cached_as_vllm_caches_them() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    prompt = list(range(1, BLOCK + 3))
    twin.add("a", prompt)
    assert twin.schedule("a", first=True)
    out = [900 + i for i in range(2 * BLOCK)]
    for tok in out:
        for _, r in twin.pairs("a"):
            r.append_output_token_ids(tok)
        assert twin.schedule("a", first=False)
    assert twin.tagma.estimate_cached_tokens(twin.requests["a"][1]) == 3 * BLOCK
    twin.free("a")
    twin.add("b", prompt + out + [1])
    assert twin.schedule("b", first=True)
    assert twin.hits[-1][1] == 3 * BLOCK  # prompt and output blocks: all full blocks of the sequence


def test_reset_prefix_cache_fails_while_blocks_are_in_use_and_stats_record_it() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    twin.add("a", list(range(1, 3 * BLOCK + 2)))
    assert twin.schedule("a", first=True)
    assert twin.paged.reset_prefix_cache() is False
    assert twin.tagma.reset_prefix_cache() is False
    twin.free("a")
    assert twin.paged.reset_prefix_cache() is True
    assert twin.tagma.reset_prefix_cache() is True
    twin.check()
    assert twin.tagma.prefix_stats()["indexed_blocks"] == 0
    twin.add("b", list(range(1, 3 * BLOCK + 2)))
    assert twin.schedule("b", first=True)
    assert twin.hits[-1] == (0, 0)
    a, b = twin.paged.make_prefix_cache_stats(), twin.tagma.make_prefix_cache_stats()
    assert a == b and b.reset


def test_preempted_request_stats_have_vllm_s_meaning() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    twin.add("a", list(range(1, 3 * BLOCK + 2)))
    assert twin.schedule("a", first=True)
    twin.free("a", preempt=True)
    assert twin.schedule("a", first=True)  # resumed: its own blocks are now hits
    assert twin.hits[-1] == (3 * BLOCK, 3 * BLOCK)
    a, b = twin.paged.make_prefix_cache_stats(), twin.tagma.make_prefix_cache_stats()
    assert a == b and b.preempted_requests == 1 and b.preempted_hits == 3 * BLOCK


def test_requests_with_different_cache_salt_or_lora_never_share_a_block() -> None:
    manager = build_kv_cache_manager(make_config(256), **manager_kwargs())
    tokens = list(range(1, 6 * BLOCK + 2))
    lora1 = LoRARequest("one", 1, "/adapters/one")
    lora1_moved = LoRARequest("one", 1, "/adapters/one-v2")
    keys: list[tuple[str | None, LoRARequest | None]] = [
        (None, None), ("tenant-a", None), ("tenant-b", None), (None, lora1), (None, lora1_moved),
        ("tenant-a", lora1),
    ]
    ids_of: dict[int, set[int]] = {}
    for round_ in range(2):
        for k, (salt, lora) in enumerate(keys):
            req = tagma_request(f"r{round_}-{k}", tokens, cache_salt=salt, lora=lora)
            computed, hit, _ = manager.get_computed_blocks(req)
            assert hit == (6 * BLOCK if round_ else 0), (salt, lora)  # hits only within the same key
            assert manager.allocate_slots(req, req.num_tokens - hit, hit, computed) is not None
            (ids,) = manager.get_block_ids(req.request_id)
            if round_:
                assert set(ids[:6]) == ids_of[k]  # the hit is this key's own cached blocks
            else:  # the 6 full blocks are cached; the 7th (partial) is freed and may serve any key
                ids_of[k] = set(ids[:6])
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = req.num_tokens
            manager.free(req)
    for a in ids_of:
        for b in ids_of:
            if a != b:
                assert not ids_of[a] & ids_of[b], f"keys {keys[a]} and {keys[b]} shared a block"
    check_prefix_state(manager)


def test_usage_and_stats_equal_vllm_while_requests_share_hits() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    shared = list(range(1, 4 * BLOCK + 1))
    for k in range(3):
        twin.add(f"s{k}", shared + [500 + k] * 3)
        assert twin.schedule(f"s{k}", first=True)  # the followers share the leader's 4 blocks in use
    assert [h for h, _ in twin.hits] == [0, 4 * BLOCK, 4 * BLOCK]
    twin.free("s0")  # still used by s1, s2: nothing becomes free but s0's own block
    twin.free("s1")
    twin.free("s2")
    twin.check_stats()


def test_refusals() -> None:
    config = make_config(32)
    with pytest.raises(TagmaUnsupported, match="KV cache events"):
        build_kv_cache_manager(config, **manager_kwargs(enable_kv_cache_events=True))
    with pytest.raises(TagmaUnsupported, match="hash_block_size"):
        build_kv_cache_manager(config, **manager_kwargs(hash_block_size=2))
    with pytest.raises(ValueError, match="unknown eviction mode"):
        build_kv_cache_manager(config, prefix_eviction="mru", **manager_kwargs())
    manager = build_kv_cache_manager(config, **manager_kwargs())
    req = tagma_request("e", list(range(1, 20)))
    req.prompt_embeds = np.zeros((19, 4), dtype=np.float32)  # type: ignore[assignment]
    with pytest.raises(TagmaUnsupported, match="prompt embeddings"):
        manager.get_computed_blocks(req)


def test_decode_steps_without_a_new_full_block_make_no_engine_call() -> None:
    manager = build_kv_cache_manager(make_config(64), **manager_kwargs())
    req = tagma_request("a", list(range(1, 2 * BLOCK + 2)))
    computed, hit, _ = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, req.num_tokens, hit, computed) is not None
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = req.num_tokens
    manager._flush()
    calls: list[str] = []

    class Spy:
        def __init__(self, index: Any) -> None:
            self._index = index

        def __getattr__(self, name: str) -> Any:
            attr = getattr(self._index, name)
            return (lambda *a, **k: calls.append(name) or attr(*a, **k)) if callable(attr) else attr

    manager.index = Spy(manager.index)  # type: ignore[assignment]
    for name in ("_f_stats", "_f_release", "_f_create"):
        fn = getattr(manager, name)
        setattr(manager, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    for tok in range(BLOCK - 2):  # fills the third block up to its last slot
        req.append_output_token_ids(tok)
        assert manager.allocate_slots(req, 1) is manager.empty_kv_cache_blocks
        req.num_computed_tokens += 1
        assert not manager._p_reqs and not manager._p_insert  # nothing queued for the engine either
    assert calls == []
    req.append_output_token_ids(7)
    manager.allocate_slots(req, 1)  # the third block is full now: its insert is queued
    assert calls == [] and set(manager._p_insert) == {"a"}
    manager._flush()  # (the scheduler's read of new block ids does this once per step)
    assert calls == ["insert"]
    assert manager.estimate_cached_tokens(req) == 3 * BLOCK


def test_deferred_free_through_the_pool_keeps_vllm_s_free_count() -> None:
    twin = Twin(num_blocks=64, flavour=PREFIX_INDEX)
    shared = list(range(1, 4 * BLOCK + 1))
    for k in range(2):
        twin.add(f"d{k}", shared + [700 + k] * 3)
        assert twin.schedule(f"d{k}", first=True)
    for manager, req in twin.pairs("d0"):
        blocks = manager.pop_blocks_for_free(req)
        manager.block_pool.free_blocks(reversed(blocks))  # the scheduler's deferred free
    twin.check()  # d0's shared blocks stay in use by d1: only its own block became free
    twin.free("d1")
