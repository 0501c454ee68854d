"""One driver for vLLM's own KVCacheManager and a tagma manager in lockstep, through real vLLM ``Request``s.

A ``Twin`` holds a stock (paged) manager and a tagma manager built by ``build_kv_cache_manager`` from the
same ``KVCacheConfig`` and arguments, and applies every scheduler-like operation to both. What differs
between the tagma managers under test is a ``Flavour``:

* ``BLOCK_HASHES``: the block-object and range managers (tests/tagma/test_manager_*.py,
  test_range_manager.py). tagma's requests carry vLLM's block hasher as vLLM's do, the placement policy is
  the option, the sets of cached hashes are compared and vLLM's block objects are checked against the
  engine;
* ``PREFIX_INDEX``: the prefix-index manager (test_prefix_manager.py). tagma's requests carry no block
  hasher (its engine core builds them without one), the prefix eviction mode is the option, hits are
  ``HitBlocks`` of one block per hit block and the engine is checked against the manager's counts alone.

With ``exact_hits`` (the default) hit lengths, allocation outcomes, usage, free blocks and prefix-cache
stats must equal vLLM's after every step; without it (eviction pressure: the engine picks the victims)
only tagma's invariants are checked and the scheduler follows tagma's outcomes.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from vllm.v1.request import Request, RequestStatus

from tagma.core.manager import TagmaKVCacheManager
from tagma.core.prefix_manager import HitBlocks, PrefixKVCacheManager
from tagma.core.range_manager import RangeKVCacheManager
from tagma.core.registry import PREFIX_INDEX as PREFIX_INDEX_KEY
from tagma.core.registry import build_kv_cache_manager, spec_manager_map

init_none_hash(sha256)

BLOCK = 4  # tokens per block: small, so short token lists exercise many blocks


def use_block_object_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caching on builds the block-object manager (vLLM's hashes, what TAGMA_RANGE_MANAGER=0 keeps) instead
    of the prefix-index manager, the default tested in test_prefix_manager.py."""
    monkeypatch.setitem(spec_manager_map[FullAttentionSpec], PREFIX_INDEX_KEY, TagmaKVCacheManager)


# ------------------------------------------------------------------------------ configs and requests


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
    """A request as vLLM's engine core builds it: with its sha256 block hasher."""
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(tokens),
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


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


# ------------------------------------------------------------------------------------------ checks


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


def check_prefix_state(manager: PrefixKVCacheManager) -> None:
    """The prefix manager's counts and the engine agree; no vLLM block object is used."""
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


def assert_no_leak(manager: TagmaKVCacheManager) -> None:
    stats = manager.engine.stats()
    assert stats.used_blocks == 0
    assert stats.live_requests == 0
    assert stats.free_blocks + stats.cached_only_blocks == stats.usable_blocks
    assert all(b.ref_cnt == 0 for b in manager.block_pool.blocks)
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_gpu_blocks - 1
    assert not manager.block_pool._engine_reqs and not manager.block_pool._deferred


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


# --------------------------------------------------------------------------------------------- twin


@dataclass(frozen=True)
class Flavour:
    """What differs between the tagma managers a Twin drives."""

    tagma_request: Callable[[str, list[int], int], Request]  # (request id, tokens, block size)
    options: dict[str, Any] = field(default_factory=dict)  # tagma-only build options, defaults
    state_check: Callable[[Any], None] = check_tagma_state
    compare_cached_hashes: bool = True  # the sets of cached hashes (vLLM's block objects) are compared
    hit_blocks: bool = False  # tagma's computed blocks are HitBlocks, one per hit block
    manager_type: type | None = None  # what build_kv_cache_manager must return


BLOCK_HASHES = Flavour(tagma_request=make_request, options={"placement_policy": "headroom"})
PREFIX_INDEX = Flavour(
    tagma_request=lambda rid, tokens, _block_size: tagma_request(rid, tokens),
    options={"prefix_eviction": "contiguous"},
    state_check=check_prefix_state,
    compare_cached_hashes=False,
    hit_blocks=True,
    manager_type=PrefixKVCacheManager,
)
TAGMA_ONLY_OPTIONS = ("placement_policy", "prefix_eviction")


