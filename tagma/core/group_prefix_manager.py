"""Prefix caching across KV cache groups: full attention beside sliding windows (gpt-oss, Gemma 3) or chunked
local attention (Llama 4), and sliding windows alone (Mistral).

:class:`GroupPrefixKVCacheManager` is the group manager (:mod:`tagma.core.group_range_manager`: one engine
request per (request, group), a window's start advancing with one engine call) plus the engine's hash-less
prefix index for the full-attention group and the index's *side groups* for the windows
(:mod:`tagma.engine.prefix_side`): a window group's cached block is kept at the full group's trie node of the
same logical position, as vLLM keys it by (block hash, group). No vLLM block hash is computed.
Where every layer slides there is no full group to key by: each window group's cached block is found by a
chained content key instead (:mod:`tagma.engine.prefix_keyed`: one 128-bit key per block, chained over the
request's blocks from its namespace as vLLM chains its block hashes, the block's tokens compared on a hit).

vLLM's rules (``HybridKVCacheCoordinator``, ``SlidingWindowManager``, vLLM 0.32) are kept where the scheduler
can see them:

* the hit: the full group's longest cached prefix (left to right), then each window spec group scans right to
  left for the last ``cdiv(window - 1, block)`` blocks all cached (else the run from block 0), groups of one
  spec jointly, to a fixed point; the full group's hit is cut to the result;
* what a window caches: vLLM's own ``reachable_block_mask`` with the configured
  ``prefix_cache_retention_interval`` (default 0: the tail before each replay boundary, ``num_prompt - 1``,
  and before a shared-prefix junction), so the blocks a later request can hit are the same;
* ``shared_prefix_boundary``: the longest single-group hit when a window lags the full group;
* admission: vLLM's per-group arithmetic, cache-only hit blocks counted against the free blocks; the hit's
  window blocks before the window are not attached (vLLM pads them with the null block).

* a chunked local attention group (Llama 4's RoPE layers) beside the full group: a side group like a window,
  every block cached (vLLM's dense mask), its hit ``ChunkedLocalAttentionManager``'s: null blocks before the
  chunk the candidate ends in, then the cached run from there;
* an EAGLE drafter (``use_eagle``): vLLM's rule in each EAGLE group: the hit's last block dropped, a window's
  run one block longer, after looking one block past the candidate (the hybrid coordinator's margin) and
  once per candidate length; a window's retention shifted by that block and the replay boundaries moved back.

* state groups (Qwen3-Next's Gated DeltaNet, vLLM's mamba cache mode "align") beside the full group: a
  side group like a window with a run of one block (:mod:`tagma.core.state_checkpoints`).

Scope: at most one full-attention group (its trie keys the windows' blocks; without one, content keys do),
sliding-window groups, chunked and state groups beside the full group, one block size, LRU or contiguous
eviction. Refused by name: chunked or state groups with no full group or beside an EAGLE drafter, state
groups with speculative or prefill checkpoint blocks, KV events (no hashes to publish).
``estimate_cached_tokens`` (a prefill statistic) reports the full group's cached prefix.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import vllm
from vllm.v1.core.kv_cache_coordinator import replay_boundaries
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

from tagma.contract import DEFAULT_PREFIX_EVICTION, ENV_PREFIX_EVICTION
from tagma.core.group_hits import GroupHitBlocks, eagle_groups, hit_length, reconcile, run_blocks
from tagma.core.group_range_manager import GroupRangeKVCacheManager, GroupRangeRelease, _Held
from tagma.core.manager import NO_TOKENS_MESSAGE, SIGNATURE, WAITING_STATUSES, TagmaKVCacheManager
from tagma.core.prefix_manager import _no_hash_lookups, request_namespace
from tagma.core.state_checkpoints import StateCheckpoints, StateHeld, state_groups, state_refusal
from tagma.engine.prefix_index import EvictionMode, PrefixIndex
from tagma.engine.prefix_keyed import KeyArray, PrefixKeyedGroups
from tagma.engine.prefix_side import PrefixSideGroups
from tagma.errors import TagmaUnsupported

__all__ = ["GroupHitBlocks", "GroupPrefixKVCacheManager", "GroupPrefixRelease"]

_LOST = 1 << 62  # the full group's walk was lost (its node evicted): nothing more is cached for the request
# vLLM 0.33's cache_blocks also keeps an EAGLE window's tail one block below a shared-prefix junction (a
# sibling that diverges right after the junction has no peek block there); 0.32 keeps the junction's only.
_EAGLE_JUNCTION_BELOW = tuple(int(part) for part in vllm.__version__.split(".")[:2]) >= (0, 33)


def _sync_free(pool: Any) -> None:
    """vLLM's free count (free + cache-only blocks) from the engine, after releases and attaches (blocks
    shared with other requests' hits make the change differ from the request's own count)."""
    stats = pool.engine.stats()
    pool._num_free = stats.free_blocks + stats.cached_only_blocks


class GroupPrefixRelease(GroupRangeRelease):
    """A request's engine requests, released later; the free count is then read from the engine (blocks
    shared with other requests' hits stay in use)."""

    __slots__ = ()

    def release(self, pool: Any) -> None:
        engine_requests, self.engine_requests = self.engine_requests, ()
        for eng in engine_requests:
            pool.engine.release(eng)
        if engine_requests:
            _sync_free(pool)


