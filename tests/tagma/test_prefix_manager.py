"""PrefixKVCacheManager (prefix caching on, the engine's prefix index) against vLLM's own KVCacheManager.

Both managers get the same scheduler-like operations on real vLLM ``Request``s: vLLM's requests carry its
sha256 block hasher, tagma's carry none (its engine core builds them without one). Outcomes must match:
hit lengths, allocation success and sizes, usage, free blocks, prefix-cache stats. With no eviction
pressure the hit lengths equal vLLM's exactly (same cold request sequence); under pressure the eviction
order is the engine's, so only invariants are checked there. After every step the engine's block state
is checked against the manager's counts.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import Request, RequestStatus

from tagma.contract import ENV_RANGE_MANAGER
from tagma.core.manager import TagmaKVCacheManager
from tagma.core.prefix_manager import HitBlocks, PrefixKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.errors import TagmaUnsupported
from tests.tagma.test_manager import BLOCK, make_config, make_request, manager_kwargs


def tagma_request(
    request_id: str, tokens: list[int], cache_salt: str | None = None, lora: LoRARequest | None = None
) -> Request:
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(tokens),
        sampling_params=params,
        pooling_params=None,
        block_hasher=None,  # as tagma's engine core builds them: no block hashes
        cache_salt=cache_salt,
        lora_request=lora,
    )


def check_state(manager: PrefixKVCacheManager) -> None:
    """The manager's counts and the engine agree; no vLLM block object is used."""
    pool = manager.block_pool
    engine = manager.engine
    req_refs, cache_refs = engine.block_state()
    assert all(b.ref_cnt == 0 and b.block_hash is None for b in pool.blocks)
    stats = engine.stats()
    assert pool.get_num_free_blocks() == stats.free_blocks + stats.cached_only_blocks
    assert pool.free_block_queue.num_free_blocks == pool.get_num_free_blocks()
    assert stats.used_blocks == int(np.count_nonzero(req_refs))
    live = set(pool._engine_reqs)
    assert stats.live_requests == len(live) and set(manager._held) == live
    for rid in live:
        (ids,) = manager.get_block_ids(rid)
        assert len(ids) == manager.num_blocks_held(rid) == engine.num_blocks_of(pool._engine_reqs[rid])
        assert all(req_refs[i] >= 1 for i in ids) and len(set(ids)) == len(ids)
    assert int(np.count_nonzero(cache_refs)) == manager.prefix_stats()["indexed_blocks"]


