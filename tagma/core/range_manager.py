"""The range-native KV cache manager: prefix caching off, per-request state is the engine's ranges.

:class:`RangeKVCacheManager` serves the same scheduler-facing contract as vLLM's ``KVCacheManager`` (it is
one, so the coordinator, the block pool and every attribute the scheduler or the engine core reads exist),
but on its hot paths no ``KVCacheBlock`` object is touched and no per-block Python loop runs:

* a request is one engine request (held by the block pool's request map) plus the number of blocks it holds;
* ``allocate_slots`` computes the blocks a step needs with vLLM's arithmetic and keeps the free count; a
  step that needs none (most decode steps) returns without touching the engine; one that needs some queues
  (engine request, count) and returns a lazy :class:`RangeBlocks`;
* the queued appends of a scheduler step cross the C ABI once (``tagma_append_runs_batch``), the first time
  anything needs block ids or engine state (normally the scheduler reading the new block ids when it builds
  its output); the engine places them exactly as one call per request would, in the same order;
* ``RangeBlocks`` is a view over runs of consecutive block ids: block ids come out as one list slice per run
  of an id table when the scheduler asks for them, ``KVCacheBlock`` objects only if some caller asks for
  ``.blocks``;
* ``free`` is one C call (the engine releases the request's ranges and coalesces the free list); the free
  count is a Python int kept beside it, so admission checks need no engine call.

Which methods apply the queued appends (``_flush``) first: ``free``, ``pop_blocks_for_free``,
``get_blocks`` (except for a request that one queued entry created and fills: that entry's pending view),
``get_block_ids``, ``engine_block_ids``, ``ranges_per_request_counts`` (telemetry),
``record_blocks_for_zeroing``, ``take_new_block_ids``, ``allocate_slots`` of a request whose engine request
is still queued for creation, and every block-id accessor of a pending :class:`RangeBlocks`. A subclass that
reads or changes engine state must call ``_flush()`` before it does.

:class:`tagma.core.manager.TagmaKVCacheManager` (``$TAGMA_RANGE_MANAGER`` = ``0``) keeps vLLM's block
objects (their hashes are the prefix-cache index). :func:`tagma.core.registry.build_kv_cache_manager` builds
this class when caching is off, unless ``$TAGMA_RANGE_MANAGER`` is ``0``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request

from tagma.core.block_pool import RangeRelease
from tagma.core.manager import (
    NO_TOKENS_MESSAGE,
    WAITING_STATUSES,
    RefusedPerRequestMap,
    TagmaKVCacheManager,
    reserve_admission,
)
from tagma.engine import AppendBatch, I32Array, NoSpaceError, Policy, TagmaError, _raise, hot_function
from tagma.errors import TagmaUnsupported

__all__ = ["RangeBlocks", "RangeKVCacheManager"]



def ids_from_runs(runs: list[int], table: list[int]) -> list[int]:
    """Block ids of flat (start, count, start, count, ...) runs: one list slice of the id table per run."""
    if len(runs) == 2:
        start = runs[0]
        return table[start : start + runs[1]]
    out: list[int] = []
    for i in range(0, len(runs), 2):
        start = runs[i]
        out += table[start : start + runs[i + 1]]
    return out


class RangeBlocks(KVCacheBlocks):
    """A ``KVCacheBlocks`` of one KV cache group over runs of consecutive block ids.

    ``runs`` is flat: (start, count, start, count, ...). ``get_block_ids`` builds the id list with one list
    slice per run of the pool's id table (the ints vLLM's blocks already hold: no int is created);
    ``blocks`` (the pool's ``KVCacheBlock`` objects) is built only when a caller asks for it.

    Blocks that ``allocate_slots`` queued are pending (``runs`` None, ``manager`` set): the first accessor
    that needs their ids applies the manager's queued appends (one engine call for all of them). ``len`` is
    known without it.
    """

    __slots__ = ("_manager", "_num", "_pool", "_runs", "_table")

    def __init__(
        self,
        runs: list[int] | None,
        num_blocks: int,
        table: list[int],
        pool: BlockPool,
        manager: RangeKVCacheManager | None = None,
    ) -> None:
        self._runs = runs  # no dataclass __init__: ``blocks`` is a property here
        self._num = num_blocks
        self._table = table
        self._pool = pool
        self._manager = manager

    def _resolved(self) -> list[int]:
        runs = self._runs
        if runs is None:
            if self._manager is not None:
                self._manager._flush()
                runs = self._runs
            if runs is None:
                raise RuntimeError(
                    "tagma: the engine append of these blocks failed (the error was raised when the "
                    "manager's queued appends were applied)"
                )
        return runs

    @property
    def pending(self) -> bool:
        """Whether the blocks are still queued in the manager (no engine call made for them yet)."""
        return self._runs is None

    @property
    def blocks(self) -> tuple[Sequence[Any], ...]:  # type: ignore[override]
        table = self._pool.blocks
        return ([table[i] for i in ids_from_runs(self._resolved(), self._table)],)

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The (start, count) runs in logical order."""
        r = self._resolved()
        return [(r[i], r[i + 1]) for i in range(0, len(r), 2)]

    def __len__(self) -> int:
        return self._num

    def get_block_ids(  # type: ignore[override]
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        if group_ids is not None:
            if any(g != 0 for g in group_ids):
                raise IndexError(f"KV cache group ids {list(group_ids)}: tagma has one group (0)")
            if allow_none and (not group_ids or not self._num):
                return None
            runs = self._resolved()
            return tuple(ids_from_runs(runs, self._table) for _ in group_ids)
        if allow_none and not self._num:
            return None
        return (ids_from_runs(self._resolved(), self._table),)

    def get_unhashed_block_ids(self) -> list[int]:
        return ids_from_runs(self._resolved(), self._table)  # prefix caching is off: no block has a hash

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [ids_from_runs(self._resolved(), self._table)]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(((),))

    def __repr__(self) -> str:
        if self._runs is None:
            return f"RangeBlocks(pending, num_blocks={self._num})"
        return f"RangeBlocks(runs={self.runs!r})"


class RangeKVCacheManager(TagmaKVCacheManager):
    """``KVCacheManager`` for prefix caching off whose per-request state is an engine request and a count.

    Built through :func:`tagma.core.registry.build_kv_cache_manager` (same arguments). Keeps vLLM's
    outcomes: the same blocks needed per step, the same admission decisions (free count, watermark, reserved
    blocks, full-sequence admission), the same usage; only which physical blocks differ (the engine places
    them as ranges).
    """

    # Work allocate_slots defers (the queued appends, one engine call) and runs when a block id is first
    # read, possibly from the scheduler's own code: in-server host time charges it to the manager.
    DEFERRED_WORK_METHODS = ("_flush",)
    # An EAGLE drafter's layers share the target's one group: caching off, the manager sees lookahead slots
    # only (as for ngram); caching on, the prefix manager drops the last hit block as vLLM does.
    SERVES_EAGLE = True

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(kv_cache_config, max_model_len, *args, **kwargs)
        if self.enable_caching:
            raise ValueError("tagma: RangeKVCacheManager serves prefix caching off only")
        (single,) = self.coordinator.single_type_managers
        single.req_to_blocks = RefusedPerRequestMap("req_to_blocks", "block lists")
        self.block_size: int = single.block_size
        self._held: dict[str, int] = {}  # request id -> blocks it holds (engine handle: pool._engine_reqs)
        self._zeroing: bool = bool(single.records_new_block_ids)
        self._zero_ids: list[Any] = []
        engine = self.engine
        pool = self.block_pool
        # Block id i as the int object vLLM's block i already holds: id lists are slices of this table.
        self._table: list[int] = [block.block_id for block in pool.blocks]
        self._h = engine.handle
        self._lib = engine._lib
        self._f_create = engine._f_req_create
        self._f_release = hot_function("tagma_request_release", ctypes.c_uint64, ctypes.c_uint64)
        self._u64 = ctypes.c_uint64(0)
        self._u64_p = ctypes.addressof(self._u64)
        # RESERVE: appends carry the expected size (prompt + max_tokens) as a growth hint, and a request's
        # first append goes to the engine at once (its admission check may decline it).
        self._reserve = self.policy == Policy.RESERVE
        if self._reserve:
            engine.set_admission(*reserve_admission())
        self._hinted = self._appends_carry_hints()  # whether queued appends carry growth hints (_p_hints)
        # The queued appends: entry i appends _p_counts[i] blocks to engine request _p_reqs[i] (0: create one)
        # for request _p_rids[i]; _p_views[i] is the RangeBlocks that allocate_slots returned (None: none);
        # _p_hints[i] its growth hint (when _hinted).
        self._batch = AppendBatch(engine, capacity=256, hints=self._hinted)
        self._p_reqs: list[int] = []
        self._p_counts: list[int] = []
        self._p_hints: list[int] = []
        self._p_rids: list[str] = []
        self._p_views: list[RangeBlocks | None] = []
        self._p_zero: list[bool] = []  # with zeroing: whether entry i's blocks are recorded for zeroing
        self._p_new: dict[str, int] = {}  # request id -> the entry that creates its engine request
        # The scheduler asks the coordinator, not the manager, how many blocks a request still needs.
        self.coordinator.get_num_blocks_to_allocate = self._num_blocks_to_allocate  # type: ignore[method-assign]

    # ---- the hot paths

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
        if num_new_computed_tokens or num_encoder_tokens:
            self._refuse_adopt(num_new_computed_tokens, num_encoder_tokens)
        if num_new_tokens == 0 and not num_external_computed_tokens:
            raise ValueError(NO_TOKENS_MESSAGE)
        rid = request.request_id
        held = self._held.get(rid, 0)
        max_len = self.max_model_len
        computed = request.num_computed_tokens + num_external_computed_tokens
        if computed > max_len:
            computed = max_len
        need_tokens = computed + num_new_tokens + num_lookahead_tokens
        if need_tokens > max_len:
            need_tokens = max_len
        bs = self.block_size
        need = -(-need_tokens // bs) - held
        if need < 0:
            need = 0
        pool = self.block_pool
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in WAITING_STATUSES else 0
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            full_need = -(-full // bs) - held
            if (full_need if full_need > 0 else 0) + watermark > pool._num_free:
                return None
        if need + watermark > pool._num_free - reserved_blocks:
            return None
        if need == 0:
            return self.empty_kv_cache_blocks  # the decode fast path: no engine call
        eng = pool._engine_reqs.get(rid)
        if eng is None:
            if rid in self._p_new:  # its engine request is queued for creation: apply the queue first
                self._flush()
                eng = pool._engine_reqs[rid]
            else:
                eng = 0  # created by the batched call
        if num_external_computed_tokens:
            # Tokens a KV connector computed: vLLM gives them blocks first and does not return those.
            external = -(-computed // bs) - held
            if external > 0:
                if eng == 0:  # both entries must name the request: create it now (connector path only)
                    eng = self._create(rid)
                zero = self._zeroing and 0 not in kwargs.get("skip_zeroing_group_ids", ())
                self._queue(rid, eng, external, None, zero)
                held += external
                need -= external
                if need == 0:
                    return self.empty_kv_cache_blocks
        if self._reserve:  # blocks the request expects from here: prompt + max_tokens, within max_model_len
            total = request.num_prompt_tokens + (request.max_tokens or 0)
            hint = -(-(total if total < max_len else max_len) // bs) - held
            if hint < need:
                hint = need
            if held == 0:
                return self._admit_reserved(rid, eng, need, hint)
            self._p_hints.append(hint)
        view = RangeBlocks(None, need, self._table, pool, self)
        # _queue inlined (the admission path):
        if eng == 0:
            self._p_new[rid] = len(self._p_reqs)
        self._p_reqs.append(eng)
        self._p_counts.append(need)
        self._p_rids.append(rid)
        self._p_views.append(view)
        if self._zeroing:
            self._p_zero.append(True)
        self._held[rid] = held + need
        pool._num_free -= need
        return view

    def _appends_carry_hints(self) -> bool:
        """Whether every queued append carries a growth hint: under RESERVE (read once, in ``__init__``)."""
        return self._reserve

    def _admit_reserved(self, rid: str, eng: int, need: int, hint: int) -> RangeBlocks | None:
        """RESERVE: a request's first append, at once (after the queue, so placement order is kept); None when
        the engine's admission check declines it (vLLM then leaves the request waiting)."""
        self._flush()
        created = eng == 0
        if created:
            eng = self._create(rid)
        try:
            runs = self.engine.append_runs(eng, need, hint).ravel().tolist()
        except NoSpaceError:
            if created:  # leave no empty engine request behind a waiting request
                self.block_pool._engine_reqs.pop(rid, None)
                status = self._f_release(self._h, eng)
                if status:
                    _raise(self._lib, status)
            return None
        self._held[rid] = self._held.get(rid, 0) + need
        self.block_pool._num_free -= need
        if self._zeroing:
            self._zero_ids.append(ids_from_runs(runs, self._table))
        return RangeBlocks(runs, need, self._table, self.block_pool, self)

    def _create(self, rid: str) -> int:
        status = self._f_create(self._h, self._u64_p)
        if status:
            _raise(self._lib, status)
        eng = self._u64.value
        self.block_pool._engine_reqs[rid] = eng
        return eng

    def _queue(
        self, rid: str, eng: int, count: int, view: RangeBlocks | None, zero: bool, hint: int = 0
    ) -> None:
        """Queue an append of ``count`` blocks to engine request ``eng`` (0: create one) for ``rid``, with a
        growth ``hint`` when appends carry them."""
        if eng == 0:
            self._p_new[rid] = len(self._p_reqs)
        self._p_reqs.append(eng)
        self._p_counts.append(count)
        if self._hinted:
            self._p_hints.append(hint)
        self._p_rids.append(rid)
        self._p_views.append(view)
        if self._zeroing:
            self._p_zero.append(zero)
        self._held[rid] = self._held.get(rid, 0) + count
        self.block_pool._num_free -= count

    def _flush(self) -> None:
        """Apply the queued appends in ONE engine call (``tagma_append_runs_batch``), in queue order.

        Fills the pending :class:`RangeBlocks`, records new engine requests in the pool and the blocks to
        zero. A no-op when nothing is queued. On an engine error (only possible if the free count were
        wrong) nothing is appended, the queued requests' counts and the free count are restored, the pending
        views stay unresolved and the error is raised.
        """
        reqs = self._p_reqs
        n = len(reqs)
        if not n:
            return
        batch = self._batch
        if n > len(batch.requests):
            batch.reserve(n)
        batch.requests[:n] = reqs
        batch.counts[:n] = self._p_counts
        if self._hinted:
            batch.hints[:n] = self._p_hints
        views, zero, new = self._p_views, self._p_zero, self._p_new
        try:
            batch(n)
        except TagmaError:
            self._unqueue()
            raise
        finally:
            self._p_reqs, self._p_counts, self._p_rids, self._p_views = [], [], [], []
            self._p_hints = []
            self._p_zero, self._p_new = [], {}
        runs = batch.runs
        if n == 1:
            run = runs[: 2 * batch.offsets[1]]  # a ctypes array: slicing gives a list of ints
            view = views[0]
            if view is not None:
                view._runs = run
            if zero and zero[0]:
                self._zero_ids.append(ids_from_runs(run, self._table))
        else:
            offsets = batch.offsets[: n + 1]
            for i in range(n):
                run = runs[2 * offsets[i] : 2 * offsets[i + 1]]
                view = views[i]
                if view is not None:
                    view._runs = run
                if zero and zero[i]:
                    self._zero_ids.append(ids_from_runs(run, self._table))
        if new:
            ids = batch.requests[:n]
            engine_reqs = self.block_pool._engine_reqs
            for rid, i in new.items():
                engine_reqs[rid] = ids[i]

    def _unqueue(self) -> None:
        """Undo the bookkeeping of the queued appends (the engine did none of them)."""
        pool = self.block_pool
        for rid, count in zip(self._p_rids, self._p_counts, strict=True):
            held = self._held.get(rid, 0) - count
            if held > 0:
                self._held[rid] = held
            else:
                self._held.pop(rid, None)
            pool._num_free += count

    def free(self, request: Request) -> None:
        if self._p_reqs:
            self._flush()  # the request may have queued blocks: the engine releases what it appended
        rid = request.request_id
        held = self._held.pop(rid, 0)
        eng = self.block_pool._engine_reqs.pop(rid, None)
        if eng is not None:
            status = self._f_release(self._h, eng)
            if status:
                _raise(self._lib, status)
            self.block_pool._num_free += held

    def pop_blocks_for_free(self, request: Request) -> RangeRelease:  # type: ignore[override]
        """The request's blocks, held until the scheduler frees them through ``block_pool.free_blocks``."""
        if self._p_reqs:
            self._flush()
        rid = request.request_id
        held = self._held.pop(rid, 0)
        eng = self.block_pool._engine_reqs.pop(rid, None)
        return RangeRelease(eng, held if eng is not None else 0)

    # ---- block ids of a request

    def _runs(self, request_id: str) -> list[int]:
        """The request's ranges as flat (start, count, ...) runs; empty when it holds no block."""
        if self._p_reqs:
            self._flush()
        eng = self.block_pool._engine_reqs.get(request_id)
        if eng is None:
            return []
        return self.engine.ranges_array(eng)[:, :2].ravel().tolist()

    def _ids(self, request_id: str) -> I32Array:
        return np.asarray(ids_from_runs(self._runs(request_id), self._table), dtype=np.int32)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks. The scheduler asks this right after admitting a request: when one queued
        entry created the request and holds all its blocks, that entry's pending view is the answer (no
        crossing now; the step's queue is applied once, when the output reads the ids)."""
        entry = self._p_new.get(request_id)
        if entry is not None:
            view = self._p_views[entry]
            if view is not None and self._held.get(request_id) == self._p_counts[entry]:
                return view
        runs = self._runs(request_id)
        if not runs:
            return self.empty_kv_cache_blocks
        return RangeBlocks(runs, self._held[request_id], self._table, self.block_pool, self)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        runs = self._runs(request_id)
        return (ids_from_runs(runs, self._table) if runs else [],)

    def ranges_per_request_counts(self) -> list[int]:
        """Per live request, the runs of consecutive block ids it holds, from the engine's ranges (this
        manager keeps no per-block lists for the telemetry to walk); abutting ranges are one run, as they
        would be in a block list."""
        if self._p_reqs:
            self._flush()
        counts = []
        for rid, held in self._held.items():
            eng = self.block_pool._engine_reqs.get(rid) if held else None
            if eng is None:
                continue
            r = self.engine.ranges_array(eng)
            counts.append(1 + int(np.count_nonzero(r[1:, 0] != r[:-1, 0] + r[:-1, 1])) if len(r) else 0)
        return [c for c in counts if c]

    def live_request_count(self) -> int:
        """Requests holding blocks now, in O(1) (the telemetry's per-step live peak)."""
        return len(self._held)

    def num_blocks_held(self, request_id: str) -> int:
        """Blocks the request holds (0 when none)."""
        return self._held.get(request_id, 0)

    def estimate_cached_tokens(self, request: Request) -> int:
        return 0  # no prefix cache

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        if not self._zeroing:
            return
        if start_token % self.block_size:
            raise ValueError(f"start_token {start_token} is not a multiple of block size {self.block_size}")
        ids = self.get_block_ids(request_id)[0][start_token // self.block_size :]
        if ids:
            self._zero_ids.append(ids)

    def take_new_block_ids(self) -> list[int]:
        if self._p_reqs:
            self._flush()
        ids = super().take_new_block_ids()
        if self._zero_ids:
            for chunk in self._zero_ids:
                ids.extend(chunk)
            self._zero_ids = []
        return ids

    def _num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Any = (), *args: Any, **kwargs: Any
    ) -> int:
        """vLLM's count for one full-attention group: blocks for num_tokens beyond the request's."""
        hits = sum(len(group) for group in new_computed_blocks) if new_computed_blocks else 0
        need = -(-num_tokens // self.block_size) - self._held.get(request_id, 0) - hits
        return need if need > 0 else 0

    @staticmethod
    def _refuse_adopt(local: int, encoder: int) -> None:
        if encoder:
            raise TagmaUnsupported("encoder tokens (cross-attention)")
        if local:
            raise TagmaUnsupported("prefix-cache hits with prefix caching off")

    # ---- inspection

    def engine_block_ids(self, request_id: str) -> I32Array:
        return self._ids(request_id)