class GroupPrefixKVCacheManager(GroupRangeKVCacheManager):
    """``KVCacheManager`` for prefix caching on over one full-attention group and sliding-window groups.

    Built through :func:`tagma.core.registry.build_kv_cache_manager` (vLLM's arguments; ``prefix_eviction``:
    ``lru`` | ``contiguous``, default ``$TAGMA_PREFIX_EVICTION`` or lru).
    """

    uses_block_hashes = False  # the engine core builds requests without vLLM's block hasher
    SERVED_SPECS = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)
    SERVED_MANAGERS = (FullAttentionManager, SlidingWindowManager, ChunkedLocalAttentionManager, MambaManager)
    # An EAGLE drafter beside the groups (its layer takes the target's window: a window group): vLLM's EAGLE
    # rule in its EAGLE groups (every group, as vLLM marks none for a drafter): a hit's last block dropped
    # (after looking one block past it where the hybrid coordinator does), a window's run one block longer,
    # its retention shifted by that block, the replay boundaries of use_eagle.
    SERVES_EAGLE = True

    @classmethod
    def unsupported(cls, kv_cache_config: KVCacheConfig, args: dict[str, Any]) -> str | None:
        groups = kv_cache_config.kv_cache_groups
        feature = TagmaKVCacheManager.unsupported.__func__(cls, kv_cache_config, args)  # type: ignore[attr-defined]
        if feature is not None:
            return feature
        fulls = sum(type(g.kv_cache_spec) is FullAttentionSpec for g in groups)
        states = [g.kv_cache_spec for g in groups if isinstance(g.kv_cache_spec, MambaSpec)]
        if states:
            feature = state_refusal(states, fulls, bool(eagle_groups(kv_cache_config, args)))
            if feature is not None:
                return feature
        if any(isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) for g in groups):
            if not fulls:
                return (
                    "chunked local attention with prefix caching and no full-attention group (tagma keys a "
                    "chunked group's cached blocks at the full group's prefix index)"
                )
            if eagle_groups(kv_cache_config, args):  # vLLM's chunked hit rule asserts no EAGLE drop
                return "an EAGLE drafter beside chunked local attention with prefix caching (no vLLM rule)"
        if fulls > 1:
            return f"prefix caching with {fulls} full-attention KV cache groups (tagma's index keys one)"
        if len({g.kv_cache_spec.block_size for g in groups}) > 1:
            return "prefix caching with KV cache groups of different block sizes"
        if args.get("enable_kv_cache_events"):
            return "KV cache events with prefix caching (tagma's prefix index has no block hashes to publish)"
        return None

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        *args: Any,
        prefix_eviction: str | int | None = None,
        **kwargs: Any,
    ) -> None:
        bound = SIGNATURE.bind(None, kv_cache_config, max_model_len, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        if not arguments.get("enable_caching", True):
            raise ValueError("tagma: GroupPrefixKVCacheManager serves prefix caching on only")
        feature = self.unsupported(kv_cache_config, arguments)
        if feature is not None:
            raise TagmaUnsupported(feature)
        mode = EvictionMode.parse(
            prefix_eviction
            if prefix_eviction is not None
            else (os.environ.get(ENV_PREFIX_EVICTION) or DEFAULT_PREFIX_EVICTION)
        )
        # The group manager under it: vLLM's coordinator without its prefix cache (its arithmetic is used,
        # never its caching), then caching switched on for the scheduler-facing contract.
        arguments["enable_caching"] = False
        super().__init__(**arguments)
        self.enable_caching = True
        groups = kv_cache_config.kv_cache_groups
        self._bs = self._block_sizes[0]
        # the full-attention group whose trie keys the windows' blocks (None: every layer slides)
        self._full: int | None = next(
            (g for g, grp in enumerate(groups) if type(grp.kv_cache_spec) is FullAttentionSpec), None
        )
        self._side = {g: k for k, g in enumerate(self._windows)}  # vLLM group -> side group
        # vLLM's spec groups: window groups of equal spec are looked up jointly, and take the EAGLE drop if
        # any member is an EAGLE group (vLLM propagates the flag to every member)
        eagle = eagle_groups(kv_cache_config, arguments)
        spec_groups: list[tuple[Any, list[int]]] = []
        for g in self._windows:
            spec = groups[g].kv_cache_spec
            for other, members in spec_groups:
                if other == spec:
                    members.append(g)
                    break
            else:
                spec_groups.append((spec, [g]))
        drops = [any(g in eagle for g in members) for _, members in spec_groups]
        # (blocks a window's or state group's hit needs, members' side groups, EAGLE drop, chunk tokens or 0)
        self._spec_groups = tuple(
            (0, tuple(self._side[g] for g in members), drop, spec.attention_chunk_size)
            if isinstance(spec, ChunkedLocalAttentionSpec)
            else (run_blocks(spec, self._bs), tuple(self._side[g] for g in members), drop, 0)
            for (spec, members), drop in zip(spec_groups, drops, strict=True)
        )
        self._spec_of_side = {k: i for i, (_, members, _, _) in enumerate(self._spec_groups) for k in members}
        # per window group (vLLM's id): its manager's use_eagle, which shifts what it caches
        self._eagle_window = {g: drop for (_, members), drop in zip(spec_groups, drops, strict=True)
                              for g in members}  # fmt: skip
        self._eagle_full = self._full is not None and self._full in eagle
        self._eagle_any = bool(eagle)  # vLLM's replay boundaries shift when any group is an EAGLE group
        self._eagle_margin = self._eagle_any and len(groups) > 1  # the hybrid coordinator's (not unitary's)
        # state groups: side groups for the lookup, cached by StateCheckpoints (mode align: all but lookup)
        states, aligned = state_groups(kv_cache_config)
        self._aligned = frozenset(aligned)
        self._states = StateCheckpoints(self, states, aligned)
        self._window_info = tuple(w for w in self._window_info if w[0] not in self._aligned)
        self._gids = range(len(groups))
        self._retention = getattr(kv_cache_config, "prefix_cache_retention_interval", 0)
        self.index = PrefixIndex(self.engine, self._bs, mode)
        sides = PrefixSideGroups if self._full is not None else PrefixKeyedGroups
        self.sides = sides(self.index, len(self._windows))
        self._chain: dict[str, KeyArray] = {}  # content keys: per request, the key of its last cached block
        self._lookup_memo: dict[str, tuple[KeyArray, np.ndarray]] = {}  # content keys: waiting requests'
        self.prefix_eviction = mode.name.lower()
        self._max_hit = max(self.block_pool.num_gpu_blocks - 1, 0)
        self._default_ns = self.index.namespace((None, None, None))
        self._ns: dict[str, int] = {}
        self._cached: dict[str, int] = {}  # vLLM's num_cached_block (one for every group); _LOST: no more
        pool = self.block_pool
        pool.get_cached_block = _no_hash_lookups  # type: ignore[method-assign]

    # ---- free count

    def _sync_free(self) -> None:
        _sync_free(self.block_pool)

    def _free_skipped(self, state: list[_Held], processed: int) -> bool:
        freed = super()._free_skipped(state, processed)
        if self._aligned and self._states.free_skipped(state, processed):
            self._fresh = None
            freed = True
        if freed:
            self._sync_free()
        return freed

    # ---- lookup

    def _skipped_blocks(self, g: int, hit: int, starts: dict[int, int]) -> int:
        """Blocks of a hit of ``hit`` blocks that group g does not need (vLLM's null padding): a window's
        before its window; a chunked group's before the chunk its lookup started in (``starts``)."""
        window, chunk = self._info[g][0]
        if chunk:
            return starts[self._spec_of_side[self._side[g]]]
        skipped = (hit * self._bs - window + 1) // self._bs
        return skipped if skipped > 0 else 0

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None, *args: Any, **kwargs: Any
    ) -> tuple[KVCacheBlocks, int, int]:
        if request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        bs = self._bs
        max_tokens = request.num_tokens - 1
        if max_cache_hit_length is not None and max_cache_hit_length < max_tokens:
            max_tokens = max_cache_hit_length
        max_blocks = min(max_tokens // bs, self._max_hit)
        if max_blocks <= 0:
            return self.empty_kv_cache_blocks, 0, 0
        keys = None
        # EAGLE groups look one block past the longest hit allowed (the hybrid coordinator's margin, within
        # the request's full blocks; vLLM's unitary coordinator of one group has none), then drop one
        look = max_blocks
        if self._eagle_margin and look < request.num_tokens // bs and look < self._max_hit:
            look += 1
        if self._full is None:  # every layer slides: each group's blocks by content key
            keys, tokens = self._waiting_keys(request, look)
            sides = [self.sides.lookup_keyed(k, keys, tokens) for k in range(len(self._windows))]
            nodes = None
            limit = max_blocks
        else:
            nodes = self.index.lookup_ids(self._namespace(request), request._all_token_ids, look)
            if not len(nodes):
                return self.empty_kv_cache_blocks, 0, 0
            sides = [self.sides.lookup(k, nodes) for k in range(len(self._windows))]
            limit = len(nodes)
            if self._eagle_full:
                limit -= 1
            elif limit > max_blocks:
                limit = max_blocks
        hit, longest, starts = reconcile(self._spec_groups, limit, sides, self._full is None, bs)
        boundary = longest * bs if longest > hit else 0
        if not hit:
            return self.empty_kv_cache_blocks, 0, boundary
        groups = []
        for g in range(len(self._managers)):
            if g == self._full:
                groups.append((0, nodes[:hit]))
            else:
                skipped = self._skipped_blocks(g, hit, starts)
                groups.append((skipped, sides[self._side[g]][skipped:hit]))
        return GroupHitBlocks(tuple(groups), self.block_pool, keys), hit * bs, boundary

    def _waiting_keys(self, request: Request, blocks: int) -> tuple[KeyArray, np.ndarray]:
        """The content keys and tokens of a waiting request's first ``blocks`` blocks, hashed once: the
        scheduler looks a waiting request up at every step it stays waiting, and its leading tokens never
        change (vLLM hashes a request's blocks once too). Kept until the request is allocated or freed."""
        rid = request.request_id
        memo = self._lookup_memo.get(rid)
        if memo is None or len(memo[0]) < blocks:
            tokens = self.index.tokens_array(request._all_token_ids, 0, blocks * self._bs)
            memo = self._lookup_memo[rid] = (self.sides.keys(self._namespace(request), tokens), tokens)
        keys, tokens = memo
        return keys[:blocks], tokens[: blocks * self._bs]

    def _namespace(self, request: Request) -> int:
        return request_namespace(self.index, self._default_ns, request)

    # ---- allocation

    def _evictable(self, hits: GroupHitBlocks) -> int:
        """Hit blocks no request uses (cache-only): vLLM counts those against the free blocks."""
        ids = np.concatenate([ids for _, ids in hits.groups])
        req_refs, _ = self.engine.block_state()
        return int(np.count_nonzero(req_refs[ids] == 0))

    def _num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any = (),
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        *args: Any,
        apply_admission_cap: bool = False,
        **kwargs: Any,
    ) -> int:
        """The coordinator's count, which the scheduler asks directly (with no hit blocks)."""
        if new_computed_blocks and any(len(group) for group in new_computed_blocks):
            raise TagmaUnsupported("prefix-cache hit blocks passed to the coordinator's count")
        state = self._reqs.get(request_id)
        return self._to_allocate(state, num_tokens, total_computed_tokens, apply_admission_cap)

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
        if num_external_computed_tokens:
            raise TagmaUnsupported("KV connector tokens (external computed tokens)")
        if num_new_tokens == 0 and not num_new_computed_tokens:
            raise ValueError(NO_TOKENS_MESSAGE)
        bs = self._bs
        rid = request.request_id
        state = self._reqs.get(rid)
        hit = num_new_computed_tokens // bs
        if hit * bs != num_new_computed_tokens:
            raise ValueError(f"{num_new_computed_tokens} prefix-hit tokens are not whole blocks of {bs}")
        if hit and state is not None:
            raise ValueError(f"request {rid} already holds blocks: no new prefix-cache hit can be adopted")
        if hit and (not isinstance(new_computed_blocks, GroupHitBlocks)
                    or hit_length(new_computed_blocks.groups[self._full or 0]) < hit):  # fmt: skip
            raise ValueError(f"{hit} hit blocks announced, not given as this manager's hit")
        if hit and self._states.groups and self._states.deferred(new_computed_blocks, self._full, hit):
            return None  # the hit's state is written by this step's forward: vLLM waits a step
        max_len = self.max_model_len
        computed = request.num_computed_tokens + num_new_computed_tokens
        if computed > max_len:
            computed = max_len
        pool = self.block_pool
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in WAITING_STATUSES else 0
        # vLLM counts the cache-only hit blocks against the free blocks; counted only where the check could
        # fail on them (every hit block counted is the most they can be)
        hit_ids = sum(len(ids) for _, ids in new_computed_blocks.groups) if hit else 0  # type: ignore[union-attr]
        evictable = -1
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            full_need = self._to_allocate(state, full, computed, True, hit, full) + watermark
            if full_need + hit_ids > pool._num_free:
                evictable = self._evictable(new_computed_blocks) if hit else 0  # type: ignore[arg-type]
                if full_need + evictable > pool._num_free:
                    return None
        need_tokens = computed + num_new_tokens + num_lookahead_tokens
        if need_tokens > max_len:
            need_tokens = max_len
        if state is not None and self._windows:
            processed = computed - request.num_in_flight_tokens
            self._free_skipped(state, processed if processed > 0 else 0)
        main = computed + num_new_tokens
        need = self._to_allocate(state, need_tokens, computed, False, hit, main)
        if need + hit_ids + watermark > pool._num_free - reserved_blocks:
            if evictable < 0:
                evictable = self._evictable(new_computed_blocks) if hit else 0  # type: ignore[arg-type]
            if need + evictable + watermark > pool._num_free - reserved_blocks:
                return None
        new = state is None
        if state is None:
            self._lookup_memo.pop(rid, None)
            state = self._reqs[rid] = [(StateHeld if g in self._aligned else _Held)() for g in self._gids]
            self._ns[rid] = self._namespace(request)
            self._cached[rid] = 0
            if hit:
                self._attach(request, state, new_computed_blocks, hit)  # type: ignore[arg-type]
        view = self.empty_kv_cache_blocks
        if need:
            view = self._append(rid, state, need_tokens, new and not hit, main)
        if not delay_cache_blocks:
            cache_to = computed + num_new_tokens
            if cache_to > request.num_tokens:
                cache_to = request.num_tokens
            self._cache(request, state, cache_to // bs)
        return view

    def _attach(self, request: Request, state: list[_Held], hits: GroupHitBlocks, hit: int) -> None:
        """Give a new request its hit in every group (the full group by one index walk, each window its
        run of side blocks after the blocks it skips) and recount the free blocks."""
        engine = self.engine
        gt = self.group_time
        for g, (dropped, ids) in enumerate(hits.groups):
            t0 = gt.start() if gt is not None else 0
            held = state[g]
            held.engine_request = engine.create_request()
            if g == self._full:
                got = self.index.lookup_attach(self._ns[request.request_id], held.engine_request,
                                               request._all_token_ids, hit)  # fmt: skip
                if got != hit:
                    raise RuntimeError(f"tagma: prefix hit of {hit} blocks changed to {got} before attaching")
                held.held = hit
            elif g in self._aligned:
                self._states.attach(held, dropped, ids)  # type: ignore[arg-type]
            else:
                self.sides.attach(held.engine_request, ids)
                held.dropped = dropped
                held.held = len(ids)
            if gt is not None:
                gt.stop(g, t0)
        self._cached[request.request_id] = hit
        if hits.keys is not None:
            self._chain[request.request_id] = hits.keys[hit - 1].copy()
        self._fresh = None
        self._sync_free()

    def _cache(self, request: Request, state: list[_Held], full_blocks: int) -> None:
        """vLLM's ``cache_blocks`` up to ``full_blocks``: the full group's blocks into the index, each
        window's reachable blocks (vLLM's mask) at the full group's nodes."""
        rid = request.request_id
        start = self._cached.get(rid, _LOST)
        if full_blocks <= start:
            return self._states.remark(request, state, full_blocks) if self._aligned else None
        bs = self._bs
        gt = self.group_time
        full = None
        if self._full is None:
            t0 = gt.start() if gt is not None else 0
            keys, tokens = self._chain_keys(request, start, full_blocks)
            indexed = full_blocks
            if gt is not None:
                gt.stop(self._windows[0], t0)  # the keys serve every group: charged to the first
        else:
            full = state[self._full]
            if not full.engine_request:
                return
            t0 = gt.start() if gt is not None else 0
            indexed = self.index.insert(self._ns[rid], full.engine_request, request._all_token_ids,
                                        start * bs, full_blocks * bs)  # fmt: skip
            if gt is not None:
                gt.stop(self._full, t0)
        boundaries = list(replay_boundaries(request.num_prompt_tokens, bs, use_eagle=self._eagle_any))
        junction = getattr(request, "shared_prefix_boundary", 0)
        if junction:
            boundaries.append(junction)
        if self._states.groups and full is not None and full.engine_request:
            self._states.cache(request, state, full.engine_request, start, full_blocks, boundaries,
                               self._retention)  # fmt: skip
            self._states.remark(request, state, full_blocks)
        for g in self._windows:
            held = state[g]
            if not held.engine_request or g in self._states.groups:
                continue
            t0 = gt.start() if gt is not None else 0
            single = self._managers[g]
            reachable = boundaries
            if junction and _EAGLE_JUNCTION_BELOW and self._eagle_window[g]:
                reachable = [*boundaries, junction - bs]
            mask = single.reachable_block_mask(
                start_block=start,
                end_block=full_blocks,
                alignment_tokens=bs,
                kv_cache_spec=single.kv_cache_spec,
                use_eagle=self._eagle_window[g],
                retention_interval=self._retention,
                reachable_boundaries=reachable,
            )
            if mask is None or any(mask):
                bits = None if mask is None else np.asarray(mask)
                if full is None:
                    self.sides.insert_keyed(self._side[g], held.engine_request, held.dropped, start, keys,
                                            tokens, bits)  # fmt: skip
                else:
                    self.sides.insert(full.engine_request, self._side[g], held.engine_request, held.dropped,
                                      start, full_blocks, bits)  # fmt: skip
            if gt is not None:
                gt.stop(g, t0)
        self._cached[rid] = full_blocks if indexed >= full_blocks else _LOST

    def _chain_keys(self, request: Request, start: int, end: int) -> tuple[KeyArray, np.ndarray]:
        """The content keys and tokens of the request's blocks [start, end), the chain going on from its
        last cached block's key (from its namespace's start at block 0). A request that has cached blocks
        has its chain: ``_attach`` and this method set it whenever ``_cached`` moves past 0."""
        rid = request.request_id
        tokens = self.index.tokens_array(request._all_token_ids, start * self._bs, end * self._bs)
        keys = self.sides.keys(self._ns[rid], tokens, self._chain[rid] if start else None)
        self._chain[rid] = keys[-1].copy()
        return keys, tokens

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        state = self._reqs.get(request.request_id)
        if state is not None:
            self._cache(request, state, min(num_computed_tokens, request.num_tokens) // self._bs)

    # ---- free

    def free(self, request: Request) -> None:
        self._fresh = None
        rid = request.request_id
        self._ns.pop(rid, None)
        self._cached.pop(rid, None)
        self._chain.pop(rid, None)
        self._lookup_memo.pop(rid, None)
        state = self._reqs.pop(rid, None)
        if state is None:
            return
        gt = self.group_time
        for g, held in enumerate(state):
            t0 = gt.start() if gt is not None else 0
            if held.engine_request:
                self.engine.release(held.engine_request)
            if gt is not None:
                gt.stop(g, t0)
        self._sync_free()

    def pop_blocks_for_free(self, request: Request) -> GroupPrefixRelease:  # type: ignore[override]
        self._fresh = None
        rid = request.request_id
        self._ns.pop(rid, None)
        self._cached.pop(rid, None)
        self._chain.pop(rid, None)
        self._lookup_memo.pop(rid, None)
        state = self._reqs.pop(rid, None) or []
        engs = tuple(held.engine_request for held in state if held.engine_request)
        release = GroupPrefixRelease(engs, sum(held.held for held in state))
        if not release.num_blocks:
            release.release(self.block_pool)
        return release

    # ---- the rest of the contract

    def new_step_starts(self) -> None:
        self._states.this_step.clear()
        super().new_step_starts()

    def estimate_cached_tokens(self, request: Request) -> int:
        cached = self._cached.get(request.request_id, 0)
        return 0 if cached == _LOST else cached * self._bs

    def reset_prefix_cache(self) -> bool:
        pool = self.block_pool
        if pool.num_gpu_blocks - 1 - pool._num_free:  # blocks in use: vLLM's refusal too
            return False
        self.index.clear()
        self._sync_free()
        if self.log_stats and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: set[int]) -> None:
        raise TagmaUnsupported("evict_blocks by block id (KV connectors) with tagma's prefix index")

    def take_events(self) -> list[Any]:
        return []  # KV events are refused at startup

    def prefix_stats(self) -> dict[str, int]:
        """The prefix index's counters and its side groups' (``side_*``)."""
        stats = dataclasses.asdict(self.index.stats())
        stats.update({f"side_{k}": v for k, v in dataclasses.asdict(self.sides.stats()).items()})
        return stats
