"""Which tagma KV cache manager serves which KV cache spec and options: the registry outside the managers.

Like vLLM's ``spec_manager_map`` and ``get_manager_for_kv_cache_spec``
(``vllm.v1.core.single_type_kv_cache_manager``): :data:`spec_manager_map` maps a KV cache spec type to the
manager class of each variant, and :func:`build_kv_cache_manager` (what :mod:`tagma.core.scheduler` binds in
place of vLLM's ``KVCacheManager``) picks one from the spec and the options, then builds it. The managers
never choose among themselves; a new manager (sliding window, state layers) is one class plus one entry.

Variants of one spec:

* :data:`RANGES`: prefix caching off (:class:`~tagma.core.range_manager.RangeKVCacheManager`);
* :data:`PREFIX_INDEX`: prefix caching on (:class:`~tagma.core.prefix_manager.PrefixKVCacheManager`);
* :data:`BLOCK_OBJECTS`: ``$TAGMA_RANGE_MANAGER`` = ``0``, vLLM's block objects and hashes
  (:class:`~tagma.core.manager.TagmaKVCacheManager`).

Sliding-window groups and configurations of several KV cache groups (gpt-oss, Gemma 3, Mistral) get
:class:`~tagma.core.group_range_manager.GroupRangeKVCacheManager` for caching off and
:class:`~tagma.core.group_prefix_manager.GroupPrefixKVCacheManager` for caching on (one full-attention group
beside the windows; it refuses the rest by name).

A configuration the chosen class cannot serve (a spec without an entry, several KV cache groups) is refused
by that class's constructor: such configurations get the :data:`DEFAULT_SPEC` entry, whose managers raise
``TagmaUnsupported`` naming the feature.
"""

from __future__ import annotations

from typing import Any, Final

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from tagma.core.group_prefix_manager import GroupPrefixKVCacheManager
from tagma.core.group_range_manager import GroupRangeKVCacheManager
from tagma.core.manager import SIGNATURE, TagmaKVCacheManager
from tagma.core.prefix_manager import PrefixKVCacheManager
from tagma.core.range_manager import RangeKVCacheManager
from tagma.errors import TagmaUnsupported
from tagma.selector import range_manager_enabled

__all__ = [
    "BLOCK_OBJECTS",
    "DEFAULT_SPEC",
    "MULTI_GROUP_SPEC",
    "PREFIX_INDEX",
    "RANGES",
    "build_kv_cache_manager",
    "get_manager_class",
    "manager_variant",
    "range_manager_enabled",
    "spec_manager_map",
]

RANGES: Final = "ranges"
PREFIX_INDEX: Final = "prefix_index"
BLOCK_OBJECTS: Final = "block_objects"

spec_manager_map: dict[type[KVCacheSpec], dict[str, type[TagmaKVCacheManager]]] = {
    FullAttentionSpec: {
        RANGES: RangeKVCacheManager,
        PREFIX_INDEX: PrefixKVCacheManager,
        BLOCK_OBJECTS: TagmaKVCacheManager,
    },
    # MLA's latent group is full attention to the manager (vLLM's spec_manager_map says the same).
    MLAAttentionSpec: {
        RANGES: RangeKVCacheManager,
        PREFIX_INDEX: PrefixKVCacheManager,
        BLOCK_OBJECTS: TagmaKVCacheManager,
    },
    # Also every configuration with several KV cache groups (MULTI_GROUP_SPEC). The group managers serve
    # full-attention, sliding-window, chunked local and state groups and refuse the rest in one line.
    SlidingWindowSpec: {
        RANGES: GroupRangeKVCacheManager,
        PREFIX_INDEX: GroupPrefixKVCacheManager,
        BLOCK_OBJECTS: TagmaKVCacheManager,
    },
    # A chunked local attention group alone: the group managers (the prefix one refuses it in one line).
    ChunkedLocalAttentionSpec: {
        RANGES: GroupRangeKVCacheManager,
        PREFIX_INDEX: GroupPrefixKVCacheManager,
        BLOCK_OBJECTS: TagmaKVCacheManager,
    },
}
DEFAULT_SPEC: Final[type[KVCacheSpec]] = FullAttentionSpec
MULTI_GROUP_SPEC: Final[type[KVCacheSpec]] = SlidingWindowSpec


def manager_variant(enable_caching: bool, range_manager: bool | None = None) -> str:
    """The variant for these options; ``range_manager`` None reads ``$TAGMA_RANGE_MANAGER``."""
    if not (range_manager_enabled() if range_manager is None else range_manager):
        return BLOCK_OBJECTS
    return PREFIX_INDEX if enable_caching else RANGES


def get_manager_class(kv_cache_config: KVCacheConfig, variant: str) -> type[TagmaKVCacheManager]:
    """The manager class of ``variant`` for the config's KV cache spec (by exact type; several groups: the
    :data:`MULTI_GROUP_SPEC` entry; else the :data:`DEFAULT_SPEC` entry). Constructors refuse what they
    cannot serve."""
    groups = kv_cache_config.kv_cache_groups
    spec_type = type(groups[0].kv_cache_spec) if len(groups) == 1 else MULTI_GROUP_SPEC
    managers = spec_manager_map.get(spec_type) or spec_manager_map[DEFAULT_SPEC]
    return managers[variant]


def build_kv_cache_manager(*args: Any, **kwargs: Any) -> TagmaKVCacheManager:
    """A tagma KV cache manager for vLLM's ``KVCacheManager(...)`` arguments.

    Takes ``KVCacheManager.__init__``'s arguments plus ``placement_policy`` and (prefix caching on only)
    ``prefix_eviction``; raises ``TypeError`` for ``prefix_eviction`` with caching off, as for any argument
    ``KVCacheManager`` does not take.
    """
    options = dict(kwargs)
    options.pop("placement_policy", None)
    eviction = options.pop("prefix_eviction", None)
    try:
        bound = SIGNATURE.bind(None, *args, **options)
    except TypeError:
        bound = None  # the block-object manager's constructor reports the bad arguments
    if bound is None:
        return TagmaKVCacheManager(*args, **kwargs)
    bound.apply_defaults()
    variant = manager_variant(bool(bound.arguments.get("enable_caching", True)))
    if variant == RANGES and eviction is not None:
        raise TypeError("prefix_eviction applies with prefix caching on only")
    try:
        return get_manager_class(bound.arguments["kv_cache_config"], variant)(*args, **kwargs)
    except TagmaUnsupported as refusal:
        raise_vllm_error_first(refusal, args, options)
        raise


def raise_vllm_error_first(refusal: TagmaUnsupported, args: tuple[Any, ...], options: dict[str, Any]) -> None:
    """Raise vLLM's own validation error (a ``ValueError``) for these arguments, if its ``KVCacheManager``
    raises one: a configuration vLLM rejects (a retention interval that is not a multiple of the scheduler's
    block size) gets vLLM's message, not tagma's refusal of a feature the user could not have used anyway.
    vLLM's internal assertions and other errors are not answers to the user: the refusal stands. Returns
    when no ``ValueError`` came (the caller raises the refusal); the probe manager is dropped. Runs only on
    the refusal path."""
    try:
        KVCacheManager(*args, **options)
    except ValueError as err:
        if not isinstance(err, TagmaUnsupported):
            raise err from refusal
    except Exception:  # noqa: BLE001, S110 - not vLLM's validation: tagma's refusal is the answer
        pass