class Twin:
    """A paged and a tagma manager driven by the same scheduler-like operations; outcomes compared.

    ``overrides`` are vLLM's manager arguments (``manager_kwargs``), given to both; ``placement_policy`` and
    ``prefix_eviction`` go to tagma's alone, over the flavour's defaults."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = BLOCK,
        flavour: Flavour = BLOCK_HASHES,
        *,
        exact_hits: bool = True,
        full_sequence_must_fit: bool = False,
        **overrides: Any,
    ) -> None:
        options = dict(flavour.options)
        options.update({k: overrides.pop(k) for k in TAGMA_ONLY_OPTIONS if k in overrides})
        config = make_config(num_blocks, block_size)
        kwargs = manager_kwargs(block_size, **overrides)
        self.flavour = flavour
        self.block_size = block_size
        self.paged = KVCacheManager(config, **kwargs)
        self.tagma = build_kv_cache_manager(config, **options, **kwargs)
        if flavour.manager_type is not None:
            assert isinstance(self.tagma, flavour.manager_type)
        self.requests: dict[str, tuple[Request, Request]] = {}
        self.handed_out: dict[str, list[int]] = {}  # tagma block ids given to each running request
        self.hits: list[tuple[int, int]] = []  # (paged, tagma) per admission
        self.exact_hits = exact_hits  # off: the engine picks eviction victims, only invariants are checked
        self.full_sequence_must_fit = full_sequence_must_fit

    @property
    def paged_hits(self) -> list[int]:
        return [p for p, _ in self.hits]

    def add(self, request_id: str, tokens: list[int]) -> None:
        self.requests[request_id] = (
            make_request(request_id, tokens, self.block_size),
            self.flavour.tagma_request(request_id, tokens, self.block_size),
        )

    def pairs(self, request_id: str) -> list[tuple[Any, Request]]:
        p, t = self.requests[request_id]
        return [(self.paged, p), (self.tagma, t)]

    def lead(self, request_id: str) -> Request:
        """The request the scheduler follows: tagma's (with exact hits both sides agree)."""
        return self.requests[request_id][1]

    def schedule(self, request_id: str, first: bool, budget: int | None = None) -> bool:
        """Schedule the request's next tokens (at most ``budget``: chunked prefill), as the scheduler does."""
        outcomes: list[int | None] = []
        hits: list[int] = []
        for manager, req in self.pairs(request_id):
            hit = 0
            computed = None
            if first:
                computed, hit, _ = manager.get_computed_blocks(req)
                if self.flavour.hit_blocks and manager is self.tagma and hit:
                    assert isinstance(computed, HitBlocks) and len(computed) * self.block_size == hit
            hits.append(hit)
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
                outcomes.append(len(new.get_block_ids()[0]))
                if manager is self.tagma:
                    self._check_handed_out(request_id, new.get_block_ids()[0])
            else:
                outcomes.append(None)
        if first:
            self.hits.append((hits[0], hits[1]))
        if not self.exact_hits:
            self.flavour.state_check(self.tagma)
            return outcomes[1] is not None
        assert hits[0] == hits[1], f"{request_id}: hit paged {hits[0]} != tagma {hits[1]}"
        assert outcomes[0] == outcomes[1], f"{request_id}: paged {outcomes[0]} != tagma {outcomes[1]}"
        self.check()
        return outcomes[0] is not None

    def _check_handed_out(self, request_id: str, new_ids: list[int]) -> None:
        (ids,) = self.tagma.get_block_ids(request_id)
        seen = self.handed_out.setdefault(request_id, [])
        assert ids[: len(seen)] == seen, "a block id given to a running request changed"
        assert all(0 < i < self.tagma.block_pool.num_gpu_blocks for i in ids)
        assert not new_ids or ids[len(ids) - len(new_ids) :] == new_ids
        seen[:] = ids

    def admit(self, request_id: str, budget: int | None = None) -> bool:
        return self.schedule(request_id, first=True, budget=budget)

    def decode(self, request_id: str, token: int) -> bool:
        """Append a sampled token and give it a slot (one decode step)."""
        for _, req in self.pairs(request_id):
            req.append_output_token_ids(token)
        return self.schedule(request_id, first=False)

    def free(self, request_id: str, preempt: bool = False) -> None:
        for manager, req in self.pairs(request_id):
            manager.free(req)
            if preempt:
                req.status = RequestStatus.PREEMPTED
                req.num_computed_tokens = 0
                req.num_preemptions += 1
        self.handed_out.pop(request_id, None)
        if self.exact_hits:
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
        if self.flavour.compare_cached_hashes:
            assert cached_hashes(p) == cached_hashes(t)
        self.flavour.state_check(t)

    def check_stats(self) -> None:
        a, b = self.paged.make_prefix_cache_stats(), self.tagma.make_prefix_cache_stats()
        if self.exact_hits:
            assert a == b
        else:
            assert a.requests == b.requests and a.queries == b.queries

    def events(self) -> tuple[list[Any], list[Any]]:
        return self.paged.take_events(), self.tagma.take_events()


def run_workload(
    twin: Twin, seed: int, num_requests: int, max_running: int, reset_every: int = 0, chunk: int | None = None
) -> None:
    """A seeded scheduler-like run: shared prefixes, partial-block prompts, FIFO admission, chunked prefill
    (at most ``chunk`` tokens a step), decode (outputs fill blocks), preemption of the last admitted request
    when allocation fails, resume, finish; the prefix cache reset every ``reset_every`` steps."""
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
            req = twin.lead(rid)
            if req.num_computed_tokens >= req.num_tokens:  # prefilled: decode
                if generated[rid] >= out_len[rid]:
                    running.remove(rid)
                    twin.free(rid)
                    continue
                token = rng.randrange(50_000)
                for _, r in twin.pairs(rid):
                    r.append_output_token_ids(token)
                generated[rid] += 1
            while not twin.schedule(rid, first=False, budget=chunk):
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
