"""Building tagma's manager from vLLM's arguments: which manager caching on or off builds, the
configurations refused, the arguments passed through, the placement policy and reserve-admission settings,
and the block pool converted in place for every holder."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    KVCacheConfig,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from tagma.contract import ENV_PLACEMENT, ENV_RANGE_MANAGER, ENV_RESERVE_ADMISSION
from tagma.core.block_pool import TagmaBlockPool
from tagma.core.manager import TagmaKVCacheManager
from tagma.core.prefix_manager import PrefixKVCacheManager
from tagma.core.range_manager import RangeKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tests.tagma.twin import BLOCK, full_spec, make_config, manager_kwargs, use_block_object_manager

SW = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8)
CHUNKED = ChunkedLocalAttentionSpec(
    block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, attention_chunk_size=3 * BLOCK
)


@pytest.fixture(autouse=True)
def _block_object_manager_with_caching_on(monkeypatch: pytest.MonkeyPatch) -> None:
    use_block_object_manager(monkeypatch)


def test_unsupported_configurations_are_refused() -> None:
    sw = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8
    )
    cases: list[tuple[KVCacheConfig, dict[str, Any], str]] = [
        (make_config(16), {"dcp_world_size": 2}, "decode context parallelism"),
        (make_config(16), {"pcp_world_size": 2}, "prefill context parallelism"),
        (make_config(16), {"use_eagle": True}, "EAGLE"),
        (make_config(16), {"num_prefill_lookahead": 2}, "lookahead"),
    ]
    for config, extra, feature in cases:
        with pytest.raises(ValueError, match=f"^tagma: unsupported: .*{feature}"):
            build_kv_cache_manager(config, **manager_kwargs(**extra))
    # A window alone or several groups, caching on, are the group prefix manager's
    # (test_group_prefix_manager.py); the block-object manager itself serves one full-attention group.
    served = build_kv_cache_manager(make_config(16, specs=[sw]), **manager_kwargs())
    assert type(served).__name__ == "GroupPrefixKVCacheManager" and served._full is None
    with pytest.raises(ValueError, match="^tagma: unsupported: .*sliding.window"):
        TagmaKVCacheManager(make_config(16, specs=[sw]), **manager_kwargs())
    with pytest.raises(ValueError, match="^tagma: unsupported: .*KV cache groups"):
        TagmaKVCacheManager(make_config(16, specs=[full_spec(), sw]), **manager_kwargs())


def test_constructor_accepts_vllm_arguments_and_passes_them_through() -> None:
    config = make_config(16)
    positional = build_kv_cache_manager(config, 1024, BLOCK, BLOCK, None, True, placement_policy="first_fit")
    assert positional.policy_name == "first_fit" and positional.enable_caching
    with pytest.raises(TypeError):
        build_kv_cache_manager(config, **manager_kwargs(no_such_argument=1))


def test_an_eagle_drafter_is_served_by_the_range_managers_of_one_group() -> None:
    """EAGLE (use_eagle, one prefill token read ahead): the range managers serve it (caching off: lookahead
    slots only; caching on: the prefix manager drops the last hit block), and so do the group managers beside
    window groups (caching off: the group range manager; on: the group prefix manager, vLLM's EAGLE hit
    rules); multi-module MTP's longer lookahead, the block-object manager and EAGLE beside chunked groups with
    caching on (vLLM has no rule for it) stay refused."""
    eagle = {"use_eagle": True, "num_prefill_lookahead": 1}
    assert type(build_kv_cache_manager(make_config(16), **manager_kwargs(enable_caching=False, **eagle))) is (
        RangeKVCacheManager
    )
    assert PrefixKVCacheManager(make_config(16), **manager_kwargs(**eagle)).use_eagle
    groups = make_config(16, specs=[full_spec(), SW])
    served = build_kv_cache_manager(groups, **manager_kwargs(enable_caching=False, **eagle))
    assert type(served).__name__ == "GroupRangeKVCacheManager" and served.use_eagle
    cached = build_kv_cache_manager(make_config(16, specs=[full_spec(), SW]), **manager_kwargs(**eagle))
    assert type(cached).__name__ == "GroupPrefixKVCacheManager" and cached._eagle_any
    refused = [
        (make_config(16), {"enable_caching": False, "use_eagle": True, "num_prefill_lookahead": 2}, "MTP"),
        (make_config(16), eagle, "EAGLE"),  # caching on is the block-object manager here (the fixture)
        (make_config(16, specs=[full_spec(), CHUNKED]), eagle, "EAGLE"),  # the group prefix manager
    ]
    for config, extra, feature in refused:
        with pytest.raises(ValueError, match=f"^tagma: unsupported: .*{feature}"):
            build_kv_cache_manager(config, **manager_kwargs(**extra))


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


def test_caching_off_builds_the_range_manager_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(32)
    off = build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))
    assert type(off) is RangeKVCacheManager and not off.enable_caching
    positional = build_kv_cache_manager(config, 1 << 14, 4, 4, None, False)  # enable_caching by position
    assert type(positional) is RangeKVCacheManager
    on = build_kv_cache_manager(config, **manager_kwargs(enable_caching=True))
    assert type(on) is TagmaKVCacheManager
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    assert type(build_kv_cache_manager(config, **manager_kwargs(enable_caching=False))) is TagmaKVCacheManager
    with pytest.raises(ValueError, match="prefix caching off only"):
        RangeKVCacheManager(config, **manager_kwargs(enable_caching=True))


def test_an_mla_group_gets_the_full_attention_managers(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLA's one latent KV group is full attention to the manager: each variant builds its class."""
    from tagma.core.prefix_manager import PrefixKVCacheManager

    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    config = make_config(16, specs=[mla])
    monkeypatch.delenv(ENV_RANGE_MANAGER, raising=False)
    for caching, cls in ((False, RangeKVCacheManager), (True, PrefixKVCacheManager)):
        manager = build_kv_cache_manager(config, **manager_kwargs(enable_caching=caching))
        assert type(manager) is cls
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    assert type(build_kv_cache_manager(config, **manager_kwargs(enable_caching=True))) is TagmaKVCacheManager


