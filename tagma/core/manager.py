"""The tagma KV cache manager: vLLM's ``KVCacheManager`` with placement by the tagma range engine.

The whole scheduler-facing contract (coordinator, single-type manager, hashing, ``KVCacheBlock`` objects,
prefix-cache map, events, stats) is inherited from the installed vLLM. After vLLM builds it, the block pool
becomes a :class:`~tagma.core.block_pool.TagmaBlockPool` (the same object, converted in place) backed by one
:class:`~tagma.engine.RangeEngine`. The public calls that take or free a request's blocks (``allocate_slots``,
``free``, ``pop_blocks_for_free``) tell the pool which request they are for. Only one full-attention KV cache
group is supported.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, ClassVar

import numpy as np
from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from tagma.contract import DEFAULT_PLACEMENT, DEFAULT_RESERVE_ADMISSION, ENV_PLACEMENT, ENV_RESERVE_ADMISSION
from tagma.core.block_pool import TagmaBlockPool
from tagma.engine import I32Array, Policy, RangeEngine
from tagma.errors import TagmaUnsupported
from tagma.probes.telemetry import Telemetry

__all__ = [
    "ENV_POLICY",
    "SIGNATURE",
    "RefusedPerRequestMap",
    "TagmaKVCacheManager",
    "reserve_admission",
    "resolve_policy",
    "unsupported_feature",
]

ENV_POLICY = ENV_PLACEMENT
DEFAULT_POLICY = DEFAULT_PLACEMENT

SIGNATURE = inspect.signature(KVCacheManager.__init__)
# Shared by every manager: the statuses that pay the watermark, and vLLM's message for an empty allocation
WAITING_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
NO_TOKENS_MESSAGE = "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"


class RefusedPerRequestMap(dict):  # type: ignore[type-arg]
    """A per-request map of vLLM's single-type managers (``req_to_blocks``, ``num_cached_block``) that a
    range manager does not keep: ``len``, ``get`` and iteration see it empty, and reading a request's entry is
    refused by name, where vLLM's defaultdict would answer with an empty list that looks like a real one."""

    __slots__ = ("_what",)

    def __init__(self, name: str, contents: str) -> None:
        super().__init__()
        self._what = (name, contents)

    def __missing__(self, key: Any) -> Any:
        name, contents = self._what
        raise TagmaUnsupported(f"{name}[{key!r}]: tagma's range managers keep no per-request {contents}")


# Most specific first: MLAAttentionSpec subclasses FullAttentionSpec.
_SPEC_FEATURES: tuple[tuple[type, str], ...] = (
    (MLAAttentionSpec, "MLA attention"),
    (SlidingWindowSpec, "sliding window attention"),
    (ChunkedLocalAttentionSpec, "chunked local attention"),
    (MambaSpec, "mamba / linear attention state"),
    (CrossAttentionSpec, "cross-attention"),
    (EncoderOnlyAttentionSpec, "encoder-only attention"),
)


def resolve_policy(policy: str | int | Policy | None = None) -> Policy:
    """The placement policy: the argument, else ``$TAGMA_PLACEMENT``, else headroom."""
    if policy is None:
        policy = os.environ.get(ENV_POLICY) or DEFAULT_POLICY
    return Policy.parse(policy) if isinstance(policy, str) else Policy(policy)


def reserve_admission(value: str | None = None) -> tuple[int, int]:
    """RESERVE admission as (percent, pieces): the argument, else ``$TAGMA_RESERVE_ADMISSION``, else 100/4."""
    text = (value if value is not None else os.environ.get(ENV_RESERVE_ADMISSION, "")).strip()
    text = text or DEFAULT_RESERVE_ADMISSION
    percent, _, pieces = text.partition("/")
    try:
        result = (int(percent), int(pieces or 1))
    except ValueError:
        result = (-1, -1)
    if not 0 <= result[0] <= 100 or result[1] < 1:
        raise ValueError(f"{ENV_RESERVE_ADMISSION}={text!r}: expected <percent in 0..100>[/<pieces >= 1>]")
    return result


