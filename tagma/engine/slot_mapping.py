"""Slot mapping from ranges (per token, and one prepared call per step) and KV cache coordinates."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from tagma.engine.abi import (
    _I64,
    _I64_MAX,
    _I64_MIN,
    _VP,
    CoordLayout,
    I64Array,
    IntArrayLike,
    _as_i32,
    _as_i64,
    _CCoordLayout,
    _check_i64,
    _out_buffer,
)

__all__ = [
    "SlotMappingStep",
    "coord_offset",
    "slot_mapping_paged",
    "slot_mapping_ranges",
    "slot_mapping_step",
]
from tagma.engine.loader import _load, _raise

# --------------------------------------------------------------------------------------- pure functions


def slot_mapping_ranges(
    ranges: IntArrayLike,
    req_range_offsets: IntArrayLike,
    query_start_loc: IntArrayLike,
    positions: IntArrayLike,
    block_size: int,
    out: I64Array | None = None,
    out_len: int | None = None,
) -> I64Array:
    """Slot of each token through its request's ranges; -1 past the request's blocks and for padding.

    ``ranges`` is (R, 3) int32 (physical_start, count, first_logical); request r owns rows
    [req_range_offsets[r], req_range_offsets[r + 1]) and tokens [query_start_loc[r], query_start_loc[r + 1]).
    ``out`` (int64, C-contiguous) defaults to a new array of ``out_len`` (default: the number of tokens).
    """
    rng = _as_i32(ranges, "ranges")
    if rng.ndim != 2 or rng.shape[1] != 3:
        if rng.size:
            raise ValueError(f"ranges must have shape (R, 3), got {rng.shape}")
        rng = rng.reshape(0, 3)
    offsets = _as_i32(req_range_offsets, "req_range_offsets")
    qsl = _as_i32(query_start_loc, "query_start_loc")
    pos = _as_i64(positions, "positions")
    if offsets.ndim != 1 or qsl.shape != offsets.shape or offsets.size == 0:
        raise ValueError("req_range_offsets and query_start_loc must be 1-D arrays of num_reqs + 1 entries")
    num_tokens = int(qsl[-1])
    # The engine cannot see buffer sizes; these bound every read given monotone offsets (which it checks).
    if int(offsets[-1]) > rng.shape[0]:
        raise ValueError(f"req_range_offsets[-1]={int(offsets[-1])} exceeds the {rng.shape[0]} ranges given")
    if num_tokens > pos.size:
        raise ValueError(f"query_start_loc[-1]={num_tokens} exceeds the {pos.size} positions given")
    buf, length = _out_buffer(out, out_len, num_tokens)
    status = _load().tagma_slot_mapping_ranges(
        rng.ctypes.data,
        offsets.ctypes.data,
        offsets.size - 1,
        qsl.ctypes.data,
        pos.ctypes.data,
        _check_i64(block_size, "block_size"),
        buf.ctypes.data,
        length,
    )
    if status:
        _raise(_load(), status)
    return buf


def slot_mapping_paged(
    block_table: IntArrayLike,
    num_blocks_per_req: IntArrayLike,
    query_start_loc: IntArrayLike,
    positions: IntArrayLike,
    block_size: int,
    out: I64Array | None = None,
    out_len: int | None = None,
) -> I64Array:
    """The paged reference of :func:`slot_mapping_ranges` over a dense (num_reqs, max_blocks) block table."""
    table = _as_i32(block_table, "block_table")
    nblocks = _as_i32(num_blocks_per_req, "num_blocks_per_req")
    qsl = _as_i32(query_start_loc, "query_start_loc")
    pos = _as_i64(positions, "positions")
    if nblocks.ndim != 1 or qsl.ndim != 1 or qsl.size != nblocks.size + 1:
        raise ValueError("query_start_loc must have num_reqs + 1 entries, num_blocks_per_req num_reqs")
    num_reqs = nblocks.size
    if table.ndim != 2 or table.shape[0] != num_reqs:
        if table.size or num_reqs:
            raise ValueError(f"block_table must have shape ({num_reqs}, max_blocks), got {table.shape}")
        table = table.reshape(0, 0)
    num_tokens = int(qsl[-1])
    if num_tokens > pos.size:
        raise ValueError(f"query_start_loc[-1]={num_tokens} exceeds the {pos.size} positions given")
    buf, length = _out_buffer(out, out_len, num_tokens)
    status = _load().tagma_slot_mapping_paged(
        table.ctypes.data,
        table.shape[1],
        nblocks.ctypes.data,
        num_reqs,
        qsl.ctypes.data,
        pos.ctypes.data,
        _check_i64(block_size, "block_size"),
        buf.ctypes.data,
        length,
    )
    if status:
        _raise(_load(), status)
    return buf


# ------------------------------------------------------------------- slot mapping for one step (hot path)


class _CSlotMappingBatch(ctypes.Structure):
    """Mirror of ``tagma_slot_mapping_batch`` (tagma.h); pointers as integer addresses."""

    _fields_ = [
        ("ranges", _VP),
        ("ranges_capacity", _I64),
        ("req_range_offsets", _VP),
        ("max_reqs", _I64),
        ("query_start_loc", _VP),
        ("positions", _VP),
        ("positions_capacity", _I64),
        ("out", _VP),
        ("out_len", _I64),
        ("num_reqs", _I64),
        ("block_size", _I64),
    ]


class SlotMappingStep:
    """A prepared ``tagma_slot_mapping_step``: buffers that stay put are bound once, a call sets the rest.

    Pointers are integer addresses (``tensor.data_ptr()``, ``array.ctypes.data``); the caller keeps the
    buffers alive while they are bound. A call checks only that its counts fit int64 (a ctypes field would
    wrap them); the engine validates every index against the bound capacities and returns an error status,
    raised here as a :class:`TagmaError` with the engine's message. See tagma.h for what the engine checks
    and assumes (each request's tokens are consecutive positions; ``query_start_loc`` has ``num_reqs + 1``
    entries).
    """

    __slots__ = ("_args", "_args_p", "_fn", "_lib")

    def __init__(self, block_size: int) -> None:
        lib = _load()
        self._lib = lib
        self._fn = lib.tagma_slot_mapping_step
        self._args = _CSlotMappingBatch()
        self._args.block_size = _check_i64(block_size, "block_size")
        self._args_p = ctypes.c_void_p(ctypes.addressof(self._args))

    @property
    def block_size(self) -> int:
        return self._args.block_size

    def bind_ranges(
        self, ranges_ptr: int | None, ranges_capacity: int, offsets_ptr: int, max_reqs: int
    ) -> None:
        """The flat descriptors: ``ranges_capacity`` int32 triples at ``ranges_ptr``, ``max_reqs + 1`` int32
        offsets at ``offsets_ptr``."""
        _check_i64(ranges_capacity, "ranges_capacity")  # before anything is bound: all or nothing
        _check_i64(max_reqs, "max_reqs")
        a = self._args
        a.ranges = ranges_ptr
        a.ranges_capacity = ranges_capacity
        a.req_range_offsets = offsets_ptr
        a.max_reqs = max_reqs

    def bind_out(self, out_ptr: int | None, out_len: int) -> None:
        """vLLM's slot-mapping buffer: ``out_len`` int64 entries, padded with -1 past the step's tokens."""
        self._args.out_len = _check_i64(out_len, "out_len")
        self._args.out = out_ptr

    def __call__(
        self, num_reqs: int, query_start_loc_ptr: int, positions_ptr: int, num_positions: int
    ) -> None:
        """Fill the bound ``out`` for ``num_reqs`` requests: ``num_reqs + 1`` int32 query start locations at
        ``query_start_loc_ptr``, ``num_positions`` int64 positions at ``positions_ptr``."""
        if not (_I64_MIN <= num_reqs <= _I64_MAX and _I64_MIN <= num_positions <= _I64_MAX):
            _check_i64(num_reqs, "num_reqs")  # a ctypes field wraps what it is given
            _check_i64(num_positions, "num_positions")
        a = self._args
        a.num_reqs = num_reqs
        a.query_start_loc = query_start_loc_ptr
        a.positions = positions_ptr
        a.positions_capacity = num_positions
        status = self._fn(self._args_p)
        if status:
            _raise(self._lib, status)


def slot_mapping_step(
    ranges: IntArrayLike,
    req_range_offsets: IntArrayLike,
    query_start_loc: IntArrayLike,
    positions: IntArrayLike,
    block_size: int,
    out: I64Array | None = None,
    out_len: int | None = None,
) -> I64Array:
    """:func:`slot_mapping_ranges` for batches of consecutive runs, through :class:`SlotMappingStep`.

    Request r's tokens must sit at consecutive positions from ``positions[query_start_loc[r]]`` (how vLLM
    schedules them); only each request's first and last position is read. Converts its arguments on every
    call (for tests and one-off use); the worker binds its buffers once instead.
    """
    rng = _as_i32(ranges, "ranges").reshape(-1, 3)
    offsets = _as_i32(req_range_offsets, "req_range_offsets")
    qsl = _as_i32(query_start_loc, "query_start_loc")
    pos = _as_i64(positions, "positions")
    if offsets.ndim != 1 or qsl.shape != offsets.shape or offsets.size == 0:
        raise ValueError("req_range_offsets and query_start_loc must be 1-D arrays of num_reqs + 1 entries")
    buf, length = _out_buffer(out, out_len, int(qsl[-1]))
    step = SlotMappingStep(block_size)
    step.bind_ranges(rng.ctypes.data, rng.shape[0], offsets.ctypes.data, offsets.size - 1)
    step.bind_out(buf.ctypes.data, length)
    step(offsets.size - 1, qsl.ctypes.data, pos.ctypes.data, pos.size)
    return buf


def coord_offset(layout: CoordLayout, layer: int, block: int, token: int) -> int:
    """Byte offset ((layer * num_blocks + block) * block_size + token) * bytes_per_token, bounds-checked."""
    lib = _load()
    c_layout = _CCoordLayout(
        _check_i64(layout.num_layers, "num_layers"),
        _check_i64(layout.num_blocks, "num_blocks"),
        _check_i64(layout.block_size, "block_size"),
        _check_i64(layout.bytes_per_token, "bytes_per_token"),
    )
    out = _I64(0)
    status = lib.tagma_coord_offset(
        ctypes.addressof(c_layout),
        _check_i64(layer, "layer"),
        _check_i64(block, "block"),
        _check_i64(token, "token"),
        ctypes.addressof(out),
    )
    if status:
        _raise(lib, status)
    return out.value
