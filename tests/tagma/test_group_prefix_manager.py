"""GroupPrefixKVCacheManager (prefix caching on over full-attention and sliding-window groups, and over
sliding-window groups alone: content-keyed).

Two checks:

* against vLLM's own KVCacheManager (its HybridKVCacheCoordinator, sha256 block hashes) in lockstep, where
  nothing is evicted: the same hit lengths and shared-prefix boundaries (the window's right-to-left rule and
  vLLM's sparse retention of window blocks), the same admissions, the same blocks per group with null blocks
  where a window skips, the same free count;
* under eviction and preemption, where vLLM and tagma may keep different cached blocks (vLLM's free queue
  hands out cached blocks before never-used ones; the engine evicts only when no block is free), against an
  oracle of what each physical block holds: every hit block of every group holds the KV of exactly the tokens
  and group it is attached for, and nothing leaks after the drain.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec
from vllm.v1.request import Request, RequestStatus

from tagma.core.group_prefix_manager import GroupHitBlocks, GroupPrefixKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.core.state_checkpoints import CACHES_MODE_NONE, REMARKS_PROMPT_TAIL
from tagma.engine.prefix_keyed import PrefixKeyedGroups
from tests.tagma.test_group_range_manager import GroupTwin, chunked, full, state, window
from tests.tagma.twin import BLOCK, make_config, make_request, manager_kwargs, tagma_request


def aligned_state() -> MambaSpec:
    """A state group (GDN layers) in vLLM's cache mode "align": state checkpoints at block boundaries."""
    return MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")


LAYOUTS: dict[str, list[KVCacheSpec]] = {
    "gpt-oss": [window(8), full()],
    "gemma3": [window(9), window(9), window(9), full()],
    "two-windows": [window(8), full(), window(17)],  # two window specs: vLLM's fixed point iterates
    # chunked local attention beside full attention (Llama 4), a chunk of 3 blocks, and a chunk of 10 tokens
    # (no whole number of blocks: vLLM pads the hit with null blocks up to the block its chunk starts in)
    "llama4": [chunked(3 * BLOCK), full()],
    "chunk-10": [chunked(10), full()],
    "chunked-window": [chunked(3 * BLOCK), full(), window(17)],  # three specs: the fixed point iterates
    # every layer slides (no full group: content keys): one group (vLLM's unitary coordinator), two specs
    "mistral": [window(8)],
    "windows-only": [window(8), window(17)],
    # state groups beside full attention (Qwen3-Next), several of them, and beside a window (three specs)
    "qwen3-next": [aligned_state(), full()],
    "states-3": [aligned_state(), aligned_state(), full(), aligned_state()],
    "state-window": [aligned_state(), full(), window(8)],
    # a state group in mode "none" with caching on (vLLM's manager takes it, its servers pick "align"): the
    # window arithmetic of a window of 2, the same hit rule, caching and same-step deferral
    "state-none": [state(BLOCK), full()],
}
STATE_LAYOUTS = ("qwen3-next", "states-3", "state-window")  # mode align


