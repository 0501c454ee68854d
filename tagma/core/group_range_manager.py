"""Range-native KV cache groups with prefix caching off: full-attention, sliding-window, chunked local
attention and state groups.

The manager for models whose layers give vLLM several KV cache groups (gpt-oss: window 128 + full; Gemma 3:
5 sliding : 1 full) or one sliding-window group (Mistral-style), prefix caching off. Each (request, group)
is one engine request in the one engine over vLLM's one block pool (every group's page is the same size, as
vLLM requires). A request's state is, per group, its engine request, the blocks it holds and how many leading
logical blocks it has dropped: no ``KVCacheBlock`` list and no ``null_block`` entries.

A sliding-window group's start advances (docs/KV_CACHE_GROUPS.md): before each allocation, the blocks vLLM's
``SlidingWindowManager.remove_skipped_blocks`` would free (wholly before the window of the next token, on the
processed-token basis) are released with one engine call, ``tagma_request_free_front``, which cuts the first
range; vLLM frees the same blocks one by one and writes ``null_block`` into their places. The arithmetic
(blocks needed, skipped tokens, the admission cap) is vLLM's own: this class calls the coordinator's
single-type managers for it and never touches their per-request state. So the blocks held, freed and
allocated per step, the admission decisions and the free count match vLLM's block for block; only which
physical blocks differs.

A chunked local attention group (Llama 4's RoPE layers: each token attends only within its chunk of
``attention_chunk_size`` tokens) is a window group whose start jumps: vLLM's ``ChunkedLocalAttentionManager``
skips every token before the current chunk (computed // chunk * chunk), so at each chunk boundary the request
releases the previous chunk's blocks with the same one engine call.

A state group (Mamba / Gated DeltaNet layers, ``MambaSpec`` in vLLM's cache mode "none", e.g. Qwen3-Next's
linear-attention layers) is the same arithmetic: vLLM's ``MambaManager`` keeps only the last computed token's
state (``get_num_skipped_tokens`` = computed - 1, the window formula with a window of 2), its block is
``mamba_block_size`` tokens (max_model_len by default, so one state block per request for its whole life) and
it allocates ``num_speculative_blocks`` blocks more. Cache mode "align" (prefix caching of states) is the
group prefix manager's (:mod:`tagma.core.state_checkpoints`): its state groups are ``_aligned`` here, and
``_states`` does their per-step arithmetic.

Block ids for the worker: a window or chunked group's row keeps the null block (id 0) where logical blocks
were dropped, as vLLM's does, followed by the live ranges.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
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

from tagma.core.block_pool import RangeRelease
from tagma.core.manager import NO_TOKENS_MESSAGE, WAITING_STATUSES, RefusedPerRequestMap, TagmaKVCacheManager
from tagma.core.range_manager import ids_from_runs
from tagma.errors import TagmaUnsupported

__all__ = ["GroupBlocks", "GroupRangeKVCacheManager", "GroupRangeRelease"]


class GroupRangeRelease(RangeRelease):
    """A whole request's blocks in every group, popped for a deferred free: its engine requests."""

    __slots__ = ("engine_requests",)

    def __init__(self, engine_requests: tuple[int, ...], num_blocks: int) -> None:
        super().__init__(None, num_blocks)
        self.engine_requests = engine_requests

    def release(self, pool: Any) -> None:
        engine_requests, self.engine_requests = self.engine_requests, ()
        for eng in engine_requests:  # a second free of the same release is a no-op
            pool.engine.release(eng)
        if engine_requests:
            pool._num_free += self.num_blocks

    def __repr__(self) -> str:
        return f"GroupRangeRelease(engine_requests={self.engine_requests}, num_blocks={self.num_blocks})"


