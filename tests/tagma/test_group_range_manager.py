"""GroupRangeKVCacheManager (full-attention, sliding-window, chunked local and state groups, caching off)
against vLLM's own KVCacheManager in lockstep: the same admissions, the same blocks held, freed and allocated
per group and step, null blocks where a window dropped blocks, the same free count; and no block leaked."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from tagma.core.group_range_manager import GroupRangeKVCacheManager, GroupRangeRelease
from tagma.core.registry import build_kv_cache_manager
from tagma.core.state_checkpoints import CACHES_MODE_NONE
from tagma.errors import TagmaUnsupported
from tests.tagma.twin import BLOCK, make_config, manager_kwargs


def full() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)


def window(tokens: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=tokens
    )


def chunked(tokens: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, attention_chunk_size=tokens
    )


def state(block_size: int = 1 << 14, speculative_blocks: int = 0) -> MambaSpec:
    """A state group (Mamba / GDN layers) in vLLM's cache mode "none": its block is max_model_len tokens
    (the twin's 16,384) unless ``mamba_block_size`` is set, plus ``speculative_blocks`` blocks."""
    return MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,),
                     num_speculative_blocks=speculative_blocks)  # fmt: skip


# The layouts of the tiny families (harness/serve/tiny_families.py), at block 4 and small windows.
LAYOUTS: dict[str, list[KVCacheSpec]] = {
    "gpt-oss": [window(8), full()],  # alternating window and full: one group each
    "mistral": [window(13)],  # every layer slides: one window group
    "gemma3": [window(9), window(9), window(9), window(9), window(9), full()],  # 5 : 1
    "qwen3-next": [state(), full()],  # GDN state layers beside full attention: one state block per request
    # a mamba_block_size a user set (the state's earlier blocks are freed as it advances) and the
    # speculative blocks an MTP drafter adds
    "state-small-blocks": [state(block_size=3 * BLOCK, speculative_blocks=2), full()],
    "llama4": [chunked(3 * BLOCK), full()],  # chunked local attention (RoPE layers) beside global NoPE layers
    "chunked-only": [chunked(10)],  # a chunk that is no whole number of blocks
}
# Pool blocks per layout: the largest request (72 tokens, 18 blocks per group before its window drops any)
# fits alone, five running together do not.
POOL_BLOCKS = {"gpt-oss": 44, "mistral": 20, "gemma3": 112, "qwen3-next": 30, "state-small-blocks": 40,
               "llama4": 44, "chunked-only": 12}  # fmt: skip


def make_request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=params, pooling_params=None)


