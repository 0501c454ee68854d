"""The range engine: one KV cache of blocks handed out as contiguous ranges (``tagma_engine_*``)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from types import TracebackType

from tagma.engine.abi import (
    _I32,
    _I64,
    _I64_MAX,
    _I64_MIN,
    _U64,
    _U64_END,
    AppendResult,
    EngineStats,
    I32Array,
    I64Array,
    IntArrayLike,
    Policy,
    Range,
    _as_i32,
    _as_i64,
    _CAppendBatch,
    _check_i32,
    _check_i64,
    _check_u64,
    _CStats,
)
from tagma.errors import (
    TAGMA_E_INTERNAL,
    TAGMA_E_OUT_OF_RANGE,
    InternalError,
    OutOfRangeError,
)

__all__ = [
    "RangeEngine",
]
from tagma.engine.loader import _load, _raise

# ------------------------------------------------------------------------------------------- the engine


class RangeEngine:
    """One engine: a KV cache of ``num_blocks`` blocks (block 0 is the null block) handed out as ranges.

    Calls on one engine must be serialized by the caller. After :meth:`close`, every method passes the
    destroyed handle to the engine, which answers :class:`InvalidHandleError`.
    """

    __slots__ = (
        "_align",
        "_closed",
        "_f_append",
        "_f_append_runs",
        "_f_attach",
        "_f_block",
        "_f_block_state",
        "_f_blocks",
        "_f_clear",
        "_f_evict",
        "_f_free_ranges",
        "_f_hist",
        "_f_lru",
        "_f_mark",
        "_f_num_blocks",
        "_f_num_ranges",
        "_f_ranges",
        "_f_release",
        "_f_req_create",
        "_f_set_policy",
        "_f_stats",
        "_f_unmark",
        "_handle",
        "_i32",
        "_i32_p",
        "_i64",
        "_i64_p",
        "_lib",
        "_num_blocks",
        "_stats",
        "_stats_p",
        "_u64",
        "_u64_p",
    )

    def __init__(self, num_blocks: int, align: int = 1, policy: Policy | int | str = Policy.BEST_FIT) -> None:
        self._closed = True  # until the engine exists: __del__ and close() then do nothing
        self._handle = 0
        lib = _load()
        self._lib = lib
        pol = Policy.parse(policy)
        out = _U64(0)
        status = lib.tagma_engine_create(
            _check_i64(num_blocks, "num_blocks"), _check_i64(align, "align"), pol, ctypes.addressof(out)
        )
        if status:
            _raise(lib, status)
        self._handle = out.value
        self._closed = False
        self._num_blocks = int(num_blocks)
        self._align = int(align)
        # Out-parameter scratch, reused by every call (calls on one engine are serialized).
        self._u64 = _U64(0)
        self._u64_p = ctypes.addressof(self._u64)
        self._i64 = _I64(0)
        self._i64_p = ctypes.addressof(self._i64)
        self._i32 = _I32(0)
        self._i32_p = ctypes.addressof(self._i32)
        self._stats = _CStats()
        self._stats_p = ctypes.addressof(self._stats)
        self._f_set_policy = lib.tagma_engine_set_policy
        self._f_stats = lib.tagma_engine_stats
        self._f_req_create = lib.tagma_request_create
        self._f_release = lib.tagma_request_release
        self._f_append = lib.tagma_request_append
        self._f_attach = lib.tagma_request_attach
        self._f_num_blocks = lib.tagma_request_num_blocks
        self._f_num_ranges = lib.tagma_request_num_ranges
        self._f_ranges = lib.tagma_request_ranges
        self._f_block = lib.tagma_request_block
        self._f_blocks = lib.tagma_request_blocks
        self._f_mark = lib.tagma_cache_mark
        self._f_unmark = lib.tagma_cache_unmark
        self._f_evict = lib.tagma_cache_evict
        self._f_clear = lib.tagma_cache_clear
        self._f_block_state = lib.tagma_block_state
        self._f_free_ranges = lib.tagma_free_ranges
        self._f_lru = lib.tagma_lru_order
        self._f_hist = lib.tagma_ranges_histogram
        self._f_append_runs = lib.tagma_request_append_runs

    # ---- lifetime

    @property
    def handle(self) -> int:
        return self._handle

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def align(self) -> int:
        return self._align

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Destroy the engine; idempotent. The handle stays set (dead) so later calls reach the engine."""
        if self._closed:
            return
        self._closed = True
        status = self._lib.tagma_engine_destroy(self._handle)
        if status:
            _raise(self._lib, status)

    def __enter__(self) -> RangeEngine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # Best effort, possibly during interpreter shutdown: never raise from here.
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._lib.tagma_engine_destroy(self._handle)
        except Exception:
            return

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"RangeEngine(handle={self._handle}, num_blocks={self._num_blocks}, align={self._align}, {state})"
        )

    # ---- policy and statistics

    def set_policy(self, policy: Policy | int | str) -> None:
        pol = Policy.parse(policy)
        status = self._f_set_policy(self._handle, pol)
        if status:
            _raise(self._lib, status)

    def set_admission(self, percent: int, pieces: int = 1) -> None:
        """RESERVE admission: a hinted first append waits until ``percent``% of the hint fits in the
        ``pieces`` largest free parts clear of other requests' expected growth (0: off)."""
        status = self._lib.tagma_engine_set_admission(
            self._handle, _check_i32(int(percent), "percent"), _check_i32(int(pieces), "pieces")
        )
        if status:
            _raise(self._lib, status)

    def stats(self) -> EngineStats:
        status = self._f_stats(self._handle, self._stats_p)
        if status:
            _raise(self._lib, status)
        s = self._stats
        return EngineStats(
            s.num_blocks,
            s.usable_blocks,
            s.free_blocks,
            s.cached_only_blocks,
            s.used_blocks,
            s.free_ranges,
            s.largest_free_range,
            s.external_fragmentation,
            s.live_requests,
            s.total_request_ranges,
            s.max_request_ranges,
            s.in_place_growths,
            s.new_ranges,
            s.merges,
            s.evictions,
            s.appended_blocks,
        )

    # ---- requests

    def create_request(self) -> int:
        status = self._f_req_create(self._handle, self._u64_p)
        if status:
            _raise(self._lib, status)
        return self._u64.value

    def release(self, request: int) -> None:
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        status = self._f_release(self._handle, request)
        if status:
            _raise(self._lib, status)

    def free_front(self, request: int, count: int) -> None:
        """Release the request's first ``count`` blocks (a sliding window's start advancing); the rest are
        renumbered from logical 0."""
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        if not _I64_MIN <= count <= _I64_MAX:
            _check_i64(count, "count")
        status = self._lib.tagma_request_free_front(self._handle, request, count)
        if status:
            _raise(self._lib, status)

    def append(self, request: int, count: int) -> AppendResult:
        """Append ``count`` new blocks; returns their ids (logical order) and the blocks evicted for them."""
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        if not _I64_MIN <= count <= _I64_MAX:
            _check_i64(count, "count")
        # A request can never get more than num_blocks blocks, so a larger count must fail; pass NULL outputs
        # then instead of allocating a buffer of that size.
        cap = count if 0 < count <= self._num_blocks else 0
        if cap:
            buf = np.empty(2 * cap, dtype=np.int32)
            ptr = buf.ctypes.data
            status = self._f_append(self._handle, request, count, ptr, ptr + 4 * cap, self._i64_p)
        else:
            status = self._f_append(self._handle, request, count, None, None, self._i64_p)
        if status:
            _raise(self._lib, status)
        if not cap:
            raise InternalError(
                TAGMA_E_INTERNAL, f"append of {count} blocks to a {self._num_blocks}-block engine returned OK"
            )
        return AppendResult(buf[:cap], buf[cap : cap + self._i64.value])

    def attach(self, request: int, block_ids: IntArrayLike) -> None:
        """Append existing blocks (in use elsewhere, or cache-only) to the request's logical end."""
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        ids = _as_i32(block_ids, "block_ids")
        status = self._f_attach(self._handle, request, ids.ctypes.data, ids.size)
        if status:
            _raise(self._lib, status)

    def num_blocks_of(self, request: int) -> int:
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        status = self._f_num_blocks(self._handle, request, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def num_ranges(self, request: int) -> int:
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        status = self._f_num_ranges(self._handle, request, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def ranges_array(self, request: int) -> I32Array:
        """The request's ranges as an (R, 3) int32 array of (physical_start, count, first_logical)."""
        if not 0 <= request < _U64_END:
            _check_u64(request, "request")
        cap = 8
        while True:
            buf = np.empty((cap, 3), dtype=np.int32)
            status = self._f_ranges(self._handle, request, buf.ctypes.data, cap, self._i64_p)
            if status:
                _raise(self._lib, status)
            n = self._i64.value
            if n <= cap:
                return buf[:n]
            cap = n

    def ranges(self, request: int) -> list[Range]:
        return [Range(s, c, f) for s, c, f in self.ranges_array(request).tolist()]

    def block(self, request: int, logical: int) -> int:
        """Physical id of the request's logical block ``logical``."""
        if not (0 <= request < _U64_END and _I64_MIN <= logical <= _I64_MAX):
            _check_u64(request, "request")
            _check_i64(logical, "logical")
        status = self._f_block(self._handle, request, logical, self._i32_p)
        if status:
            _raise(self._lib, status)
        return self._i32.value

    def blocks(self, request: int, first: int = 0, count: int | None = None) -> I32Array:
        """Physical ids of logical blocks [first, first + count); to the request's end when count is None.

        With count None an empty tail gives an empty array; an explicit count must be positive (the engine
        rejects zero counts).
        """
        _check_u64(request, "request")
        _check_i64(first, "first")
        if count is None:
            count = self.num_blocks_of(request) - first
            if count == 0:
                return np.empty(0, dtype=np.int32)
        # No request holds more than num_blocks blocks, so a larger count fails its range check before the
        # engine writes anything: a one-entry buffer stands in for one of that size.
        fits = 0 <= _check_i64(count, "count") <= self._num_blocks
        out = np.empty(count if fits else 1, dtype=np.int32)
        status = self._f_blocks(self._handle, request, first, count, out.ctypes.data)
        if status:
            _raise(self._lib, status)
        if not fits:
            raise InternalError(TAGMA_E_INTERNAL, f"blocks({request}, {first}, {count}) returned OK")
        return out

    # ---- cache references

    def cache_mark(self, block_ids: IntArrayLike) -> None:
        ids = _as_i32(block_ids, "block_ids")
        status = self._f_mark(self._handle, ids.ctypes.data, ids.size)
        if status:
            _raise(self._lib, status)

    def cache_unmark(self, block_ids: IntArrayLike) -> None:
        ids = _as_i32(block_ids, "block_ids")
        status = self._f_unmark(self._handle, ids.ctypes.data, ids.size)
        if status:
            _raise(self._lib, status)

    def cache_evict(self, max_blocks: int) -> I32Array:
        """Evict up to ``max_blocks`` cache-only blocks in LRU order; returns their ids."""
        # At most num_blocks blocks can be evicted, so that bounds the buffer whatever max_blocks is.
        cap = min(max(_check_i64(max_blocks, "max_blocks"), 0), self._num_blocks)
        out = np.empty(cap, dtype=np.int32)
        status = self._f_evict(self._handle, max_blocks, out.ctypes.data, self._i64_p)
        if status:
            _raise(self._lib, status)
        return out[: self._i64.value]

    def cache_clear(self) -> int:
        """Drop every cache reference; returns how many blocks had one."""
        status = self._f_clear(self._handle, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    # ---- inspection

    def block_state(self) -> tuple[I32Array, I32Array]:
        """(req_refs, cache_refs), one int32 entry per block."""
        n = self._num_blocks
        buf = np.empty(2 * n, dtype=np.int32)
        ptr = buf.ctypes.data
        status = self._f_block_state(self._handle, ptr, ptr + 4 * n, n)
        if status:
            _raise(self._lib, status)
        return buf[:n], buf[n:]

    def _variable(self, fn: Any, width: int, cap: int) -> I32Array:
        """Call a (handle, out, capacity, *count) getter, growing the buffer until everything fits."""
        while True:
            buf = np.empty((cap, width) if width > 1 else cap, dtype=np.int32)
            status = fn(self._handle, buf.ctypes.data, cap, self._i64_p)
            if status:
                _raise(self._lib, status)
            n = self._i64.value
            if n <= cap:
                return buf[:n]
            cap = n

    def free_ranges_array(self) -> I32Array:
        """The free list in address order as an (F, 2) int32 array of (start, count)."""
        return self._variable(self._f_free_ranges, 2, 64)

    def free_ranges(self) -> list[tuple[int, int]]:
        return [(s, c) for s, c in self.free_ranges_array().tolist()]

    def lru_order(self) -> I32Array:
        """Cache-only blocks in LRU order (next to evict first)."""
        return self._variable(self._f_lru, 1, 64)

    def ranges_histogram(self, buckets: int) -> I64Array:
        """out[k] = live requests with k ranges; the last bucket also counts every request with more."""
        out = np.empty(max(_check_i64(buckets, "buckets"), 0), dtype=np.int64)
        status = self._f_hist(self._handle, out.ctypes.data, buckets)
        if status:
            _raise(self._lib, status)
        return out


    # ---- range manager

    def append_runs(self, request: int, count: int, hint: int = 0) -> I32Array:
        """Append ``count`` new blocks (no eviction allowed); returns (K, 2) int32 (start, count) runs.

        ``hint``: blocks the request expects to append from now on, this call included (0: no hint); a new
        range then goes where the whole hint fits, so later appends grow in place.
        """
        if not (0 <= request < _U64_END and _I64_MIN <= count <= _I64_MAX and _I64_MIN <= hint <= _I64_MAX):
            _check_u64(request, "request")
            _check_i64(count, "count")
            _check_i64(hint, "hint")
        cap = count if 0 < count <= self._num_blocks else 1
        buf = np.empty((cap, 2), dtype=np.int32)
        status = self._f_append_runs(self._handle, request, count, hint, buf.ctypes.data, cap, self._i64_p)
        if status:
            _raise(self._lib, status)
        return buf[: self._i64.value]

    def append_runs_batch(
        self, requests: IntArrayLike, counts: IntArrayLike, hints: IntArrayLike | None = None
    ) -> tuple[list[int], list[I32Array]]:
        """One ``tagma_append_runs_batch``: for each i in order, ``counts[i]`` new blocks for ``requests[i]``
        (0: a new request), placed as the same :meth:`append_runs` calls one by one would place them.

        Returns the request ids (new ones filled in) and each entry's (K, 2) int32 (start, count) runs. All or
        nothing: on error the engine is unchanged. (The range manager's hot path is :class:`AppendBatch`.)
        """
        ids = [int(r) for r in np.asarray(requests).ravel()]
        for r in ids:
            if not 0 <= r < _U64_END:
                raise OutOfRangeError(TAGMA_E_OUT_OF_RANGE, f"requests has a value outside uint64: {r}")
        reqs = np.array(ids, dtype=np.uint64)  # a copy: the engine writes new ids into it
        cnts = _as_i64(counts, "counts")
        n = reqs.size
        if cnts.shape != (n,):
            raise ValueError(f"counts must have one entry per request, got {cnts.shape} for {n} requests")
        hnts = None if hints is None else _as_i64(hints, "hints")
        if hnts is not None and hnts.shape != (n,):
            raise ValueError(f"hints must have one entry per request, got {hnts.shape}")
        total = int(np.clip(cnts, 0, None).sum()) if n else 0
        cap = total if 0 < total <= self._num_blocks else 1
        runs = np.empty((cap, 2), dtype=np.int32)
        offsets = np.empty(n + 1, dtype=np.int64)
        args = _CAppendBatch(
            engine=self._handle,
            requests=reqs.ctypes.data if n else None,
            counts=cnts.ctypes.data if n else None,
            hints=hnts.ctypes.data if hnts is not None and n else None,
            num_requests=n,
            runs_out=runs.ctypes.data,
            runs_capacity=cap,
            run_offsets=offsets.ctypes.data,
        )
        status = self._lib.tagma_append_runs_batch(ctypes.addressof(args))
        if status:
            _raise(self._lib, status)
        return [int(r) for r in reqs], [runs[offsets[i] : offsets[i + 1]] for i in range(n)]