class GroupBlocks(KVCacheBlocks):
    """A ``KVCacheBlocks`` over every group's runs of consecutive block ids, after its dropped blocks.

    ``groups[g]`` is (dropped, runs): ``dropped`` null blocks (a window group's released start), then the
    flat (start, count, ...) runs; or (None, ids), a row given whole (a state group's, with null blocks
    between its live ones). Block ids come out as one list slice of the id table per run;
    ``KVCacheBlock`` objects only if a caller asks for ``.blocks``.
    """

    __slots__ = ("_groups", "_null", "_pool", "_table")

    def __init__(self, groups: tuple[tuple[int | None, list[int]], ...], table: list[int], pool: Any) -> None:
        self._groups = groups  # no dataclass __init__: ``blocks`` is a property here
        self._table = table
        self._pool = pool
        self._null = pool.null_block.block_id

    def _ids(self, g: int) -> list[int]:
        dropped, runs = self._groups[g]
        if dropped is None:
            return runs
        ids = ids_from_runs(runs, self._table) if runs else []
        return [self._null] * dropped + ids if dropped else ids

    @property
    def blocks(self) -> tuple[list[KVCacheBlock], ...]:  # type: ignore[override]
        table = self._pool.blocks
        return tuple([table[i] for i in self._ids(g)] for g in range(len(self._groups)))

    def get_block_ids(  # type: ignore[override]
        self, allow_none: bool = False, *, group_ids: Any = None
    ) -> tuple[list[int], ...] | None:
        chosen = range(len(self._groups)) if group_ids is None else group_ids
        if allow_none and all(not self._groups[g][0] and not self._groups[g][1] for g in chosen):
            return None
        return tuple(self._ids(g) for g in chosen)

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        null = self._null
        return [
            [i for i in runs if i != null] if dropped is None else ids_from_runs(runs, self._table)
            for dropped, runs in self._groups
        ]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self._groups))

    def __repr__(self) -> str:
        return f"GroupBlocks({self._groups!r})"


def _skip_rule(single: Any) -> tuple[int, int] | None:
    """How many leading tokens a group skips after ``computed`` tokens, as (window, chunk): (window, 0) for
    SlidingWindowManager's computed - window + 1 (a window group's own window; 2 for a state group, whose
    MambaManager skips computed - 1), (0, chunk) for ChunkedLocalAttentionManager's computed // chunk * chunk,
    None for full attention (nothing skipped)."""
    if isinstance(single, MambaManager):
        return (2, 0)
    if isinstance(single, ChunkedLocalAttentionManager):
        return (0, single.attention_chunk_size)
    window = getattr(single, "sliding_window", None)
    return None if window is None else (window, 0)


def _extra_tokens(single: Any) -> int:
    """Slots a group allocates beyond the step's tokens: a state group's speculative blocks (MambaManager)."""
    if isinstance(single, MambaManager):
        return single.block_size * single.num_speculative_blocks
    return 0


class _Held:
    """One request's blocks in one group: its engine request (0: none yet), live blocks, dropped blocks."""

    __slots__ = ("dropped", "engine_request", "held")

    def __init__(self) -> None:
        self.engine_request = 0
        self.held = 0
        self.dropped = 0