def unsupported_feature(
    kv_cache_config: KVCacheConfig,
    args: dict[str, Any],
    specs: tuple[type, ...] = (FullAttentionSpec,),
    max_groups: int | None = 1,
    eagle: bool = False,
) -> str | None:
    """The first configuration feature tagma does not support, or None.

    ``args`` are ``KVCacheManager.__init__``'s arguments by name (defaults filled in); ``specs`` the KV cache
    spec types the manager serves (by exact type), ``max_groups`` how many KV cache groups (None: any) and
    ``eagle`` whether it serves an EAGLE drafter (``use_eagle``: the last hit block dropped, the drafter
    reading one prefill token ahead; multi-module MTP's longer lookahead stays refused).
    """
    groups = kv_cache_config.kv_cache_groups
    if not groups or (max_groups is not None and len(groups) > max_groups):
        return f"{len(groups)} KV cache groups (hybrid or multi-spec models); the manager serves {max_groups}"
    for group in groups:
        spec = group.kv_cache_spec
        if type(spec) not in specs:
            for cls, feature in _SPEC_FEATURES:
                if isinstance(spec, cls):
                    return feature if type(spec) is cls else f"{feature} ({type(spec).__name__})"
            return f"KV cache spec {type(spec).__name__}"
        if group.role != KVCacheGroupRole.DEFAULT or group.host_resident or (
            getattr(kv_cache_config, "hisparse_host_num_blocks", None) is not None
        ):
            return "HiSparse KV cache groups"
        if group.is_eagle_group and not eagle:
            return "EAGLE / MTP speculative decoding (an EAGLE KV cache group)"
        if getattr(spec, "extra_retained_tokens", 0):
            return "multi-module MTP (sliding-window extra_retained_tokens)"
    spec = groups[0].kv_cache_spec
    if args.get("use_eagle") and not eagle:
        return "EAGLE / MTP speculative decoding (use_eagle)"
    if args.get("num_hash_lookahead_tokens", 0) > 0:  # vLLM 0.33, EAGLE-family drafters with caching on
        return "lookahead block hashes (num_hash_lookahead_tokens > 0; tagma keys a block by its own tokens)"
    # vLLM 0.32: an EAGLE drafter reads the next prefill token (1; nothing re-prefilled), multi-module MTP
    # num_speculative_tokens of them (the trailing ones re-prefillable: not cached until final).
    lookahead = args.get("num_prefill_lookahead", 0)
    if lookahead > 0 and not eagle:
        return "speculative prefill lookahead (num_prefill_lookahead > 0)"
    if lookahead > 1:
        return (
            f"speculative prefill lookahead (num_prefill_lookahead={lookahead} > 1: multi-module MTP, block "
            "drafters)"
        )
    if args.get("dcp_world_size", 1) > 1:
        return "decode context parallelism (dcp_world_size > 1)"
    if args.get("pcp_world_size", 1) > 1:
        return "prefill context parallelism (pcp_world_size > 1)"
    if args.get("enable_caching", True) and args.get("hash_block_size") not in (None, spec.block_size):
        return "hash_block_size != block_size (partial prefix-cache hits)"
    return None