class GroupTwin:
    """vLLM's manager and tagma's, caching off, driven by the same scheduler-like calls."""

    def __init__(
        self, specs: list[KVCacheSpec], num_blocks: int, eagle_group: int | None = None, **overrides: Any
    ) -> None:
        config = make_config(num_blocks, specs=specs)
        if eagle_group is not None:  # an EAGLE drafter's layer: its group marked as vLLM's grouping marks it
            config.kv_cache_groups[eagle_group].is_eagle_group = True
        # vLLM's scheduling granularity: the least common multiple of the groups' block sizes
        lcm = math.lcm(*(spec.block_size for spec in specs))
        kwargs = manager_kwargs(enable_caching=False, scheduler_block_size=lcm, **overrides)
        self.paged = KVCacheManager(config, **kwargs)
        self.tagma = build_kv_cache_manager(config, **kwargs)
        assert type(self.tagma) is GroupRangeKVCacheManager
        self.requests: dict[str, tuple[Request, Request]] = {}
        self.num_groups = len(specs)

    def add(self, rid: str, tokens: list[int]) -> None:
        self.requests[rid] = (make_request(rid, tokens), make_request(rid, tokens))

    def pairs(self, rid: str) -> list[tuple[Any, Request]]:
        p, t = self.requests[rid]
        return [(self.paged, p), (self.tagma, t)]

    def schedule(
        self,
        rid: str,
        budget: int | None = None,
        full_sequence: bool = False,
        in_flight: int = 0,
        drafts: int = 0,
        lookahead: int = 0,
    ) -> bool:
        """``in_flight``: tokens of steps still running (async scheduling), which vLLM keeps out of the
        window frees (they use the processed-token basis). ``drafts``: speculative tokens scheduled with a
        decode step; ``lookahead``: the scheduler's extra slots for a drafter's KV."""
        outcomes: list[Any] = []
        for manager, req in self.pairs(rid):
            req.num_in_flight_tokens = min(in_flight, req.num_computed_tokens)
            num_new = req.num_tokens - req.num_computed_tokens + drafts
            if budget is not None:
                num_new = min(num_new, budget)
            new = manager.allocate_slots(
                req, num_new, num_lookahead_tokens=lookahead, full_sequence_must_fit=full_sequence
            )
            if new is None:
                outcomes.append(None)
                continue
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens += num_new
            outcomes.append(tuple(len(ids) for ids in new.get_block_ids()))
        assert outcomes[0] == outcomes[1], f"{rid}: paged {outcomes[0]} != tagma {outcomes[1]}"
        self.check()
        return outcomes[0] is not None

    def decode(self, rid: str, token: int, in_flight: int = 0) -> bool:
        for _, req in self.pairs(rid):
            req.append_output_token_ids(token)
        return self.schedule(rid, in_flight=in_flight)

    def speculate(self, rid: str, drafts: int, rejected: int, lookahead: int, in_flight: int = 0) -> bool:
        """A decode step with ``drafts`` speculative tokens of which ``rejected`` fail verification: the
        scheduler takes the rejected ones back off ``num_computed_tokens`` (their slots are rewritten by
        the next step) and the accepted ones plus the bonus token become output."""
        for _, req in self.pairs(rid):
            if req.num_computed_tokens == req.num_tokens:  # the prefill's sampled token
                req.append_output_token_ids(7)
        if not self.schedule(rid, in_flight=in_flight, drafts=drafts, lookahead=lookahead):
            return False
        for _, req in self.pairs(rid):
            req.num_computed_tokens -= rejected
            req.append_output_token_ids([7] * (drafts - rejected + 1))
        self.check()
        return True

    def free(self, rid: str, preempt: bool = False, deferred: bool = False) -> None:
        for manager, req in self.pairs(rid):
            if deferred:
                blocks = manager.pop_blocks_for_free(req)
                if manager is self.tagma:
                    assert isinstance(blocks, GroupRangeRelease)
                if blocks:
                    manager.block_pool.free_blocks(reversed(blocks))
            else:
                manager.free(req)
            if preempt:
                req.status = RequestStatus.PREEMPTED
                req.num_computed_tokens = 0
        self.check()

    def check(self) -> None:
        p, t = self.paged, self.tagma
        assert p.block_pool.get_num_free_blocks() == t.block_pool.get_num_free_blocks()
        assert p.usage == t.usage
        stats = t.engine.stats()
        held = 0
        for rid in self.requests:
            paged_groups = [m.req_to_blocks.get(rid, []) for m in p.coordinator.single_type_managers]
            tagma_ids = t.get_block_ids(rid)
            for g, blocks in enumerate(paged_groups):
                ids = tagma_ids[g]
                assert len(ids) == len(blocks), f"{rid} group {g}: logical blocks differ"
                assert [i == 0 for i in ids] == [b.is_null for b in blocks], f"{rid} group {g}: null blocks"
                live = [i for i in ids if i != 0]
                assert len(live) == t.num_blocks_held(rid, g)
                held += len(live)
        assert stats.used_blocks == held
        assert stats.free_blocks == t.block_pool.get_num_free_blocks()
        assert all(b.ref_cnt == 0 for b in t.block_pool.blocks), "the group manager touched a KVCacheBlock"


