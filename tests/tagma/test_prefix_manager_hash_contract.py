"""The prefix-index manager where vLLM's scheduler contract reaches past token ids: vLLM 0.33's cap on a hit
(``max_cache_hit_length``), lookups by vLLM block hash, and lookahead block hashes. A cap is honoured; the
two hash paths are refused with one tagma error instead of answered as "not cached"."""

from __future__ import annotations

import inspect

import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher

from tagma.core.manager import unsupported_feature
from tagma.core.prefix_manager import LOOKAHEAD_HASHES, PrefixKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.errors import TagmaUnsupported
from tests.tagma.twin import BLOCK, make_config, make_request, manager_kwargs, tagma_request


def prefix_manager() -> PrefixKVCacheManager:
    manager = build_kv_cache_manager(make_config(64), **manager_kwargs(), prefix_eviction="lru")
    assert isinstance(manager, PrefixKVCacheManager)
    return manager


def cached(manager: PrefixKVCacheManager, tokens: list[int]) -> None:
    """Compute a request of ``tokens`` in full and free it: its full blocks stay cached."""
    request = tagma_request("cached", tokens)
    assert manager.allocate_slots(request, len(tokens)) is not None
    request.num_computed_tokens = len(tokens)
    manager.free(request)


def test_a_hit_is_capped_at_max_cache_hit_length() -> None:
    manager = prefix_manager()
    tokens = list(range(10 * BLOCK))
    cached(manager, tokens)
    probe = tagma_request("probe", tokens + [999])
    assert manager.get_computed_blocks(probe)[1] == 10 * BLOCK
    assert manager.get_computed_blocks(probe, 4 * BLOCK + 1)[1] == 4 * BLOCK  # whole blocks under the cap
    assert manager.get_computed_blocks(probe, max_cache_hit_length=BLOCK - 1)[1] == 0
    assert manager.get_computed_blocks(probe, 100 * BLOCK)[1] == 10 * BLOCK  # a cap past the prompt: none


def test_lookups_by_vllm_block_hash_are_refused() -> None:
    manager = prefix_manager()
    cached(manager, list(range(4 * BLOCK)))
    with pytest.raises(TagmaUnsupported, match="^tagma: unsupported: lookups by vLLM block hash"):
        manager.block_pool.get_cached_block(b"\0" * 32, [0])


def test_requests_hashed_as_vllm_hashes_them_are_served() -> None:
    manager = prefix_manager()
    tokens = list(range(6 * BLOCK))
    cached(manager, tokens)
    probe = make_request("probe", tokens + [999])  # vLLM's own hasher: a block's hash covers its tokens
    assert manager.get_computed_blocks(probe)[1] == 6 * BLOCK


def test_requests_with_lookahead_block_hashes_are_refused() -> None:
    if "num_hash_lookahead_tokens" not in inspect.signature(get_request_block_hasher).parameters:
        pytest.skip("this vLLM has no lookahead block hashes (vLLM 0.33 has; make test-vllm033)")
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    manager = prefix_manager()
    request = Request(
        request_id="ahead",
        prompt_token_ids=list(range(4 * BLOCK)),
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256, 1),  # withholds the last block's hash
    )
    with pytest.raises(TagmaUnsupported, match=f"^tagma: unsupported: {LOOKAHEAD_HASHES[:40]}"):
        manager.get_computed_blocks(request)


def test_lookahead_hashes_are_refused_at_construction() -> None:
    if "num_hash_lookahead_tokens" not in inspect.signature(KVCacheManager.__init__).parameters:
        pytest.skip("this vLLM's manager has no num_hash_lookahead_tokens (vLLM 0.33 has; make test-vllm033)")
    args = {**manager_kwargs(), "num_hash_lookahead_tokens": 1}
    assert unsupported_feature(make_config(64), args) == (
        "lookahead block hashes (num_hash_lookahead_tokens > 0; tagma keys a block by its own tokens)"
    )
