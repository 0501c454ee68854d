"""The tagma engine's ABI values (``tagma/csrc/tagma.h``): enums, result types, ctypes mirrors, signatures.

Also the conversions that every call applies to buffers and integers before they cross the ABI. The status
codes live with the errors they map to, in :mod:`tagma.errors`; they are re-exported here.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    pass

from tagma.errors import (
    TAGMA_E_INVALID_ARG,
    TAGMA_E_OUT_OF_RANGE,
    TAGMA_E_OVERFLOW,
    InvalidArgumentError,
    InvalidMemberError,
    OutOfRangeError,
    TagmaOverflowError,
)

__all__ = [
    "AppendResult",
    "CoordLayout",
    "EngineStats",
    "I32Array",
    "I64Array",
    "IntArrayLike",
    "Policy",
    "Range",
    "parse_member",
]

I32Array = npt.NDArray[np.int32]
I64Array = npt.NDArray[np.int64]
IntArrayLike = npt.ArrayLike

_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_U64_END: Final = 2**64


# ------------------------------------------------------------------------------------- values at the ABI


_E = TypeVar("_E", bound=enum.IntEnum)


def parse_member(cls: type[_E], value: str | int, what: str) -> _E:
    """An engine enum member by name (any case, ``-`` or ``_``) or by value; anything else (a value outside
    the members, one outside the C type's range included: ctypes would wrap it) raises
    :class:`~tagma.errors.InvalidMemberError` (an ``InvalidArgumentError`` and a ``ValueError``) naming
    ``what``, the value and the members."""
    try:
        if isinstance(value, str):
            return cls[value.strip().upper().replace("-", "_")]
        return cls(value)
    except (KeyError, ValueError):
        names = ", ".join(f"{m.name.lower()} ({m.value})" for m in cls)
        raise InvalidMemberError(
            TAGMA_E_INVALID_ARG, f"unknown {what} {value!r}; expected one of: {names}"
        ) from None


class Policy(enum.IntEnum):
    """Placement policy for a new range (in-place growth of the last range is always tried first)."""

    FIRST_FIT = 0
    BEST_FIT = 1
    HEADROOM = 2
    RESERVE = 3

    @classmethod
    def parse(cls, value: str | int) -> Policy:
        """``"best_fit"``, ``"BEST-FIT"``, ``1`` or ``Policy.BEST_FIT`` -> ``Policy.BEST_FIT``."""
        return parse_member(cls, value, "tagma policy")


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Mirror of ``tagma_stats``."""

    num_blocks: int
    usable_blocks: int
    free_blocks: int
    cached_only_blocks: int
    used_blocks: int
    free_ranges: int
    largest_free_range: int
    external_fragmentation: float
    live_requests: int
    total_request_ranges: int
    max_request_ranges: int
    in_place_growths: int
    new_ranges: int
    merges: int
    evictions: int
    appended_blocks: int


@dataclass(frozen=True, slots=True)
class Range:
    """One extent of a request: physical [start, start + count) holds logical blocks from first_logical on."""

    start: int
    count: int
    first_logical: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Physical ids of the appended blocks in logical order, and the blocks evicted to make room."""

    new_blocks: I32Array
    evicted: I32Array


@dataclass(frozen=True, slots=True)
class CoordLayout:
    """Coordinate layout: n(layer, block, token) = (layer * num_blocks + block) * block_size + token."""

    num_layers: int
    num_blocks: int
    block_size: int
    bytes_per_token: int


class _CStats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_double if name == "external_fragmentation" else ctypes.c_int64)
        for name in EngineStats.__dataclass_fields__
    ]


class _CCoordLayout(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in CoordLayout.__dataclass_fields__]


# ------------------------------------------------------------------------------------- ABI signatures

_VP = ctypes.c_void_p
_I32 = ctypes.c_int32
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_STATUS = ctypes.c_int32

# name -> (restype, argtypes). Pointers are c_void_p: callers pass integer addresses (or None for NULL).
_SIGNATURES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "tagma_last_error": (ctypes.c_char_p, []),
    "tagma_version": (ctypes.c_char_p, []),
    "tagma_engine_create": (_STATUS, [_I64, _I64, _I32, _VP]),
    "tagma_engine_destroy": (_STATUS, [_U64]),
    "tagma_engine_set_policy": (_STATUS, [_U64, _I32]),
    "tagma_engine_set_admission": (_STATUS, [_U64, _I32, _I32]),
    "tagma_engine_stats": (_STATUS, [_U64, _VP]),
    "tagma_request_create": (_STATUS, [_U64, _VP]),
    "tagma_request_release": (_STATUS, [_U64, _U64]),
    "tagma_request_free_front": (_STATUS, [_U64, _U64, _I64]),
    "tagma_request_append": (_STATUS, [_U64, _U64, _I64, _VP, _VP, _VP]),
    "tagma_request_attach": (_STATUS, [_U64, _U64, _VP, _I64]),
    "tagma_request_num_blocks": (_STATUS, [_U64, _U64, _VP]),
    "tagma_request_num_ranges": (_STATUS, [_U64, _U64, _VP]),
    "tagma_request_ranges": (_STATUS, [_U64, _U64, _VP, _I64, _VP]),
    "tagma_request_block": (_STATUS, [_U64, _U64, _I64, _VP]),
    "tagma_request_blocks": (_STATUS, [_U64, _U64, _I64, _I64, _VP]),
    "tagma_cache_mark": (_STATUS, [_U64, _VP, _I64]),
    "tagma_cache_unmark": (_STATUS, [_U64, _VP, _I64]),
    "tagma_cache_evict": (_STATUS, [_U64, _I64, _VP, _VP]),
    "tagma_cache_clear": (_STATUS, [_U64, _VP]),
    "tagma_block_state": (_STATUS, [_U64, _VP, _VP, _I64]),
    "tagma_free_ranges": (_STATUS, [_U64, _VP, _I64, _VP]),
    "tagma_lru_order": (_STATUS, [_U64, _VP, _I64, _VP]),
    "tagma_ranges_histogram": (_STATUS, [_U64, _VP, _I64]),
    "tagma_slot_mapping_ranges": (_STATUS, [_VP, _VP, _I64, _VP, _VP, _I64, _VP, _I64]),
    "tagma_slot_mapping_paged": (_STATUS, [_VP, _I64, _VP, _I64, _VP, _VP, _I64, _VP, _I64]),
    "tagma_slot_mapping_step": (_STATUS, [_VP]),
    "tagma_coord_offset": (_STATUS, [_VP, _I64, _I64, _I64, _VP]),
    # range manager
    "tagma_request_append_runs": (_STATUS, [_U64, _U64, _I64, _I64, _VP, _I64, _VP]),
    "tagma_append_runs_batch": (_STATUS, [_VP]),
}


class _CAppendBatch(ctypes.Structure):
    """Mirror of ``tagma_append_batch`` (tagma.h); pointers as integer addresses."""

    _fields_ = [
        ("engine", _U64),
        ("requests", _VP),
        ("counts", _VP),
        ("hints", _VP),
        ("num_requests", _I64),
        ("runs_out", _VP),
        ("runs_capacity", _I64),
        ("run_offsets", _VP),
    ]



# ------------------------------------------------------------------------------------ buffer conversion


_BOUNDS: Final[dict[type, tuple[int, int]]] = {np.int32: (_I32_MIN, _I32_MAX), np.int64: (_I64_MIN, _I64_MAX)}


def _as_int_array(
    values: IntArrayLike,
    dtype: type[np.int32] | type[np.int64],
    what: str,
    range_error: type[OutOfRangeError] = OutOfRangeError,
) -> npt.NDArray[Any]:
    """A C-contiguous ``dtype`` array of the same values; refuses non-integers and values that would wrap
    (``range_error``, naming ``what`` and the value; one vectorised min/max, no loop in Python)."""
    if type(values) is np.ndarray and values.dtype == dtype and values.flags.c_contiguous:
        return values
    arr = np.asarray(values)
    if arr.dtype != dtype:
        if arr.size:
            if arr.dtype.kind not in "iub":
                raise TypeError(f"{what} must be integers, got dtype {arr.dtype}")
            if not np.can_cast(arr.dtype, dtype):
                lo, hi = _BOUNDS[dtype]
                low, high = int(arr.min()), int(arr.max())
                if low < lo or high > hi:
                    raise range_error(
                        TAGMA_E_OUT_OF_RANGE,
                        f"{what} has a value outside {dtype.__name__}: {low if low < lo else high}",
                    )
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr)


def _as_i32(values: IntArrayLike, what: str) -> I32Array:
    return _as_int_array(values, np.int32, what)


def _as_i64(values: IntArrayLike, what: str) -> I64Array:
    return _as_int_array(values, np.int64, what)


# ctypes wraps an int outside its C type silently (``c_uint64(2**64 + r)`` is r). Every integer a caller
# gives goes through one of these before it reaches the ABI. Hot paths inline the comparison and call the
# checker only to raise: ``if not 0 <= request < _U64_END: _check_u64(request, "request")``.


def _check_i64(value: int, what: str) -> int:
    """A count, index, hint or position: int64, else :class:`TagmaOverflowError`."""
    if not _I64_MIN <= value <= _I64_MAX:
        raise TagmaOverflowError(TAGMA_E_OVERFLOW, f"{what} = {value} does not fit int64")
    return value


def _check_u64(value: int, what: str) -> int:
    """An id (request, namespace): uint64, else :class:`OutOfRangeError` (no such id can exist)."""
    if not 0 <= value < _U64_END:
        raise OutOfRangeError(TAGMA_E_OUT_OF_RANGE, f"{what} = {value} is outside uint64 [0, 2**64)")
    return value


def _check_i32(value: int, what: str) -> int:
    """An int32 setting (admission percent and pieces): else :class:`InvalidArgumentError`, as the engine
    answers for a value of the type outside its range."""
    if not _I32_MIN <= value <= _I32_MAX:
        raise InvalidArgumentError(TAGMA_E_INVALID_ARG, f"{what} = {value} does not fit int32")
    return value


def _out_buffer(out: I64Array | None, out_len: int | None, num_tokens: int) -> tuple[I64Array, int]:
    if out is None:
        length = num_tokens if out_len is None else out_len
        return np.empty(max(length, 0), dtype=np.int64), length
    if not (
        isinstance(out, np.ndarray)
        and out.dtype == np.int64
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        raise TypeError("out must be a writeable C-contiguous int64 numpy array")
    length = out.size if out_len is None else out_len
    if length > out.size:
        raise ValueError(f"out_len={length} exceeds the size of out ({out.size})")
    return out, length