def test_reserve_admission_setting_is_checked() -> None:
    from tagma.core.manager import reserve_admission

    assert reserve_admission("") == (100, 4) and reserve_admission("75/2") == (75, 2)
    assert reserve_admission("0") == (0, 1)
    for bad in ("101", "50/0", "x"):
        with pytest.raises(ValueError, match=ENV_RESERVE_ADMISSION):
            reserve_admission(bad)


def test_a_configuration_vllm_rejects_gets_vllms_error_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused feature (KV cache events, caching on) in a configuration vLLM itself rejects (a prefix-cache
    retention interval on a model with no window or state group): the user gets vLLM's ValueError, chained
    from tagma's refusal. vLLM's internal assertions (a negative watermark) leave the refusal standing, as do
    valid arguments."""
    monkeypatch.undo()  # the prefix-index manager (it refuses events), not this file's block-object manager
    config = make_config(16)
    config.prefix_cache_retention_interval = 32
    with pytest.raises(ValueError, match="^prefix_cache_retention_interval is set") as rejected:
        build_kv_cache_manager(config, **manager_kwargs(enable_kv_cache_events=True))
    assert "tagma: unsupported: KV cache events" in str(rejected.value.__cause__)
    for extra in ({}, {"watermark": -0.5}):
        with pytest.raises(ValueError, match="^tagma: unsupported: KV cache events"):
            build_kv_cache_manager(make_config(16), **manager_kwargs(enable_kv_cache_events=True, **extra))


@pytest.mark.parametrize("enable_caching", [False, True])
def test_reading_per_request_block_lists_is_refused_by_name(
    enable_caching: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The range managers keep no block list per request: vLLM's ``req_to_blocks`` (and, caching on,
    ``num_cached_block``) answer a request's entry with a refusal, not with the empty list a defaultdict
    would give; length and ``get`` still read as empty."""
    monkeypatch.undo()  # the range managers, not the block-object manager this file's fixture picks
    manager = build_kv_cache_manager(make_config(16), **manager_kwargs(enable_caching=enable_caching))
    assert isinstance(manager, RangeKVCacheManager)
    (single,) = manager.coordinator.single_type_managers
    maps = [single.req_to_blocks] + ([single.num_cached_block] if enable_caching else [])
    for per_request in maps:
        assert len(per_request) == 0 and per_request.get("r0") is None
        with pytest.raises(ValueError, match=r"^tagma: unsupported: \w+\['r0'\]: .* keep no per-request"):
            per_request["r0"]