class GroupRangeKVCacheManager(TagmaKVCacheManager):
    """``KVCacheManager``, prefix caching off, over full-attention, sliding-window, chunked local attention
    and state KV cache groups.

    Built through :func:`tagma.core.registry.build_kv_cache_manager` (vLLM's arguments).
    """

    SERVED_SPECS = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)
    SERVED_MANAGERS = (FullAttentionManager, SlidingWindowManager, ChunkedLocalAttentionManager, MambaManager)
    MAX_GROUPS = None
    # An EAGLE-family drafter beside the groups (its full-attention layer in a group of vLLM's grouping):
    # caching off, use_eagle changes no allocation, and the lookahead slots are taken in every group as
    # vLLM's managers take them (need_tokens below).
    SERVES_EAGLE = True
    # The in-server host time's per-group timer (tagma.probes.host_time_hooks.GroupClock: start() / stop(g,
    # t0) around each group's loop body); None, the default, times nothing.
    group_time: Any = None

    @classmethod
    def unsupported(cls, kv_cache_config: KVCacheConfig, args: dict[str, Any]) -> str | None:
        feature = super().unsupported(kv_cache_config, args)  # a group kind it never serves, by name
        if feature is None and args.get("enable_caching", True):
            feature = (
                "prefix caching with sliding-window or chunked local attention, state layers or several KV "
                "cache groups (tagma serves them with --no-enable-prefix-caching)"
            )
        if feature is not None:
            return feature
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(spec, MambaSpec) and (mode := spec.mamba_cache_mode) != "none":
                return f"state layers in mamba_cache_mode={mode!r} with caching off (served: 'none')"
        return None

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(kv_cache_config, max_model_len, *args, **kwargs)
        self._managers = tuple(self.coordinator.single_type_managers)
        for single in self._managers:
            single.req_to_blocks = RefusedPerRequestMap("req_to_blocks", "block lists")
        self._block_sizes = tuple(m.block_size for m in self._managers)
        # Per group: (skip rule or None, block size, vLLM's recycling-aware admission cap or None, extra
        # tokens). The skipped tokens of a window group are vLLM's SlidingWindowManager.get_num_skipped_tokens
        # with no extra retained tokens (refused): computed - window + 1 when positive; a chunked group's are
        # ChunkedLocalAttentionManager's, computed // chunk * chunk; a state group's are MambaManager's,
        # computed - 1 (a window of 2). Extra tokens: a state group's speculative blocks.
        self._info = tuple(
            (_skip_rule(m), m.block_size, m.max_admission_blocks_per_request, _extra_tokens(m))
            for m in self._managers
        )
        self._windows = tuple(g for g, info in enumerate(self._info) if info[0] is not None)
        # Per window, chunked or state group: (group, window, chunk, block size), the rule unpacked once.
        self._window_info = tuple((g, *self._info[g][0], self._info[g][1]) for g in self._windows)
        self._table: list[int] = [block.block_id for block in self.block_pool.blocks]
        self._fresh: tuple[str, GroupBlocks] | None = None  # the view of a request's first allocation
        self._zeroing = tuple(bool(m.records_new_block_ids) for m in self._managers)
        self._zero_ids: list[int] = []
        self._reqs: dict[str, list[_Held]] = {}
        self._null = self.block_pool.null_block
        # State groups in mamba cache mode "align" (prefix caching on only) and their arithmetic
        # (tagma.core.state_checkpoints.StateCheckpoints), set by the group prefix manager
        self._aligned: frozenset[int] = frozenset()
        self._states: Any = None
        self.coordinator.get_num_blocks_to_allocate = self._num_blocks_to_allocate  # type: ignore[method-assign]

    # ---- vLLM's arithmetic, per group

    def _to_allocate(
        self,
        state: list[_Held] | None,
        num_tokens: int,
        computed: int,
        cap: bool,
        hit: int = 0,
        main_tokens: int | None = None,
    ) -> int:
        """Blocks to allocate for ``num_tokens`` slots: vLLM's ``get_num_blocks_to_allocate`` of each
        single-type manager, summed over the groups (``cap``: the recycling-aware admission cap; ``hit``: a
        new request's prefix-cache hit in blocks, which every group holds or skips; ``main_tokens``: the
        main model's tokens, without lookahead, where an aligned state group counts them)."""
        total = 0
        gt = self.group_time
        aligned = self._aligned
        for g, (rule, bs, limit, extra) in enumerate(self._info):
            t0 = gt.start() if gt is not None else 0
            if aligned and g in aligned:  # MambaManager, mode align: one block at most, past the whole row
                tokens = num_tokens if main_tokens is None else main_tokens
                length = state[g].dropped + state[g].held if state is not None else hit
                if -(-tokens // bs) > length:
                    total += 1
                if gt is not None:
                    gt.stop(g, t0)
                continue
            required = -(-(num_tokens + extra) // bs)
            if cap and limit is not None and limit < required:
                required = limit
            if state is not None:
                held = state[g]
                base = held.dropped + held.held
            else:
                base = hit
            if rule is not None:  # inline (a call per group per step costs): _skip_rule's formulas
                window, chunk = rule
                skipped = (computed // chunk * chunk if chunk else computed - window + 1) // bs
                if skipped > base:
                    base = skipped
            if required > base:
                total += required - base
            if gt is not None:
                gt.stop(g, t0)
        return total

    def _free_skipped(self, state: list[_Held], processed: int) -> bool:
        """Release each window (or chunked) group's blocks wholly before the next token's window (vLLM's
        ``remove_skipped_blocks``): one engine call per group whose window start crossed a block. Returns
        whether any block was released."""
        freed = False
        gt = self.group_time
        for g, window, chunk, bs in self._window_info:
            t0 = gt.start() if gt is not None else 0
            held = state[g]
            skipped = (processed // chunk * chunk if chunk else processed - window + 1) // bs
            if skipped > held.dropped:
                logical = held.dropped + held.held
                k = (skipped if skipped < logical else logical) - held.dropped
                if k > 0:
                    self.engine.free_front(held.engine_request, k)
                    held.held -= k
                    held.dropped += k
                    self.block_pool._num_free += k
                    self._fresh = None
                    freed = True
            if gt is not None:
                gt.stop(g, t0)
        return freed

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
        """The coordinator's count (the scheduler asks it directly), from this manager's state."""
        if new_computed_blocks and any(len(group) for group in new_computed_blocks):
            raise TagmaUnsupported("prefix-cache hits with prefix caching off")
        state = self._reqs.get(request_id)
        return self._to_allocate(state, num_tokens, total_computed_tokens, apply_admission_cap)

    # ---- the scheduler's calls

    def get_computed_blocks(
        self, request: Request, *args: Any, **kwargs: Any
    ) -> tuple[KVCacheBlocks, int, int]:
        return self.empty_kv_cache_blocks, 0, 0

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
        if num_new_computed_tokens:
            raise TagmaUnsupported("prefix-cache hits with prefix caching off")
        if num_external_computed_tokens:
            raise TagmaUnsupported("KV connector tokens (external computed tokens)")
        if num_new_tokens == 0:
            raise ValueError(NO_TOKENS_MESSAGE)
        rid = request.request_id
        state = self._reqs.get(rid)
        max_len = self.max_model_len
        computed = request.num_computed_tokens
        clamped = computed if computed < max_len else max_len
        pool = self.block_pool
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in WAITING_STATUSES else 0
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            if self._to_allocate(state, full, clamped, True) + watermark > pool._num_free:
                return None
        need_tokens = computed + num_new_tokens + num_lookahead_tokens
        if need_tokens > max_len:
            need_tokens = max_len
        if state is not None and self._windows:
            processed = clamped - request.num_in_flight_tokens
            self._free_skipped(state, processed if processed > 0 else 0)
        need = self._to_allocate(state, need_tokens, computed, False)
        if need + watermark > pool._num_free - reserved_blocks:
            return None
        new = state is None
        if state is None:
            state = self._reqs[rid] = [_Held() for _ in self._managers]
        if need == 0:
            return self.empty_kv_cache_blocks
        return self._append(rid, state, need_tokens, new)

    def _append(
        self, rid: str, state: list[_Held], need_tokens: int, fresh: bool, main_tokens: int | None = None
    ) -> GroupBlocks:
        """Each group's blocks for ``need_tokens`` slots beyond what it holds or dropped (an aligned state
        group's for ``main_tokens``); the view of the new blocks (kept for ``get_blocks`` when ``fresh``: the
        request's first allocation is all it holds)."""
        engine = self.engine
        pool = self.block_pool
        groups: list[tuple[int | None, list[int]]] = []
        gt = self.group_time
        aligned = self._aligned
        for g, held in enumerate(state):
            t0 = gt.start() if gt is not None else 0
            if aligned and g in aligned:
                tokens = need_tokens if main_tokens is None else main_tokens
                groups.append(self._states.append(held, g, tokens))
                if gt is not None:
                    gt.stop(g, t0)
                continue
            n = -(-(need_tokens + self._info[g][3]) // self._block_sizes[g]) - held.dropped - held.held
            runs: list[int] = []
            if n > 0:
                if held.engine_request == 0:
                    held.engine_request = engine.create_request()
                runs = engine.append_runs(held.engine_request, n).ravel().tolist()
                held.held += n
                pool._num_free -= n
                if self._zeroing[g]:
                    self._zero_ids.extend(ids_from_runs(runs, self._table))
            groups.append((0, runs))
            if gt is not None:
                gt.stop(g, t0)
        view = GroupBlocks(tuple(groups), self._table, pool)
        self._fresh = (rid, view) if fresh else None
        return view

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        state = self._reqs.get(request_id)
        if state is not None:
            self._free_skipped(state, processed_computed_tokens)

    def free(self, request: Request) -> None:
        self._fresh = None
        state = self._reqs.pop(request.request_id, None)
        if state is None:
            return
        gt = self.group_time
        for g, held in enumerate(state):
            t0 = gt.start() if gt is not None else 0
            if held.engine_request:
                self.engine.release(held.engine_request)
                self.block_pool._num_free += held.held
            if gt is not None:
                gt.stop(g, t0)

    def pop_blocks_for_free(self, request: Request) -> GroupRangeRelease:  # type: ignore[override]
        """The request's blocks in every group, held until the scheduler frees them through
        ``block_pool.free_blocks``."""
        self._fresh = None
        state = self._reqs.pop(request.request_id, None) or []
        engs = tuple(held.engine_request for held in state if held.engine_request)
        release = GroupRangeRelease(engs, sum(held.held for held in state))
        if not release.num_blocks:  # the scheduler drops an empty release: free its engine requests now
            release.release(self.block_pool)
        return release

    # ---- block ids of a request (null block where a window group dropped blocks)

    def _view(self, state: list[_Held]) -> GroupBlocks:
        engine = self.engine
        aligned = self._aligned
        groups = tuple(
            (None, self._states.row(h)) if aligned and g in aligned
            else (h.dropped, engine.ranges_array(h.engine_request)[:, :2].ravel().tolist() if h.held else [])
            for g, h in enumerate(state)
        )
        return GroupBlocks(groups, self._table, self.block_pool)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        state = self._reqs.get(request_id)
        if state is None:
            return tuple([] for _ in self._managers)
        return self._view(state).get_block_ids()

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks; right after its first allocation (the scheduler's admission) that
        allocation's view, with no engine call."""
        fresh = self._fresh
        if fresh is not None and fresh[0] == request_id:
            return fresh[1]
        state = self._reqs.get(request_id)
        if state is None:
            return self.empty_kv_cache_blocks
        return self._view(state)

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        for g, ids in enumerate(self.get_block_ids(request_id)):
            if self._zeroing[g]:
                bs = self._block_sizes[g]
                if start_token % bs:
                    raise ValueError(f"start_token {start_token} is not a multiple of block size {bs}")
                self._zero_ids.extend(ids[start_token // bs :])

    def take_new_block_ids(self) -> list[int]:
        ids = super().take_new_block_ids()
        if self._zero_ids:
            ids.extend(self._zero_ids)
            self._zero_ids = []
        return ids

    def estimate_cached_tokens(self, request: Request) -> int:
        return 0  # no prefix cache

    # ---- inspection and telemetry

    def live_request_count(self) -> int:
        """Requests holding blocks in any group now, in O(1) (the telemetry's per-step live peak)."""
        return len(self._reqs)

    def num_blocks_held(self, request_id: str, group: int | None = None) -> int:
        """Blocks the request holds in ``group`` (None: all groups)."""
        state = self._reqs.get(request_id)
        if state is None:
            return 0
        return sum(h.held for h in state) if group is None else state[group].held

    def num_blocks_dropped(self, request_id: str, group: int) -> int:
        """Leading logical blocks of ``group`` the request has released (window groups)."""
        state = self._reqs.get(request_id)
        return state[group].dropped if state is not None else 0

    def engine_block_ids(self, request_id: str, group: int = 0) -> Any:
        state = self._reqs.get(request_id)
        if state is None or not state[group].engine_request:
            return super().engine_block_ids("")  # empty
        return self.engine.blocks(state[group].engine_request)

    def ranges_per_request_counts(self) -> list[int]:
        """Per live (request, group), the runs of consecutive block ids it holds."""
        counts = []
        for state in self._reqs.values():
            for held in state:
                if held.held:
                    r = self.engine.ranges_array(held.engine_request)
                    counts.append(1 + int((r[1:, 0] != r[:-1, 0] + r[:-1, 1]).sum()) if len(r) else 0)
        return [c for c in counts if c]