def run_workload(
    twin: GroupTwin,
    seed: int,
    num_requests: int,
    max_running: int,
    chunk: int | None,
    spec_tokens: int = 0,
    lookahead: int = 0,
) -> int:
    """FIFO admission (full sequence must fit on first admission, as vLLM's scheduler asks with chunked
    prefill), chunked prefill, decode past the windows (with up to ``spec_tokens`` drafts per step, some
    rejected), preemption of the last admitted request when a step cannot allocate, resume, finish (half of
    them deferred frees). Returns the number of preemptions."""
    rng = random.Random(seed)
    waiting: list[str] = []
    out_len: dict[str, int] = {}
    for i in range(num_requests):
        rid = f"r{i}"
        twin.add(rid, [rng.randrange(50_000) for _ in range(rng.randint(1, 8 * BLOCK))])
        waiting.append(rid)
        out_len[rid] = rng.randint(1, 10 * BLOCK)
    running: list[str] = []
    preemptions = 0
    steps = 0
    while waiting or running:
        steps += 1
        assert steps < 20_000, "the workload does not finish"
        for m in (twin.paged, twin.tagma):
            m.new_step_starts()
        for rid in list(running):
            if rid not in running:
                continue
            req = twin.requests[rid][1]
            while True:
                in_flight = rng.choice((0, 0, 1, 2 * BLOCK))
                if req.num_computed_tokens < req.num_tokens - 1 or (
                    req.num_computed_tokens < req.num_tokens and not spec_tokens
                ):
                    ok = twin.schedule(rid, budget=chunk, in_flight=in_flight, lookahead=lookahead)
                elif spec_tokens:
                    drafts = rng.randint(0, spec_tokens)
                    ok = twin.speculate(rid, drafts, rng.randint(0, drafts), lookahead, in_flight=in_flight)
                else:
                    ok = twin.decode(rid, rng.randrange(50_000), in_flight=in_flight)
                if ok:
                    break
                victim = running.pop()
                twin.free(victim, preempt=True)
                waiting.insert(0, victim)
                preemptions += 1
                if victim == rid:
                    break
            if rid in running and req.num_output_tokens >= out_len[rid]:
                running.remove(rid)
                twin.free(rid, deferred=rng.random() < 0.5)
        while waiting and len(running) < max_running:
            rid = waiting[0]
            if not twin.schedule(rid, budget=chunk, full_sequence=True):
                break
            running.append(waiting.pop(0))
    return preemptions


def assert_no_leak(manager: GroupRangeKVCacheManager) -> None:
    stats = manager.engine.stats()
    assert stats.used_blocks == 0 and stats.live_requests == 0
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_gpu_blocks - 1
    assert not manager._reqs


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("seed", "chunk", "in_flight"), [(0, None, None), (1, 5, None), (2, 3, 6)])
def test_group_manager_matches_vllm_under_pressure(
    layout: str, seed: int, chunk: int | None, in_flight: int | None
) -> None:
    """``in_flight``: vLLM's max_in_flight_tokens, which sets the window groups' admission cap."""
    specs = LAYOUTS[layout]
    twin = GroupTwin(specs, num_blocks=POOL_BLOCKS[layout], max_in_flight_tokens=in_flight)
    preemptions = run_workload(twin, seed, num_requests=40, max_running=5, chunk=chunk)
    assert preemptions > 0, "the pool is meant to be small enough to preempt"
    assert_no_leak(twin.tagma)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("spec_tokens", "lookahead"), [(3, 0), (4, 4)])
def test_speculative_steps_match_vllm(layout: str, spec_tokens: int, lookahead: int) -> None:
    """Speculative decoding: drafts scheduled with each decode step, rejected ones taken back, and the
    lookahead slots a drafter would write (ngram has none): the same blocks per group as vLLM, null
    blocks where the window dropped them, no leak."""
    twin = GroupTwin(LAYOUTS[layout], num_blocks=POOL_BLOCKS[layout])
    preemptions = run_workload(twin, 3, 30, 5, chunk=5, spec_tokens=spec_tokens, lookahead=lookahead)
    assert preemptions > 0, "the pool is meant to be small enough to preempt"
    assert_no_leak(twin.tagma)


# An EAGLE-family drafter's layer beside the target's groups, in a group of its own, marked. On a real
# server vLLM marks no group for an EAGLE drafter, and beside a sliding-window target the drafter's layer
# takes the target's window (the tiny Mistral with its drafter: one window group of three layers); these
# layouts are the stricter case of a full-attention drafter group beside the windows (as beside Llama 4's
# chunked groups, where the drafter's layer is full attention).
EAGLE_LAYOUTS: dict[str, tuple[list[KVCacheSpec], int]] = {
    "gpt-oss": ([window(8), full(), full()], 2),
    "mistral": ([window(13), window(13), full()], 2),
    "llama4": ([chunked(3 * BLOCK), full(), full()], 2),
}


