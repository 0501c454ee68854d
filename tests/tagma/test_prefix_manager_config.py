"""Prefix caching with tagma: what is refused before any model loads, and vLLM's request hashing switched off.

The refusals are checked on real VllmConfigs (``EngineArgs.create_engine_config`` with tagma's hooks). The
hashing hook is checked against the installed vLLM's engine-core module: the engine core asks
``get_request_block_hasher`` right after building its scheduler, and gets ``None`` when that scheduler's
KV cache manager keeps no block hashes.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_events import KVEventsConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from tagma import fail_closed  # noqa: E402
from tagma.contract import ENV_PLACEMENT, ENV_PREFIX_EVICTION, ENV_RANGE_MANAGER  # noqa: E402
from tagma.core import scheduler as tagma_scheduler  # noqa: E402
from tagma.selector import TagmaConfigError  # noqa: E402
from tests.tagma.tiny_configs import TAGMA, engine_config  # noqa: E402

init_none_hash(sha256)

HINT = ". Use --kv-cache-backend paged for this configuration."
EVENTS = "KV cache events with prefix caching (tagma's prefix index has no block hashes to publish)"
EMBEDS = "prompt embeddings with prefix caching (--enable-prompt-embeds; the index keys token ids)"


def refusal(**engine_kwargs: Any) -> str:
    with pytest.raises(TagmaConfigError) as info:
        engine_config(additional_config=dict(TAGMA), **engine_kwargs)
    return str(info.value)


def events_config() -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, publisher="null")


def test_kv_events_with_prefix_caching_are_refused() -> None:
    assert refusal(kv_events_config=events_config()) == f"tagma: unsupported: {EVENTS}{HINT}"


def test_prompt_embeddings_with_prefix_caching_are_refused() -> None:
    assert refusal(enable_prompt_embeds=True) == f"tagma: unsupported: {EMBEDS}{HINT}"


def test_without_prefix_caching_events_and_embeddings_are_not_the_index_s_concern() -> None:
    config = engine_config(
        additional_config=dict(TAGMA), enable_prefix_caching=False, enable_prompt_embeds=True
    )
    assert fail_closed.unsupported_features(config) == []


def test_the_block_object_manager_keeps_serving_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")  # vLLM's hashes and events stay with that manager
    config = engine_config(additional_config=dict(TAGMA), kv_events_config=events_config())
    assert fail_closed.unsupported_features(config) == []


def test_multimodal_models_with_prefix_caching_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config = engine_config(additional_config=dict(TAGMA))
    # a config-level test: no multimodal checkpoint exists here
    monkeypatch.setattr(type(config.model_config), "is_multimodal_model", property(lambda self: True))
    assert fail_closed._prefix_cache_keys(config) == (
        "multimodal models with prefix caching (the prefix index keys token ids only)"
    )


# ------------------------------------------------------------------------------------------ hashing hook


class _Manager:
    def __init__(self, uses_block_hashes: bool) -> None:
        self.uses_block_hashes = uses_block_hashes


class _EngineCore:
    """What the hook sees of vLLM's EngineCore.__init__: ``self.scheduler``, then the hasher asked for by
    the module-level name, exactly as ``vllm.v1.engine.core`` does."""

    def __init__(self, manager: Any, connector: Any = None) -> None:
        import vllm.v1.engine.core as core

        self.scheduler = SimpleNamespace(kv_cache_manager=manager, connector=connector)
        self.request_block_hasher = core.get_request_block_hasher(16, sha256)


def _request(hasher: Any) -> Request:
    core_request = EngineCoreRequest(
        request_id="r",
        prompt_token_ids=list(range(100)),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    return Request.from_engine_core_request(core_request, hasher)


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> Any:
    import vllm.v1.engine.core as core

    monkeypatch.setattr(core, "get_request_block_hasher", core.get_request_block_hasher)  # restored after
    assert tagma_scheduler.install_hashless_hook()
    assert tagma_scheduler.install_hashless_hook()  # idempotent: one wrapper
    wrapped = core.get_request_block_hasher
    assert getattr(wrapped, "__wrapped__", None) is not None
    assert not getattr(wrapped.__wrapped__, "_tagma_hashless", False)
    return core


def test_a_hashless_manager_s_engine_core_gets_no_hasher_and_requests_have_no_hashes(hooked: Any) -> None:
    engine_core = _EngineCore(_Manager(uses_block_hashes=False))
    assert engine_core.request_block_hasher is None
    request = _request(engine_core.request_block_hasher)
    request.append_output_token_ids(list(range(40)))
    assert request.block_hashes == []


def test_other_managers_and_connectors_keep_vllm_s_hasher(hooked: Any) -> None:
    for engine_core in (
        _EngineCore(_Manager(uses_block_hashes=True)),
        _EngineCore(object()),
        _EngineCore(_Manager(uses_block_hashes=False), connector=object()),
    ):
        assert engine_core.request_block_hasher is not None
        assert len(_request(engine_core.request_block_hasher).block_hashes) == 100 // 16


def test_the_hook_needs_the_engine_core_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm.v1.engine.core")
    assert not tagma_scheduler.install_hashless_hook()


def test_reserve_placement_is_refused_with_prefix_caching_on() -> None:
    from tagma.core.registry import build_kv_cache_manager
    from tagma.errors import TagmaUnsupported
    from tests.tagma.twin import make_config, manager_kwargs

    with pytest.raises(TagmaUnsupported, match="reserve with prefix caching on"):
        build_kv_cache_manager(
            make_config(41), placement_policy="reserve", **manager_kwargs(enable_caching=True)
        )


@pytest.mark.parametrize("policy", ["first_fit", "best_fit"])
def test_contiguous_eviction_refuses_other_placement_policies_and_lru_takes_them(policy: str) -> None:
    from tagma.core.registry import build_kv_cache_manager
    from tagma.errors import TagmaUnsupported
    from tests.tagma.twin import make_config, manager_kwargs

    refusal = f"{ENV_PLACEMENT}={policy} with {ENV_PREFIX_EVICTION}=contiguous"
    with pytest.raises(TagmaUnsupported, match=refusal):
        build_kv_cache_manager(
            make_config(41), placement_policy=policy, prefix_eviction="contiguous",
            **manager_kwargs(enable_caching=True),
        )
    manager = build_kv_cache_manager(
        make_config(41), placement_policy=policy, prefix_eviction="lru", **manager_kwargs(enable_caching=True)
    )
    assert manager.prefix_eviction == "lru" and manager.policy.name.lower() == policy