class Twin:
    """vLLM's manager and tagma's prefix manager driven by the same operations."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK, eviction: str = "contiguous", **kw: Any):
        config = make_config(num_blocks, block_size)
        kwargs = manager_kwargs(block_size, **kw)
        self.block_size = block_size
        self.paged = KVCacheManager(config, **kwargs)
        self.tagma = build_kv_cache_manager(config, prefix_eviction=eviction, **kwargs)
        assert isinstance(self.tagma, PrefixKVCacheManager)
        self.requests: dict[str, tuple[Request, Request]] = {}
        self.hits: list[tuple[int, int]] = []  # (paged, tagma) per admission
        self.exact_hits = True
        self.handed_out: dict[str, list[int]] = {}

    def add(self, rid: str, tokens: list[int]) -> None:
        self.requests[rid] = (make_request(rid, tokens, self.block_size), tagma_request(rid, tokens))

    def pairs(self, rid: str) -> list[tuple[Any, Request]]:
        p, t = self.requests[rid]
        return [(self.paged, p), (self.tagma, t)]

    def schedule(self, rid: str, first: bool, budget: int | None = None) -> bool:
        outcomes = []
        hits = []
        for manager, req in self.pairs(rid):
            hit, computed = 0, None
            if first:
                computed, hit, _ = manager.get_computed_blocks(req)
                if manager is self.tagma and hit:
                    assert isinstance(computed, HitBlocks) and len(computed) * self.block_size == hit
            hits.append(hit)
            num_new = req.num_tokens - req.num_computed_tokens - hit
            if budget is not None:
                num_new = min(num_new, budget)
            if first:
                new = manager.allocate_slots(req, num_new, hit, computed)
            else:
                new = manager.allocate_slots(req, num_new)
            if new is not None:
                if first:
                    manager.record_prefix_cache_stats(req, hit)
                    req.status = RequestStatus.RUNNING
                req.num_computed_tokens += hit + num_new
                outcomes.append(len(new.get_block_ids()[0]))
                if manager is self.tagma:
                    self._check_handed_out(rid, new.get_block_ids()[0])
            else:
                outcomes.append(None)
        if first:
            self.hits.append((hits[0], hits[1]))
        if self.exact_hits:
            assert hits[0] == hits[1], f"{rid}: hit paged {hits[0]} != tagma {hits[1]}"
            assert outcomes[0] == outcomes[1], f"{rid}: paged {outcomes[0]} != tagma {outcomes[1]}"
            self.check()
        else:
            check_state(self.tagma)
        return outcomes[1] is not None if not self.exact_hits else outcomes[0] is not None

    def _check_handed_out(self, rid: str, new_ids: list[int]) -> None:
        (ids,) = self.tagma.get_block_ids(rid)
        seen = self.handed_out.setdefault(rid, [])
        assert ids[: len(seen)] == seen, "a block id given to a running request changed"
        assert all(0 < i < self.tagma.block_pool.num_gpu_blocks for i in ids)
        assert not new_ids or ids[len(ids) - len(new_ids) :] == new_ids
        seen[:] = ids

    def free(self, rid: str, preempt: bool = False) -> None:
        for manager, req in self.pairs(rid):
            manager.free(req)
            if preempt:
                req.status = RequestStatus.PREEMPTED
                req.num_computed_tokens = 0
                req.num_preemptions += 1
        self.handed_out.pop(rid, None)
        if self.exact_hits:
            self.check()

    def check(self) -> None:
        p, t = self.paged, self.tagma
        assert p.usage == t.usage
        assert p.block_pool.get_num_free_blocks() == t.block_pool.get_num_free_blocks()
        check_state(t)

    def check_stats(self) -> None:
        a, b = self.paged.make_prefix_cache_stats(), self.tagma.make_prefix_cache_stats()
        if self.exact_hits:
            assert a == b
        else:
            assert a.requests == b.requests and a.queries == b.queries


def run_workload(
    twin: Twin, seed: int, num_requests: int, max_running: int, chunk: int | None = None
) -> None:
    """Shared prefixes, partial-block prompts, FIFO admission, chunked prefill, decode (outputs fill
    blocks), preemption of the last admitted request when allocation fails, resume, finish."""
    rng = random.Random(seed)
    bs = twin.block_size
    prefixes = [[rng.randrange(50_000) for _ in range(bs * rng.randint(1, 6))] for _ in range(4)]
    waiting: list[str] = []
    out_len: dict[str, int] = {}
    generated: dict[str, int] = {}
    for i in range(num_requests):
        prefix = rng.choice(prefixes)
        suffix = [rng.randrange(50_000) for _ in range(rng.randint(1, 3 * bs))]
        rid = f"r{i}"
        twin.add(rid, prefix[: rng.randint(0, len(prefix))] + suffix)
        waiting.append(rid)
        out_len[rid] = rng.randint(1, 6 * bs)
        generated[rid] = 0
    running: list[str] = []
    step = 0
    while waiting or running:
        step += 1
        twin.paged.new_step_starts()
        twin.tagma.new_step_starts()
        for rid in list(running):
            if rid not in running:
                continue
            req = twin.requests[rid][1]
            if req.num_computed_tokens >= req.num_tokens:
                if generated[rid] >= out_len[rid]:
                    running.remove(rid)
                    twin.free(rid)
                    continue
                token = rng.randrange(50_000)
                for _, r in twin.pairs(rid):
                    r.append_output_token_ids(token)
                generated[rid] += 1
            while not twin.schedule(rid, first=False, budget=chunk):
                victim = running.pop()
                twin.free(victim, preempt=True)
                waiting.insert(0, victim)
                if victim == rid:
                    break
        while waiting and len(running) < max_running:
            rid = waiting[0]
            if not twin.schedule(rid, first=True, budget=chunk):
                break
            waiting.pop(0)
            running.append(rid)
        if step % 7 == 0:
            twin.check_stats()
    twin.check_stats()


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_eviction_keeps_vllm_s_hits_under_pressure(seed: int) -> None:
    twin = Twin(num_blocks=40, eviction="lru")  # exact LRU: vLLM's eviction order, so vLLM's hits
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
    twin = Twin(num_blocks=2048, eviction=eviction)  # the whole workload stays cached
    run_workload(twin, seed, num_requests=40, max_running=6, chunk=chunk)
    assert sum(p for p, _ in twin.hits) > 0, "the workload had no prefix hit to compare"


@pytest.mark.parametrize("eviction", ["lru", "contiguous"])
@pytest.mark.parametrize("seed", [0, 1])
def test_preemption_and_resume_under_pressure_keep_the_invariants(eviction: str, seed: int) -> None:
    twin = Twin(num_blocks=40, eviction=eviction)
    twin.exact_hits = False  # the engine picks eviction victims
    run_workload(twin, seed, num_requests=30, max_running=8)
    assert all(len(twin.tagma.get_block_ids(r)[0]) == 0 for r in twin.requests)
    assert twin.tagma.block_pool.get_num_free_blocks() == 39
    assert twin.tagma.usage == 0.0


def test_a_fully_cached_prompt_hits_all_but_its_last_block_as_vllm() -> None:
    twin = Twin(num_blocks=64)
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


def test_decode_filled_blocks_are_cached_as_vllm_caches_them() -> None:
    twin = Twin(num_blocks=64)
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
    twin = Twin(num_blocks=64)
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
    twin = Twin(num_blocks=64)
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
    check_state(manager)


def test_usage_and_stats_equal_vllm_while_requests_share_hits() -> None:
    twin = Twin(num_blocks=64)
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
    twin = Twin(num_blocks=64)
    shared = list(range(1, 4 * BLOCK + 1))
    for k in range(2):
        twin.add(f"d{k}", shared + [700 + k] * 3)
        assert twin.schedule(f"d{k}", first=True)
    for manager, req in twin.pairs("d0"):
        blocks = manager.pop_blocks_for_free(req)
        manager.block_pool.free_blocks(reversed(blocks))  # the scheduler's deferred free
    twin.check()  # d0's shared blocks stay in use by d1: only its own block became free
    twin.free("d1")