@pytest.mark.parametrize("layout", sorted(EAGLE_LAYOUTS))
def test_an_eagle_drafter_beside_window_groups_matches_vllm(layout: str) -> None:
    """An EAGLE drafter with prefix caching off (use_eagle, one prefill token read ahead): the lookahead
    slots (num_speculative_tokens) taken in every group with each step's drafts, as vLLM's coordinator takes
    them, under preemption; use_eagle changes only hit rules, which caching off has none of."""
    specs, eagle_group = EAGLE_LAYOUTS[layout]
    # the layout's pool plus the drafter group's share of the largest request (18 blocks: POOL_BLOCKS)
    twin = GroupTwin(specs, num_blocks=POOL_BLOCKS[layout] + 18, eagle_group=eagle_group, use_eagle=True,
                     num_prefill_lookahead=1)  # fmt: skip
    assert twin.paged.use_eagle and twin.paged.coordinator.eagle_group_ids == {eagle_group}
    preemptions = run_workload(twin, 5, 30, 5, chunk=5, spec_tokens=3, lookahead=3)
    assert preemptions > 0, "the pool is meant to be small enough to preempt"
    assert_no_leak(twin.tagma)


def test_window_group_holds_what_vllm_holds_in_decode() -> None:
    """A long decode: the window group's footprint stays at vLLM's bound while the full group grows."""
    twin = GroupTwin(LAYOUTS["gpt-oss"], num_blocks=64)
    twin.add("a", list(range(3 * BLOCK)))
    assert twin.schedule("a")
    for token in range(20 * BLOCK):
        assert twin.decode("a", token)
        window_held = twin.tagma.num_blocks_held("a", 0)
        assert window_held <= -(-(8 - 1) // BLOCK) + 1
    assert twin.tagma.num_blocks_dropped("a", 0) > 15
    assert twin.tagma.num_blocks_held("a", 1) == -(-twin.requests["a"][1].num_computed_tokens // BLOCK)
    twin.free("a")
    assert_no_leak(twin.tagma)


def test_placement_telemetry_counts_requests_and_their_groups_alike_on_both_arms() -> None:
    """With several groups, ``live_requests`` (and its peak) counts requests on both arms, and the runs of
    block ids are counted per (request, group) on both: vLLM's window group skips its null blocks (a null
    block is not a run of the request's KV)."""
    from tagma.probes.telemetry import Telemetry

    twin = GroupTwin(LAYOUTS["gpt-oss"], num_blocks=64)
    for rid in ("a", "b"):
        twin.add(rid, list(range(3 * BLOCK)))
        assert twin.schedule(rid)
    for token in range(6 * BLOCK):  # well past the window: the window groups hold null blocks
        for rid in ("a", "b"):
            assert twin.decode(rid, token)
    assert twin.tagma.num_blocks_dropped("a", 0) >= 4
    lines = [Telemetry(name, manager=m).snapshot() for name, m in (("paged", twin.paged), ("t", twin.tagma))]
    for line in lines:
        assert (line["live_requests"], line["peak_live_requests"]) == (2, 2), line

    def runs(ids: list[int]) -> int:
        live = [i for i in ids if i != 0]
        return 1 + sum(b != a + 1 for a, b in zip(live, live[1:], strict=False))

    for line, ids_of in ((lines[0], lambda rid: [[b.block_id for b in m.req_to_blocks[rid]]
                                                 for m in twin.paged.coordinator.single_type_managers]),
                         (lines[1], twin.tagma.get_block_ids)):  # fmt: skip
        counts = [runs(ids) for rid in ("a", "b") for ids in ids_of(rid)]
        assert len(counts) == 4
        assert line["ranges_per_request"]["mean"] == sum(counts) / 4, (line, counts)
        assert line["ranges_per_request"]["max"] == max(counts), (line, counts)
    twin.free("a")
    twin.free("b")
    assert_no_leak(twin.tagma)


def test_window_frees_wait_for_in_flight_steps() -> None:
    """Async scheduling: blocks the in-flight prefill still reads stay allocated; once its output is
    processed the next allocation frees them (vLLM's test_swa_inflight_window_free, on tagma's counts)."""
    twin = GroupTwin([window(16)], num_blocks=64)
    twin.add("a", list(range(98)))
    assert twin.schedule("a")  # the prefill: 25 blocks, in flight from here on
    free_after_prefill = twin.tagma.block_pool.get_num_free_blocks()
    assert twin.decode("a", 7, in_flight=98)  # the prefill's output is not processed yet
    assert twin.tagma.num_blocks_dropped("a", 0) == 0
    assert twin.tagma.block_pool.get_num_free_blocks() == free_after_prefill
    assert twin.decode("a", 8, in_flight=1)  # processed: the decode step alone is in flight
    dropped = (98 - 16 + 1) // BLOCK  # the processed tokens (99 - 1) less the window
    assert twin.tagma.num_blocks_dropped("a", 0) == dropped
    assert twin.tagma.block_pool.get_num_free_blocks() == free_after_prefill + dropped
    twin.free("a")
    assert_no_leak(twin.tagma)


def test_admission_cap_and_remaining_blocks_match_the_coordinator() -> None:
    twin = GroupTwin(LAYOUTS["gpt-oss"], num_blocks=40)
    twin.add("a", list(range(30 * BLOCK)))
    for cap in (False, True):
        for tokens in (1, BLOCK, 7 * BLOCK + 1, 30 * BLOCK):
            counts = [
                m.coordinator.get_num_blocks_to_allocate(
                    request_id="a", num_tokens=tokens, new_computed_blocks=m.empty_kv_cache_blocks.blocks,
                    num_encoder_tokens=0, total_computed_tokens=0, num_local_computed_tokens=0,
                    num_tokens_main_model=tokens, apply_admission_cap=cap,
                )
                for m in (twin.paged, twin.tagma)
            ]
            assert counts[0] == counts[1], (cap, tokens)


def _aligned(**changes: Any) -> MambaSpec:
    fields = {"block_size": BLOCK, "shapes": ((1,),), "dtypes": (torch.float32,), "mamba_cache_mode": "align"}
    return MambaSpec(**{**fields, **changes})


@pytest.mark.parametrize(
    ("specs", "options", "refusal"),
    [
        ([_aligned(num_speculative_blocks=2), full()], {}, "speculative state blocks"),
        ([_aligned(num_prefill_checkpoint_blocks=1), full()], {}, "state prefill checkpoint blocks"),
        ([_aligned(), window(8)], {}, "state layers with prefix caching and no full-attention group"),
        ([_aligned(), full()], {"use_eagle": True, "num_prefill_lookahead": 1}, "an EAGLE drafter beside"),
        pytest.param(
            [state(BLOCK), full()], {}, "state layers in mamba_cache_mode='none' with prefix caching",
            marks=pytest.mark.skipif(CACHES_MODE_NONE, reason="vLLM 0.32's manager caches mode 'none' too"),
        ),
    ],
    ids=["speculative-blocks", "prefill-checkpoints", "no-full-group", "eagle", "mode-none"],
)
def test_state_groups_with_caching_on_refuse_what_they_cannot_serve(
    specs: list[KVCacheSpec], options: dict[str, Any], refusal: str
) -> None:
    """Caching on with state groups in mode "align" beside a full group is served
    (tests/tagma/test_group_prefix_manager.py); the rest is refused in one line, by name."""
    config = make_config(16, specs=specs)
    with pytest.raises(TagmaUnsupported, match=refusal):
        build_kv_cache_manager(config, **manager_kwargs(enable_caching=True, **options))


def test_other_group_kinds_are_refused_by_name() -> None:
    cross = CrossAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = make_config(16, specs=[full(), cross])
    with pytest.raises(TagmaUnsupported, match="cross-attention"):
        build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))


def test_chunked_local_attention_alone_with_caching_on_is_refused_by_name() -> None:
    """Caching off is served (the lockstep tests above), and caching on beside a full-attention group
    (tests/tagma/test_group_prefix_manager.py); with no full group to key its cached blocks, refused."""
    config = make_config(16, specs=LAYOUTS["chunked-only"])
    with pytest.raises(TagmaUnsupported, match="chunked local attention with prefix caching and no full"):
        build_kv_cache_manager(config, **manager_kwargs(enable_caching=True))


def test_state_checkpoints_are_refused_by_name() -> None:
    """A state group in cache mode "align" (vLLM's state checkpoints for prefix caching) is refused in one
    line even with caching off; mode "none" is what the group manager serves."""
    align = MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
    config = make_config(16, specs=[align, full()])
    with pytest.raises(TagmaUnsupported, match="state layers in mamba_cache_mode='align'"):
        build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))