def aligned_split(req: Request, hit: int, num_new: int, budget: int) -> int:
    """vLLM's scheduler in mamba cache mode "align" (``_mamba_block_aligned_split``, hash block = block, no
    EAGLE): a prefill chunk ends on a block boundary (a chunk that starts inside a block at the next one),
    never past the last cacheable boundary, and at a shared-prefix junction's block floor."""
    start = req.num_computed_tokens + hit
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    if start >= prefill_end:
        return num_new
    end = start + num_new
    if end < prefill_end:
        aligned = end // BLOCK * BLOCK
        if aligned > start or budget >= BLOCK:
            end = aligned
    junction = req.shared_prefix_boundary
    stops = (
        (start // BLOCK + 1) * BLOCK if start % BLOCK else 0,
        (req.num_tokens - 1) // BLOCK * BLOCK,
        start + (junction - start) // BLOCK * BLOCK if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def _prompts(rng: random.Random, count: int) -> list[list[int]]:
    """Prompts over a few shared prefixes (0-12 blocks), with suffixes, exact resends and extensions."""
    prefixes = [[rng.randrange(50_000) for _ in range(rng.randint(0, 12 * BLOCK))] for _ in range(3)]
    prompts: list[list[int]] = []
    for _ in range(count):
        kind = rng.random()
        if prompts and kind < 0.2:
            prompts.append(list(rng.choice(prompts)))  # an exact resend
        elif prompts and kind < 0.35:
            base = rng.choice(prompts)
            prompts.append(base + [rng.randrange(50_000) for _ in range(rng.randint(1, 3 * BLOCK))])
        else:
            suffix = [rng.randrange(50_000) for _ in range(rng.randint(1, 6 * BLOCK))]
            prompts.append(rng.choice(prefixes) + suffix)
    return prompts


class PrefixGroupTwin(GroupTwin):
    """vLLM's manager and tagma's, caching on, driven by the same scheduler-like calls (frees as the
    caching-off twin's)."""

    def __init__(
        self,
        specs: list[KVCacheSpec],
        num_blocks: int,
        retention: int | None = 0,
        eagle_group: int | None = None,
        **overrides: Any,
    ) -> None:
        """``retention``: vLLM's prefix_cache_retention_interval (the server's default 0: a window caches only
        the tails before replay boundaries and shared-prefix junctions; None: every full block).
        ``eagle_group``: the group an EAGLE drafter's layer is in, marked as vLLM's grouping marks it."""
        config = make_config(num_blocks, specs=specs)
        config.prefix_cache_retention_interval = retention
        if eagle_group is not None:
            config.kv_cache_groups[eagle_group].is_eagle_group = True
        lcm = math.lcm(*(spec.block_size for spec in specs))
        kwargs = manager_kwargs(enable_caching=True, scheduler_block_size=lcm, **overrides)
        self.paged = KVCacheManager(config, **kwargs)
        self.tagma = build_kv_cache_manager(config, **kwargs)
        assert type(self.tagma) is GroupPrefixKVCacheManager
        self.requests: dict[str, tuple[Request, Request]] = {}
        self.hits: list[int] = []
        self.boundaries: list[int] = []
        # the scheduler's aligned chunks (mode align)
        self.align = any(isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align" for spec in specs)
        self.deferred = 0  # admissions vLLM deferred: a hit on a state cached in the same step

    def new_step(self) -> None:
        self.paged.new_step_starts()
        self.tagma.new_step_starts()

    def add(self, rid: str, tokens: list[int]) -> None:
        self.requests[rid] = (make_request(rid, tokens), tagma_request(rid, tokens))

    def schedule(  # type: ignore[override]
        self, rid: str, budget: int, waiting: bool, in_flight: int = 0
    ) -> bool:
        outcomes: list[Any] = []
        for manager, req in self.pairs(rid):
            hit_blocks, hit, boundary = None, 0, 0
            if waiting:
                hit_blocks, hit, boundary = manager.get_computed_blocks(req)
                req.shared_prefix_boundary = boundary
            else:
                req.num_in_flight_tokens = min(in_flight, req.num_computed_tokens)
            num_new = min(req.num_tokens - req.num_computed_tokens - hit, budget)
            if self.align:
                num_new = aligned_split(req, hit, num_new, budget)
            new = manager.allocate_slots(
                req, num_new, hit, hit_blocks if hit else None, full_sequence_must_fit=waiting
            )
            if new is None:
                outcomes.append((hit, boundary, None))
                continue
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens += hit + num_new
            outcomes.append((hit, boundary, tuple(len(ids) for ids in new.get_block_ids())))
        assert outcomes[0] == outcomes[1], f"{rid}: paged {outcomes[0]} != tagma {outcomes[1]}"
        if waiting and outcomes[0][2] is None and outcomes[0][0]:
            self.deferred += 1  # the lockstep's pool never fills: a hit refused is a deferred one
        if waiting:
            self.hits.append(outcomes[0][0])
            self.boundaries.append(outcomes[0][1])
        self.check()
        return outcomes[0][2] is not None

    def decode(self, rid: str, token: int, in_flight: int = 0) -> bool:
        for _, req in self.pairs(rid):
            req.append_output_token_ids(token)
        return self.schedule(rid, 1, False, in_flight)

    def check(self) -> None:
        p, t = self.paged, self.tagma
        assert p.block_pool.get_num_free_blocks() == t.block_pool.get_num_free_blocks()
        assert p.usage == t.usage
        live: set[int] = set()
        for rid in self.requests:
            paged_groups = [m.req_to_blocks.get(rid, []) for m in p.coordinator.single_type_managers]
            tagma_ids = t.get_block_ids(rid)
            for g, blocks in enumerate(paged_groups):
                ids = tagma_ids[g]
                assert len(ids) == len(blocks), f"{rid} group {g}: logical blocks differ"
                assert [i == 0 for i in ids] == [b.is_null for b in blocks], f"{rid} group {g}: null blocks"
                live.update(i for i in ids if i)
        stats = t.engine.stats()
        assert stats.used_blocks == len(live)
        assert stats.free_blocks + stats.cached_only_blocks == t.block_pool.get_num_free_blocks()
        assert all(b.ref_cnt == 0 for b in t.block_pool.blocks), "the group manager touched a KVCacheBlock"


def run_lockstep(twin: PrefixGroupTwin, seed: int, num_requests: int, chunk: int) -> None:
    rng = random.Random(seed)
    for i, tokens in enumerate(_prompts(rng, num_requests)):
        twin.add(f"r{i}", tokens)
    waiting = list(twin.requests)
    out_len = {rid: rng.randint(1, 6 * BLOCK) for rid in waiting}
    running: list[str] = []
    steps = 0
    while waiting or running:
        steps += 1
        assert steps < 20_000, "the workload does not finish"
        twin.new_step()
        for rid in list(running):
            req = twin.requests[rid][1]
            if req.num_computed_tokens < req.num_tokens:
                assert twin.schedule(rid, rng.choice((chunk, 1 << 20)), False, rng.choice((0, 0, 1)))
            else:
                assert twin.decode(rid, rng.randrange(50_000), rng.choice((0, 0, 1)))
            if req.num_output_tokens >= out_len[rid]:
                running.remove(rid)
                twin.free(rid, deferred=rng.random() < 0.5)
        while waiting and len(running) < 3:
            rid = waiting[0]
            if not twin.schedule(rid, rng.choice((chunk, 1 << 20)), True):
                break
            running.append(waiting.pop(0))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("seed", "chunk"), [(0, 1 << 20), (1, 7), (2, 3)])
def test_hits_admissions_and_blocks_match_vllm_without_eviction(layout: str, seed: int, chunk: int) -> None:
    """A pool no workload fills (nothing evicted): every decision equals vLLM's, step by step."""
    if layout == "state-none" and not CACHES_MODE_NONE:
        pytest.skip("this vLLM's manager asserts mode 'align' for state groups with caching (tagma refuses)")
    twin = PrefixGroupTwin(LAYOUTS[layout], num_blocks=4000)
    run_lockstep(twin, seed, num_requests=40, chunk=chunk)
    assert sum(twin.hits) > 0, "the workload is meant to hit"
    if layout in (*STATE_LAYOUTS, "state-none") and seed == 0:
        assert twin.deferred, "a hit on a state cached in the same step is meant to wait"
    lagging = [b > h for b, h in zip(twin.boundaries, twin.hits, strict=True)]
    if layout not in ("mistral", "windows-only", "llama4", "chunk-10"):  # chunked groups cache every block
        assert any(lagging), "a window is meant to lag the full group"
    stats = twin.tagma.engine.stats()
    assert stats.used_blocks == 0 and not twin.tagma._reqs


def test_a_waiting_request_s_content_keys_are_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer slides (content keys): the scheduler looks a waiting request up at every step it waits;
    its blocks are hashed at the first lookup only, the hit is the same each time, and nothing is kept once
    it is allocated or freed."""
    twin = PrefixGroupTwin(LAYOUTS["mistral"], num_blocks=4000)
    tagma = twin.tagma
    calls: list[int] = []
    keys = PrefixKeyedGroups.keys
    monkeypatch.setattr(PrefixKeyedGroups, "keys", lambda *a, **k: calls.append(1) or keys(*a, **k))
    prompt = list(range(10 * BLOCK))
    twin.add("a", prompt)
    assert twin.schedule("a", 1 << 20, True)  # cached, and its chain hashed as it caches
    twin.add("b", prompt + [7] * BLOCK)
    req = twin.requests["b"][1]
    calls.clear()
    hits = [tagma.get_computed_blocks(req)[1] for _ in range(3)]
    assert hits == [hits[0]] * 3 and hits[0] > 0 and len(calls) == 1
    assert "b" in tagma._lookup_memo
    # the twin's own lookup (the memo again), then allocation, which hashes only the block past the hit as
    # it caches it (from the hit's last key)
    assert twin.schedule("b", 1 << 20, True)
    assert len(calls) == 2 and "b" not in tagma._lookup_memo
    twin.add("c", prompt)
    tagma.get_computed_blocks(twin.requests["c"][1])
    twin.free("c")
    assert not tagma._lookup_memo


def test_a_hit_on_a_state_written_in_this_step_waits_a_step() -> None:
    """vLLM defers a hit on a state block cached in the same step (that step's forward writes it), and on
    0.32 in the step after too, while its producer, its cached tokens still at the prompt's last block
    boundary, holds the block (the partial-tail re-mark; 0.33 skips a block keyed there already). Both arms
    defer as often, then admit the same hit."""
    twin = PrefixGroupTwin(LAYOUTS["qwen3-next"], num_blocks=4000)
    prompt = list(range(1000, 1042))  # 42 tokens: the last cacheable boundary is 40 (block 9)
    twin.add("a", prompt)
    twin.add("b", prompt)
    twin.new_step()
    assert twin.schedule("a", 1 << 20, True)  # an aligned chunk: up to 40, block 9's state cached
    assert not twin.schedule("b", 1 << 20, True)
    twin.new_step()
    assert twin.schedule("a", 1 << 20, False)  # the prompt's tail: a's cached tokens stay at 40
    if REMARKS_PROMPT_TAIL:
        assert not twin.schedule("b", 1 << 20, True)
        twin.new_step()
        assert twin.decode("a", 7)  # past the boundary: a frees the state block of 40 (cached)
    assert twin.schedule("b", 1 << 20, True)
    assert twin.deferred == (2 if REMARKS_PROMPT_TAIL else 1) and set(twin.hits) == {0, 40}


@pytest.mark.parametrize("layout", ["gpt-oss", "state-window"])
@pytest.mark.parametrize("retention", [None, 8 * BLOCK])
def test_dense_and_periodic_retention_match_vllm(layout: str, retention: int | None) -> None:
    """prefix_cache_retention_interval None (every full window or state block cached) and a period of 8
    blocks (a tail per segment): vLLM's mask decides on both arms."""
    twin = PrefixGroupTwin(LAYOUTS[layout], num_blocks=4000, retention=retention)
    run_lockstep(twin, 5, num_requests=30, chunk=5)
    assert sum(twin.hits) > 0


# An EAGLE drafter with prefix caching on (use_eagle; vLLM 0.32 passes num_prefill_lookahead 1 with it): its
# groups drop a hit's last block (several groups: after looking one block past it), a window's run needs one
# block more, windows cache the block after each replay boundary's tail and the replay boundaries move back
# a block. vLLM marks no group for an EAGLE drafter (only MTP layers are marked), so every group drops; its
# layer takes the target's model-level sliding window (the Attention layer's fallback), so beside a
# Mistral-shaped target every layer slides and one window group holds them all (vLLM's unitary coordinator:
# no margin). Layouts: those two (the second with the full group), two window specs with no full group, and
# a marked group (MTP-style): a full group of its own beside the windows, the target's full group, or the
# window group.
EAGLE = {"use_eagle": True, "num_prefill_lookahead": 1}
EAGLE_LAYOUTS: dict[str, tuple[list[KVCacheSpec], int | None]] = {
    "mistral": ([window(13)], None),
    "gpt-oss": ([window(8), full(), window(8)], None),
    "windows-only": ([window(8), window(17)], None),
    "two-windows": ([window(8), full(), window(17)], None),
    "marked-own-full": ([window(13), window(13), full()], 2),
    "marked-target-full": ([window(8), full()], 1),
    # only the window group marked: the full group takes no drop, the window peeks past it; vLLM 0.33 also
    # keeps the window's tail a block below each shared-prefix junction
    "marked-window": ([full(), window(8)], 1),
}


@pytest.mark.parametrize("layout", sorted(EAGLE_LAYOUTS))
@pytest.mark.parametrize(("seed", "chunk"), [(0, 1 << 20), (1, 7), (2, 3)])
def test_eagle_hits_and_retention_match_vllm(layout: str, seed: int, chunk: int) -> None:
    """With an EAGLE drafter, every decision equals vLLM's step by step where nothing is evicted: hits
    with the last block dropped per group, boundaries, admissions, blocks per group and null blocks."""
    specs, eagle_group = EAGLE_LAYOUTS[layout]
    twin = PrefixGroupTwin(specs, num_blocks=4000, eagle_group=eagle_group, **EAGLE)
    expected = {eagle_group} if eagle_group is not None else set(range(len(specs)))
    assert twin.paged.coordinator.eagle_group_ids == expected
    run_lockstep(twin, seed, num_requests=40, chunk=chunk)
    assert sum(twin.hits) > 0, "the workload is meant to hit"
    assert twin.tagma.engine.stats().used_blocks == 0 and not twin.tagma._reqs


def test_dropping_no_eagle_block_fails_the_lockstep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a manager that ignores the drafter (no drop, no margin) disagrees with vLLM."""
    specs, eagle_group = EAGLE_LAYOUTS["marked-target-full"]
    twin = PrefixGroupTwin(specs, num_blocks=4000, eagle_group=eagle_group, **EAGLE)
    monkeypatch.setattr(twin.tagma, "_eagle_full", False)
    monkeypatch.setattr(twin.tagma, "_eagle_any", False)
    with pytest.raises(AssertionError, match="paged"):
        run_lockstep(twin, 0, num_requests=40, chunk=1 << 20)


# ---------------------------------------------------------------- eviction and preemption: the oracle


class Oracle:
    """What each physical block holds: (group, the tokens from position 0 to the block's end)."""

    def __init__(self, manager: GroupPrefixKVCacheManager) -> None:
        self.manager = manager
        self.content: dict[int, tuple[int, tuple[int, ...]]] = {}

    def written(self, req: Request, upto: int) -> None:
        """The request computed its tokens up to ``upto``: its full blocks hold them."""
        bs = BLOCK
        for g, ids in enumerate(self.manager.get_block_ids(req.request_id)):
            for i, block in enumerate(ids[: upto // bs]):
                if block:
                    self.content[block] = (g, tuple(req.all_token_ids[: (i + 1) * bs]))

    def check_hit(self, req: Request, hit_blocks: GroupHitBlocks, hit: int) -> None:
        for g, (dropped, ids) in enumerate(hit_blocks.groups):
            for i, block in enumerate(ids.tolist(), start=dropped):
                assert i < hit // BLOCK
                want = (g, tuple(req.all_token_ids[: (i + 1) * BLOCK]))
                assert self.content.get(block) == want, f"group {g} block {block} at {i} holds other KV"


# Pools for windows alone, which hold few blocks once running: small enough to preempt, large enough to
# admit the longest request whole (admission needs its full sequence; a smaller pool never admits it).
EVICTION_POOL = {"mistral": 20, "windows-only": 36, "states-3": 50}


@pytest.mark.parametrize("layout", sorted(set(LAYOUTS) - {"state-none"}))  # mode none: no state to check
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hits_under_eviction_and_preemption_hold_the_right_kv(layout: str, seed: int) -> None:
    specs = LAYOUTS[layout]
    config = make_config(EVICTION_POOL.get(layout, 18 * len(specs) + 8), specs=specs)
    config.prefix_cache_retention_interval = 0
    manager = build_kv_cache_manager(config, **manager_kwargs(enable_caching=True))
    assert isinstance(manager, GroupPrefixKVCacheManager)
    oracle = Oracle(manager)
    rng = random.Random(seed)
    reqs = {f"r{i}": tagma_request(f"r{i}", t) for i, t in enumerate(_prompts(rng, 60))}
    out_len = {rid: rng.randint(1, 8 * BLOCK) for rid in reqs}
    waiting = list(reqs)
    running: list[str] = []
    hits = preemptions = steps = 0
    align = layout in STATE_LAYOUTS

    def step(req: Request, waiting_req: bool) -> bool:
        nonlocal hits
        hit_blocks, hit = None, 0
        if waiting_req:
            hit_blocks, hit, boundary = manager.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            if hit:
                oracle.check_hit(req, hit_blocks, hit)
        budget = rng.choice((5, 1 << 20))
        num_new = min(req.num_tokens - req.num_computed_tokens - hit, budget)
        if align:  # state checkpoints: vLLM's scheduler cuts chunks at block boundaries
            num_new = aligned_split(req, hit, num_new, budget)
        if manager.allocate_slots(req, num_new, hit, hit_blocks, full_sequence_must_fit=waiting_req) is None:
            return False
        hits += hit
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens += hit + num_new
        oracle.written(req, req.num_computed_tokens)
        return True

    while waiting or running:
        steps += 1
        assert steps < 20_000
        manager.new_step_starts()
        for rid in list(running):
            if rid not in running:
                continue
            req = reqs[rid]
            while True:
                if req.num_computed_tokens == req.num_tokens:
                    req.append_output_token_ids(rng.randrange(50_000))
                if step(req, False):
                    break
                victim = running.pop()
                manager.free(reqs[victim])
                reqs[victim].status = RequestStatus.PREEMPTED
                reqs[victim].num_computed_tokens = 0
                waiting.insert(0, victim)
                preemptions += 1
                if victim == rid:
                    break
            if rid in running and req.num_output_tokens >= out_len[rid]:
                running.remove(rid)
                if rng.random() < 0.5:
                    manager.free(req)
                else:
                    manager.block_pool.free_blocks(reversed(manager.pop_blocks_for_free(req)))
        while waiting and len(running) < 4:
            if not step(reqs[waiting[0]], True):
                break
            running.append(waiting.pop(0))
    assert hits > 0 and preemptions > 0
    assert manager.prefix_stats()["evicted_blocks"] > 0, "the pool is meant to evict cached blocks"
    stats = manager.engine.stats()
    assert stats.used_blocks == 0 and stats.live_requests == 0
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_gpu_blocks - 1
    assert manager.reset_prefix_cache()
    assert manager.engine.stats().free_blocks == manager.block_pool.num_gpu_blocks - 1
