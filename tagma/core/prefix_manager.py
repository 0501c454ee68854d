"""The range-native KV cache manager with prefix caching on: the prefix cache is the engine's prefix index.

:class:`PrefixKVCacheManager` is :class:`~tagma.core.range_manager.RangeKVCacheManager` (per-request state:
an engine request and a count; no ``KVCacheBlock`` on hot paths) plus the engine's hash-less prefix index
(a trie of full blocks keyed by token ids, :mod:`tagma.engine.prefix_index`, whose binding reads a request's
token list in C: no per-token Python work). vLLM's block hashes are neither computed nor read: the engine core
builds its requests without a block hasher (:func:`tagma.core.scheduler.install_hashless_hook`, keyed on
``uses_block_hashes = False``).

vLLM's meaning is kept where the scheduler can see it:

* ``get_computed_blocks``: the longest cached prefix in full blocks, capped at ``num_tokens - 1`` tokens
  (the last token is always computed), less its last block with an EAGLE drafter (``use_eagle``), none for
  requests that skip reading the prefix cache; the hit is a view over the hit block ids
  (:class:`HitBlocks`) and changes no block state;
* ``allocate_slots``: vLLM's admission arithmetic (cache-only hits count against the free blocks, as
  vLLM's evictable hits do), then the hit is attached (one engine call that walks the index again), new
  blocks appended with their growth hint (prompt + max_tokens; the engine evicts cached blocks as its
  eviction mode says: exact LRU by default; under contiguous it places over cached space) and the full
  blocks up to ``min(computed + new, num_tokens)`` tokens indexed, prompt and output
  alike, as vLLM caches them;
* ``free``: the request's blocks not used by another request become cache-only (evictable, LRU);
* ``reset_prefix_cache``: fails (False) while any block is in use, as vLLM's;
* stats, usage and ``estimate_cached_tokens`` with vLLM's meaning; KV events are refused (no hashes).

The namespace of a request (its index root) is its cache salt and LoRA adapter (name and path): vLLM's
extra keys for token-only requests. Multimodal inputs and prompt embeddings cannot be keyed by token ids
and are refused (before the model loads in :mod:`tagma.fail_closed`, here as a backstop).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request

from tagma.contract import DEFAULT_PREFIX_EVICTION, ENV_PLACEMENT, ENV_PREFIX_EVICTION
from tagma.core.manager import NO_TOKENS_MESSAGE, SIGNATURE, WAITING_STATUSES, RefusedPerRequestMap
from tagma.core.range_manager import RangeBlocks, RangeKVCacheManager
from tagma.engine import Policy, _raise
from tagma.engine.prefix_index import EvictionMode, PrefixIndex
from tagma.errors import TagmaUnsupported

__all__ = ["ENV_PREFIX_EVICTION", "HitBlocks", "PrefixKVCacheManager", "request_namespace"]

logger = logging.getLogger("vllm.tagma")

DEFAULT_EVICTION = DEFAULT_PREFIX_EVICTION

HASHED_REQUEST_WARNING = "tagma: a request arrived with vLLM block hashes (the engine core hashed it)"
# vLLM 0.33's lookahead hashes (EAGLE-family drafters) key a block by its tokens and the next ones, and
# withhold a full block's hash until those exist; the index keys a block by its own tokens.
LOOKAHEAD_HASHES = (
    "block hashes that cover tokens after their block (lookahead hashes; tagma keys a block by its tokens)"
)
_LOST = 1 << 62  # "indexed up to" of a request whose index cursor was lost: nothing more to insert

def request_namespace(index: PrefixIndex, default_ns: int, request: Request) -> int:
    """The request's index namespace: ``default_ns`` without cache salt or LoRA, else an id per distinct
    key (vLLM's extra keys for token-only requests)."""
    if request.mm_features or getattr(request, "prompt_embeds", None) is not None:
        raise TagmaUnsupported(
            "multimodal inputs or prompt embeddings with prefix caching (the prefix index keys token ids)"
        )
    lora = request.lora_request
    salt = request.cache_salt
    if lora is None and not salt:
        return default_ns
    return index.namespace((salt or None, lora.lora_name if lora else None, lora.lora_path if lora else None))


class HitBlocks(KVCacheBlocks):
    """A ``KVCacheBlocks`` of one group over the hit block ids of a prefix lookup (an int32 array)."""

    __slots__ = ("_ids", "_pool")

    def __init__(self, ids: np.ndarray, pool: Any) -> None:
        self._ids = ids
        self._pool = pool

    @property
    def blocks(self) -> tuple[Sequence[Any], ...]:  # type: ignore[override]
        table = self._pool.blocks
        return ([table[i] for i in self._ids.tolist()],)

    @property
    def ids(self) -> np.ndarray:
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def get_block_ids(  # type: ignore[override]
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        if group_ids is not None:
            if any(g != 0 for g in group_ids):
                raise IndexError(f"KV cache group ids {list(group_ids)}: tagma has one group (0)")
            if allow_none and (not group_ids or not len(self._ids)):
                return None
            return tuple(self._ids.tolist() for _ in group_ids)
        if allow_none and not len(self._ids):
            return None
        return (self._ids.tolist(),)

    def get_unhashed_block_ids(self) -> list[int]:
        return []  # every hit block is cached

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [[]]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(((),))

    def __repr__(self) -> str:
        return f"HitBlocks(ids={self._ids.tolist()!r})"


def _no_hash_lookups(*args: Any, **kwargs: Any) -> NoReturn:
    """The pool's lookup by vLLM block hash: this manager caches blocks by token ids and keeps no hashes,
    so a caller that reads vLLM's hashed cache (vLLM 0.33's auxiliary-output connector for returned routed
    experts) is refused, not answered "not cached"."""
    raise TagmaUnsupported(
        "lookups by vLLM block hash (tagma's prefix index keys blocks by token ids): features that read "
        "vLLM's hashed prefix cache, such as returned routed experts"
    )


class PrefixKVCacheManager(RangeKVCacheManager):
    """``KVCacheManager`` for prefix caching on, built through
    :func:`tagma.core.registry.build_kv_cache_manager` (same arguments;
    ``prefix_eviction``: ``lru`` | ``contiguous``, default ``$TAGMA_PREFIX_EVICTION`` or lru)."""

    uses_block_hashes = False  # the engine core builds requests without vLLM's block hasher

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        *args: Any,
        prefix_eviction: str | int | None = None,
        **kwargs: Any,
    ) -> None:
        placement = kwargs.pop("placement_policy", None)
        bound = SIGNATURE.bind(None, kv_cache_config, max_model_len, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        if not arguments.get("enable_caching", True):
            raise ValueError("tagma: PrefixKVCacheManager serves prefix caching on only")
        if arguments.get("enable_kv_cache_events"):
            raise TagmaUnsupported(
                "KV cache events with prefix caching (tagma's prefix index has no block hashes to publish)"
            )
        block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size if (
            len(kv_cache_config.kv_cache_groups) == 1
        ) else None
        hash_block_size = arguments.get("hash_block_size")
        if block_size is not None and hash_block_size not in (None, block_size):
            raise TagmaUnsupported("hash_block_size != block_size (partial prefix-cache hits)")
        mode = EvictionMode.parse(
            prefix_eviction if prefix_eviction is not None else (
                os.environ.get(ENV_PREFIX_EVICTION) or DEFAULT_EVICTION
            )
        )
        self._mode = mode  # read by _appends_carry_hints during the range manager's __init__
        # The range manager under it: vLLM's coordinator and pool without their prefix cache (nothing of
        # them is used for caching here), then caching switched on for the scheduler-facing contract.
        arguments["enable_caching"] = False
        super().__init__(**arguments, placement_policy=placement)
        if self._reserve:  # RESERVE's admission (a declined first append) is the range manager's path only
            raise TagmaUnsupported(
                f"{ENV_PLACEMENT}=reserve with prefix caching on (use it with caching off)"
            )
        self.enable_caching = True
        if mode == EvictionMode.CONTIGUOUS and self.policy != Policy.HEADROOM:
            raise TagmaUnsupported(
                f"{ENV_PLACEMENT}={self.policy.name.lower()} with {ENV_PREFIX_EVICTION}=contiguous (its "
                "placement is its own: headroom with the neighbours' growth hints); use headroom or lru"
            )
        self.index = PrefixIndex(self.engine, self.block_size, mode)
        self.prefix_eviction = mode.name.lower()
        self._f_stats = self.engine._f_stats
        self._stats = self.engine._stats
        self._stats_p = self.engine._stats_p
        self._max_hit = max(self.block_pool.num_gpu_blocks - 1, 0)
        (single,) = self.coordinator.single_type_managers
        single.num_cached_block = RefusedPerRequestMap("num_cached_block", "block bookkeeping")
        self._default_ns = self.index.namespace((None, None, None))
        self._ns: dict[str, int] = {}  # request id -> namespace of its blocks
        self._indexed: dict[str, int] = {}  # request id -> full blocks asked to be indexed (_LOST: none)
        self._hashed_warned = False
        # inserts waiting for the queued appends: request id -> (request, full blocks to index)
        self._p_insert: dict[str, tuple[Request, int]] = {}
        # A deferred free (pop_blocks_for_free) releases through the pool: recount the free blocks after.
        pool = self.block_pool
        pool_free_blocks = pool.free_blocks

        def free_blocks(ordered_blocks: Any) -> None:
            if self._p_reqs or self._p_insert:
                self._flush()  # the free count is then read from the engine
            pool_free_blocks(ordered_blocks)
            self._sync_free()

        pool.free_blocks = free_blocks  # type: ignore[method-assign]
        pool.get_cached_block = _no_hash_lookups  # type: ignore[method-assign]

    def _appends_carry_hints(self) -> bool:
        """Contiguity-aware eviction: every append carries its growth hint (the blocks prompt + max_tokens
        still need), and the engine places a new range where the hint fits, over cached blocks if need be,
        so the request then grows in place. LRU keeps the range manager's placement (no hints). The batched
        call evicts as the index's mode says."""
        return self._mode != EvictionMode.LRU

    # ---- namespaces

    def _namespace(self, request: Request) -> int:
        return request_namespace(self.index, self._default_ns, request)

    # ---- free count

    def _sync_free(self) -> None:
        """vLLM's free count (free + cache-only blocks) from the engine, after releases and attaches (blocks
        shared with other requests make the change not the request's own count). Nothing may be queued."""
        status = self._f_stats(self._h, self._stats_p)
        if status:
            _raise(self._lib, status)
        self.block_pool._num_free = self._stats.free_blocks + self._stats.cached_only_blocks

    # ---- lookup

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None, *args: Any, **kwargs: Any
    ) -> tuple[KVCacheBlocks, int, int]:
        """The longest cached prefix, in whole blocks, of at most ``max_cache_hit_length`` tokens (vLLM 0.33:
        a cap the scheduler passes, e.g. to the outputs kept beside the cache; default: all but the last
        prompt token, whose logits must be computed)."""
        if request._block_hasher is not None:
            if len(request.block_hashes) < request.num_tokens // self.block_size:
                raise TagmaUnsupported(LOOKAHEAD_HASHES)
            if not self._hashed_warned:
                self._hashed_warned = True  # the hook did not apply: correct, but the hashing cost is back
                logger.warning("%s: %s", HASHED_REQUEST_WARNING, request.request_id)
        if request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        if self._p_reqs or self._p_insert:
            self._flush()  # the index as vLLM's prefix cache is now: every earlier allocation's blocks cached
        bs = self.block_size
        max_tokens = request.num_tokens - 1
        if max_cache_hit_length is not None and max_cache_hit_length < max_tokens:
            max_tokens = max_cache_hit_length
        max_blocks = max_tokens // bs
        if max_blocks > self._max_hit:
            max_blocks = self._max_hit  # no hit can be longer than the pool
        if max_blocks <= 0:
            return self.empty_kv_cache_blocks, 0, 0
        # the token list is read in C (no per-token Python work), only its first max_blocks blocks
        ids = self.index.lookup_ids(self._namespace(request), request._all_token_ids, max_blocks)
        if self.use_eagle and len(ids):
            ids = ids[:-1]  # vLLM's EAGLE drop: the drafter recomputes the last hit block's hidden states
        if not len(ids):
            return self.empty_kv_cache_blocks, 0, 0
        return HitBlocks(ids, self.block_pool), len(ids) * bs, 0

    def _evictable(self, hits: KVCacheBlocks | None, count: int) -> int:
        """How many hit blocks are cache-only (not in use): vLLM counts those against the free blocks."""
        if not count:
            return 0
        if isinstance(hits, HitBlocks):
            ids = hits.ids[:count]
        else:
            ids = np.asarray(hits.get_block_ids()[0][:count], dtype=np.int64)  # type: ignore[union-attr]
        self._flush()
        req_refs, _ = self.engine.block_state()
        return int(np.count_nonzero(req_refs[ids] == 0))

    # ---- allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        **kwargs: Any,
    ) -> KVCacheBlocks | None:
        if num_encoder_tokens:
            raise TagmaUnsupported("encoder tokens (cross-attention)")
        if num_new_tokens == 0 and not num_external_computed_tokens and not num_new_computed_tokens:
            raise ValueError(NO_TOKENS_MESSAGE)
        bs = self.block_size
        rid = request.request_id
        held = self._held.get(rid, 0)
        hits = num_new_computed_tokens // bs
        if hits * bs != num_new_computed_tokens:
            raise ValueError(f"{num_new_computed_tokens} prefix-hit tokens are not whole blocks of {bs}")
        if hits and held:
            raise ValueError(f"request {rid} already holds blocks: no new prefix-cache hit can be adopted")
        if hits and (new_computed_blocks is None or len(new_computed_blocks) < hits):
            raise ValueError(f"{hits} hit blocks announced, {len(new_computed_blocks or ())} given")
        max_len = self.max_model_len
        computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        if computed > max_len:
            computed = max_len
        need_tokens = computed + num_new_tokens + num_lookahead_tokens
        if need_tokens > max_len:
            need_tokens = max_len
        need = -(-need_tokens // bs) - held - hits
        if need < 0:
            need = 0
        pool = self.block_pool
        free = pool._num_free
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in WAITING_STATUSES else 0
        evictable = -1  # computed only when the check could fail on it
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            full_need = -(-full // bs) - held - hits
            if full_need < 0:
                full_need = 0
            if full_need + hits + watermark > free:
                evictable = self._evictable(new_computed_blocks, hits)
                if full_need + evictable + watermark > free:
                    return None
        if need + hits + watermark > free - reserved_blocks:
            if evictable < 0:
                evictable = self._evictable(new_computed_blocks, hits)
            if need + evictable + watermark > free - reserved_blocks:
                return None
        blocks: KVCacheBlocks = self.empty_kv_cache_blocks
        if need or hits or num_external_computed_tokens:  # else a decode step within its last block
            if request.num_computed_tokens == 0 and held == 0:
                self._ns[rid] = self._namespace(request)
            eng = pool._engine_reqs.get(rid)
            if eng is None and rid in self._p_new:  # its engine request is queued for creation: apply it
                self._flush()
                eng = pool._engine_reqs[rid]
            if hits:
                if eng is None:
                    eng = self._create(rid)  # the hit is attached now (one index walk), before any append
                self._attach(request, eng, hits)
            if num_external_computed_tokens:
                external = -(-computed // bs) - held - hits
                if external > 0:
                    if eng is None:
                        eng = self._create(rid)
                    zero = self._zeroing and 0 not in kwargs.get("skip_zeroing_group_ids", ())
                    self._queue(rid, eng, external, None, zero)
                    need -= external
            if need > 0:
                hint = 0
                if self._hinted:
                    total = request.num_prompt_tokens + (request.max_tokens or 0)
                    hint = -(-(total if total < max_len else max_len) // bs) - self._held.get(rid, 0)
                view = RangeBlocks(None, need, self._table, pool, self)
                self._queue(rid, eng or 0, need, view, True, hint)
                blocks = view
        if not delay_cache_blocks:
            cache_to = computed + num_new_tokens
            if cache_to > request.num_tokens:
                cache_to = request.num_tokens
            if cache_to // bs > self._indexed.get(rid, 0):
                # indexed when the queued appends are applied (the blocks must exist in the engine)
                self._p_insert[rid] = (request, cache_to // bs)
        return blocks

    def _flush(self) -> None:
        """Apply the queued appends (one engine call, which evicts cached blocks as the index's mode says),
        then the queued inserts into the prefix index."""
        if self._p_reqs:
            super()._flush()
        if self._p_insert:
            pending, self._p_insert = self._p_insert, {}
            engine_reqs = self.block_pool._engine_reqs
            for rid, (request, full) in pending.items():
                self._insert(request, engine_reqs.get(rid), full)

    def _attach(self, request: Request, eng: int, hits: int) -> None:
        """Attach the request's first ``hits`` cached blocks (one index walk) and recount the free blocks."""
        rid = request.request_id
        if self._p_reqs or self._p_insert:
            self._flush()  # the free count below is read from the engine
        got = self.index.lookup_attach(self._ns[rid], eng, request._all_token_ids, hits)
        if got != hits:
            self.engine.release(eng)
            del self.block_pool._engine_reqs[rid]
            raise RuntimeError(f"tagma: prefix hit of {hits} blocks changed to {got} before it was attached")
        self._held[rid] = hits
        self._indexed[rid] = hits
        self._sync_free()

    def _insert(self, request: Request, eng: int | None, full: int) -> None:
        """Index the request's full blocks up to ``full`` (those not indexed yet)."""
        rid = request.request_id
        if eng is None:
            return
        bs = self.block_size
        start = self._indexed.get(rid, 0)
        ns = self._ns.get(rid)
        if ns is None:
            ns = self._ns[rid] = self._namespace(request)
        indexed = self.index.insert(ns, eng, request._all_token_ids, start * bs, full * bs)
        self._indexed[rid] = full if indexed >= full else _LOST

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        rid = request.request_id
        full = num_computed_tokens // self.block_size
        if full > self._held.get(rid, 0):
            full = self._held.get(rid, 0)
        if full > self._indexed.get(rid, 0):
            self._flush()
            self._insert(request, self.block_pool._engine_reqs.get(rid), full)

    # ---- free

    def free(self, request: Request) -> None:
        if self._p_reqs or self._p_insert:
            self._flush()  # the request may have queued blocks or inserts
        rid = request.request_id
        self._indexed.pop(rid, None)
        self._ns.pop(rid, None)
        self._held.pop(rid, None)
        eng = self.block_pool._engine_reqs.pop(rid, None)
        if eng is not None:
            status = self._f_release(self._h, eng)
            if status:
                _raise(self._lib, status)
            self._sync_free()

    def pop_blocks_for_free(self, request: Request) -> Any:
        self._flush()
        rid = request.request_id
        self._indexed.pop(rid, None)
        self._ns.pop(rid, None)
        return super().pop_blocks_for_free(request)

    # ---- the rest of the contract

    def estimate_cached_tokens(self, request: Request) -> int:
        indexed = self._indexed.get(request.request_id, 0)
        return 0 if indexed == _LOST else indexed * self.block_size

    def reset_prefix_cache(self) -> bool:
        self._flush()
        used = self.block_pool.num_gpu_blocks - 1 - self.block_pool._num_free
        if used:
            logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", used)
            return False
        self.index.clear()
        self._indexed.clear()
        self._sync_free()
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: set[int]) -> None:
        raise TagmaUnsupported("evict_blocks by block id (KV connectors) with tagma's prefix index")

    def take_events(self) -> list[Any]:
        return []  # KV events are refused at startup

    def prefix_stats(self) -> dict[str, int]:
        """The prefix index's state and counters (lookups, hits, inserts, evictions, ...)."""
        return dataclasses.asdict(self.index.stats())