class TagmaKVCacheManager(KVCacheManager):
    """``KVCacheManager`` whose block placement comes from a tagma :class:`RangeEngine`.

    The block-object variant (``$TAGMA_RANGE_MANAGER`` = ``0``) and the base of the range-native managers;
    which one serves a configuration is decided outside them, by :mod:`tagma.core.registry`.

    Takes the installed vLLM's constructor arguments (passed through unchanged) plus ``placement_policy``
    (``first_fit`` | ``best_fit`` | ``headroom``; default ``$TAGMA_PLACEMENT`` or headroom). Raises
    ``TagmaUnsupported("<feature>")`` (a ``ValueError``) for configurations it cannot serve.
    """

    block_pool: TagmaBlockPool
    # What this class serves: KV cache spec types (exact), vLLM's single-type managers, groups (None: any).
    # MLA's one latent KV group is full attention to the manager (vLLM maps it to FullAttentionManager too);
    # only the worker's cache op differs, and it writes through the same slot mapping.
    SERVED_SPECS: ClassVar[tuple[type, ...]] = (FullAttentionSpec, MLAAttentionSpec)
    SERVED_MANAGERS: ClassVar[tuple[type, ...]] = (FullAttentionManager,)
    MAX_GROUPS: ClassVar[int | None] = 1
    SERVES_EAGLE: ClassVar[bool] = False  # an EAGLE drafter (use_eagle); see unsupported_feature

    @classmethod
    def unsupported(cls, kv_cache_config: KVCacheConfig, args: dict[str, Any]) -> str | None:
        """What this class cannot serve of the configuration (``KVCacheManager.__init__``'s ``args`` by
        name), or None; checked before vLLM's manager is built."""
        return unsupported_feature(kv_cache_config, args, cls.SERVED_SPECS, cls.MAX_GROUPS, cls.SERVES_EAGLE)

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        *args: Any,
        placement_policy: str | int | Policy | None = None,
        **kwargs: Any,
    ) -> None:
        bound = SIGNATURE.bind(self, kv_cache_config, max_model_len, *args, **kwargs)
        bound.apply_defaults()
        feature = self.unsupported(kv_cache_config, bound.arguments)
        if feature is not None:
            raise TagmaUnsupported(feature)
        policy = resolve_policy(placement_policy)

        super().__init__(kv_cache_config, max_model_len, *args, **kwargs)

        coordinator = self.coordinator
        if type(coordinator) not in (UnitaryKVCacheCoordinator, KVCacheCoordinatorNoPrefixCache):
            raise TagmaUnsupported(f"KV cache coordinator {type(coordinator).__name__}")
        for manager in coordinator.single_type_managers:
            if type(manager) not in self.SERVED_MANAGERS:
                raise TagmaUnsupported(f"single-type manager {type(manager).__name__}")
        pool = coordinator.block_pool
        self._single = coordinator.single_type_managers[0]
        self.policy = policy
        self.policy_name = policy.name.lower()
        self.engine = RangeEngine(num_blocks=pool.num_gpu_blocks, policy=policy)
        self.block_pool = TagmaBlockPool.adopt(pool, self.engine)
        self.telemetry = Telemetry(self.policy_name, manager=self, engine=self.engine)

    # ---- calls that take or free a request's blocks: the pool learns the request

    def allocate_slots(
        self, request: Request, num_new_tokens: int, *args: Any, num_lookahead_tokens: int = 0, **kwargs: Any
    ) -> KVCacheBlocks | None:
        if not args and not kwargs and num_new_tokens > 0 and request.status not in WAITING_STATUSES:
            # The scheduler's call for a running request. vLLM's own fast path would find no block to
            # allocate and no full block to cache: answer that without going through the coordinator.
            single = self._single
            rid = request.request_id
            cached = single.num_cached_block.get(rid)
            blocks = single.req_to_blocks.get(rid)
            if cached is not None and blocks is not None:
                max_len = self.max_model_len
                bs = single.block_size
                computed = request.num_computed_tokens
                if computed > max_len:
                    computed = max_len
                need = computed + num_new_tokens + num_lookahead_tokens
                if need > max_len:
                    need = max_len
                full = computed + num_new_tokens
                if full > request.num_tokens:
                    full = request.num_tokens
                if -(-need // bs) <= len(blocks) and full // bs <= cached:
                    return self.empty_kv_cache_blocks
        pool = self.block_pool
        prev, pool._ctx = pool._ctx, request.request_id
        try:
            return super().allocate_slots(
                request, num_new_tokens, *args, num_lookahead_tokens=num_lookahead_tokens, **kwargs
            )
        finally:
            pool._ctx = prev

    def free(self, request: Request) -> None:
        pool = self.block_pool
        prev = pool._ctx, pool._freeing
        pool._ctx, pool._freeing = request.request_id, True
        try:
            super().free(request)
        finally:
            pool._ctx, pool._freeing = prev
        pool.release_request(request.request_id)  # normally done by free_blocks already

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        blocks = super().pop_blocks_for_free(request)
        self.block_pool.defer_release(request.request_id, blocks)
        return blocks

    # ---- telemetry and inspection

    def new_step_starts(self) -> None:
        super().new_step_starts()
        self.telemetry.on_step()

    def telemetry_snapshot(self) -> dict[str, Any]:
        """The telemetry record (same fields as a TAGMA_TELEMETRY_FILE line) for now."""
        return self.telemetry.snapshot()

    def engine_block_ids(self, request_id: str) -> I32Array:
        """The engine's physical blocks of a request (logical order); empty when it holds none."""
        eng = self.block_pool.engine_request(request_id)
        if eng is None:
            return np.empty(0, dtype=np.int32)
        return self.engine.blocks(eng)

