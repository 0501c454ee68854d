"""ctypes binding of the tagma range engine (C ABI in ``tagma/csrc/tagma.h``).

The shared library is loaded lazily, on first use, from ``$TAGMA_LIB`` when set, else from
``tagma/_lib/libtagma.so``; importing this module never needs it. Every ABI function returns a status; a
non-zero status raises the :class:`TagmaError` subclass for that status, carrying the engine's last-error
text. Buffers cross the ABI as numpy arrays passed by address (``c_void_p`` argtypes), and each engine keeps
its out-parameter scratch objects and bound function objects, so a call costs one ctypes dispatch.
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from types import TracebackType

I32Array = npt.NDArray[np.int32]
I64Array = npt.NDArray[np.int64]
IntArrayLike = npt.ArrayLike

__all__ = [
    "AppendBatch",
    "AppendResult",
    "BlockStateError",
    "CoordLayout",
    "EngineNotBuiltError",
    "EngineStats",
    "InternalError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "MisalignedError",
    "NoSpaceError",
    "OutOfRangeError",
    "Policy",
    "Range",
    "RangeEngine",
    "RequestNotFoundError",
    "TagmaError",
    "TagmaOverflowError",
    "coord_offset",
    "hot_function",
    "library_path",
    "SlotMappingStep",
    "slot_mapping_paged",
    "slot_mapping_ranges",
    "slot_mapping_step",
    "version",
]

# Status codes (tagma.h).
TAGMA_OK: Final = 0
TAGMA_E_INVALID_ARG: Final = 1
TAGMA_E_INVALID_HANDLE: Final = 2
TAGMA_E_NOT_FOUND: Final = 3
TAGMA_E_NO_SPACE: Final = 4
TAGMA_E_MISALIGNED: Final = 5
TAGMA_E_OUT_OF_RANGE: Final = 6
TAGMA_E_OVERFLOW: Final = 7
TAGMA_E_STATE: Final = 8
TAGMA_E_INTERNAL: Final = 9

STATUS_NAMES: Final[dict[int, str]] = {
    TAGMA_OK: "TAGMA_OK",
    TAGMA_E_INVALID_ARG: "TAGMA_E_INVALID_ARG",
    TAGMA_E_INVALID_HANDLE: "TAGMA_E_INVALID_HANDLE",
    TAGMA_E_NOT_FOUND: "TAGMA_E_NOT_FOUND",
    TAGMA_E_NO_SPACE: "TAGMA_E_NO_SPACE",
    TAGMA_E_MISALIGNED: "TAGMA_E_MISALIGNED",
    TAGMA_E_OUT_OF_RANGE: "TAGMA_E_OUT_OF_RANGE",
    TAGMA_E_OVERFLOW: "TAGMA_E_OVERFLOW",
    TAGMA_E_STATE: "TAGMA_E_STATE",
    TAGMA_E_INTERNAL: "TAGMA_E_INTERNAL",
}

_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


# --------------------------------------------------------------------------------------------- errors


class EngineNotBuiltError(ImportError):
    """The engine's shared library is missing or cannot be loaded."""


class TagmaError(Exception):
    """A non-OK status from the engine; ``status`` is the tagma_status, ``message`` its last-error text."""

    status: int
    message: str

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        name = STATUS_NAMES.get(status, f"status {status}")
        super().__init__(f"{message} [{name}]" if message else name)


class InvalidArgumentError(TagmaError):
    """TAGMA_E_INVALID_ARG: zero/negative count, null pointer, unknown policy."""


class InvalidHandleError(TagmaError):
    """TAGMA_E_INVALID_HANDLE: unknown or destroyed engine handle."""


class RequestNotFoundError(TagmaError):
    """TAGMA_E_NOT_FOUND: unknown or released request id."""


class NoSpaceError(TagmaError):
    """TAGMA_E_NO_SPACE: not enough free + evictable blocks."""


class MisalignedError(TagmaError):
    """TAGMA_E_MISALIGNED: count not a multiple of the engine's alignment."""


class OutOfRangeError(TagmaError):
    """TAGMA_E_OUT_OF_RANGE: block id or coordinate outside its bounds."""


class TagmaOverflowError(TagmaError):
    """TAGMA_E_OVERFLOW: arithmetic would overflow int64."""


class BlockStateError(TagmaError):
    """TAGMA_E_STATE: operation not valid for the block's state (e.g. attach a free block)."""


class InternalError(TagmaError):
    """TAGMA_E_INTERNAL: allocation failure or broken invariant inside the engine."""


ERROR_CLASSES: Final[dict[int, type[TagmaError]]] = {
    TAGMA_E_INVALID_ARG: InvalidArgumentError,
    TAGMA_E_INVALID_HANDLE: InvalidHandleError,
    TAGMA_E_NOT_FOUND: RequestNotFoundError,
    TAGMA_E_NO_SPACE: NoSpaceError,
    TAGMA_E_MISALIGNED: MisalignedError,
    TAGMA_E_OUT_OF_RANGE: OutOfRangeError,
    TAGMA_E_OVERFLOW: TagmaOverflowError,
    TAGMA_E_STATE: BlockStateError,
    TAGMA_E_INTERNAL: InternalError,
}


def _error(status: int, message: str) -> TagmaError:
    return ERROR_CLASSES.get(status, TagmaError)(status, message)


# ------------------------------------------------------------------------------------- values at the ABI


_E = TypeVar("_E", bound=enum.IntEnum)


def parse_member(cls: type[_E], value: str | int, what: str) -> _E:
    """An engine enum member by name (any case, ``-`` or ``_``) or by value; a clear error naming ``what``."""
    if isinstance(value, str):
        key = value.strip().upper().replace("-", "_")
        try:
            return cls[key]
        except KeyError:
            names = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown {what} {value!r}; expected one of: {names}") from None
    return cls(value)


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


# ------------------------------------------------------------------------------------------- the library

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

_DEFAULT_LIB: Final = Path(__file__).resolve().parent / "_lib" / "libtagma.so"
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def library_path() -> Path:
    """Where the shared library is looked for: ``$TAGMA_LIB`` when set, else ``tagma/_lib/libtagma.so``."""
    env = os.environ.get("TAGMA_LIB")
    return Path(env) if env else _DEFAULT_LIB


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            path = library_path()
            origin = " (from TAGMA_LIB)" if os.environ.get("TAGMA_LIB") else ""
            if not path.is_file():
                raise EngineNotBuiltError(
                    f"the tagma engine library is not built: {path}{origin} does not exist; "
                    "run `make setup` to build it"
                )
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise EngineNotBuiltError(
                    f"cannot load the tagma engine library {path}{origin}: {exc}; "
                    "run `make setup` to rebuild it"
                ) from exc
            for name, (restype, argtypes) in _SIGNATURES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    raise EngineNotBuiltError(
                        f"the tagma engine library {path}{origin} lacks {name} (stale build?); "
                        "run `make setup` to rebuild it"
                    ) from None
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = lib
    return _lib


def _raise(lib: ctypes.CDLL, status: int) -> NoReturn:
    # Read the thread-local message before any other tagma call can replace it.
    raw = lib.tagma_last_error()
    message = raw.decode("utf-8", "replace") if raw else ""
    raise _error(status, message)


def hot_function(name: str, *argtypes: Any) -> Any:
    """A prebound hot-path entry point: ABI function ``name`` through a ``PYFUNCTYPE`` prototype.

    Unlike the library's ordinary function objects it keeps the GIL during the call (no release and
    re-acquire around a call of a microsecond or less, and no wait for the GIL afterwards when another thread
    holds it); the engine's calls are short and never call back into Python. Pass arguments as ctypes
    objects made once (a ``c_void_p`` to a prefilled struct): a Python int is converted on every call.
    """
    lib = _load()
    if name not in _SIGNATURES:
        raise ValueError(f"{name!r} is not a tagma ABI function")
    return ctypes.PYFUNCTYPE(_STATUS, *argtypes)((name, lib))


def version() -> str:
    """The engine's version string."""
    raw = _load().tagma_version()
    return raw.decode("utf-8", "replace") if raw else ""


# ------------------------------------------------------------------------------------ buffer conversion


_BOUNDS: Final[dict[type, tuple[int, int]]] = {np.int32: (_I32_MIN, _I32_MAX), np.int64: (_I64_MIN, _I64_MAX)}


def _as_int_array(
    values: IntArrayLike, dtype: type[np.int32] | type[np.int64], what: str
) -> npt.NDArray[Any]:
    """A C-contiguous ``dtype`` array of the same values; refuses non-integers and values that would wrap."""
    if type(values) is np.ndarray and values.dtype == dtype and values.flags.c_contiguous:
        return values
    arr = np.asarray(values)
    if arr.dtype != dtype:
        if arr.size:
            if arr.dtype.kind not in "iub":
                raise TypeError(f"{what} must be integers, got dtype {arr.dtype}")
            if not np.can_cast(arr.dtype, dtype):
                lo, hi = _BOUNDS[dtype]
                if int(arr.min()) < lo or int(arr.max()) > hi:
                    raise OutOfRangeError(
                        TAGMA_E_OUT_OF_RANGE, f"{what} has a value outside {dtype.__name__}"
                    )
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr)


def _as_i32(values: IntArrayLike, what: str) -> I32Array:
    return _as_int_array(values, np.int32, what)


def _as_i64(values: IntArrayLike, what: str) -> I64Array:
    return _as_int_array(values, np.int64, what)


def _check_i64(value: int, what: str) -> int:
    """ctypes silently wraps integers outside int64; refuse them instead."""
    if not _I64_MIN <= value <= _I64_MAX:
        raise TagmaOverflowError(TAGMA_E_OVERFLOW, f"{what} = {value} does not fit int64")
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
        pol = Policy.parse(policy) if isinstance(policy, str) else int(policy)
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
        pol = Policy.parse(policy) if isinstance(policy, str) else int(policy)
        status = self._f_set_policy(self._handle, pol)
        if status:
            _raise(self._lib, status)

    def set_admission(self, percent: int, pieces: int = 1) -> None:
        """RESERVE admission: a hinted first append waits until ``percent``% of the hint fits in the
        ``pieces`` largest free parts clear of other requests' expected growth (0: off)."""
        status = self._lib.tagma_engine_set_admission(self._handle, int(percent), int(pieces))
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
        status = self._f_release(self._handle, request)
        if status:
            _raise(self._lib, status)

    def append(self, request: int, count: int) -> AppendResult:
        """Append ``count`` new blocks; returns their ids (logical order) and the blocks evicted for them."""
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
        ids = _as_i32(block_ids, "block_ids")
        status = self._f_attach(self._handle, request, ids.ctypes.data, ids.size)
        if status:
            _raise(self._lib, status)

    def num_blocks_of(self, request: int) -> int:
        status = self._f_num_blocks(self._handle, request, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def num_ranges(self, request: int) -> int:
        status = self._f_num_ranges(self._handle, request, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def ranges_array(self, request: int) -> I32Array:
        """The request's ranges as an (R, 3) int32 array of (physical_start, count, first_logical)."""
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
        status = self._f_block(self._handle, request, logical, self._i32_p)
        if status:
            _raise(self._lib, status)
        return self._i32.value

    def blocks(self, request: int, first: int = 0, count: int | None = None) -> I32Array:
        """Physical ids of logical blocks [first, first + count); to the request's end when count is None.

        With count None an empty tail gives an empty array; an explicit count must be positive (the engine
        rejects zero counts).
        """
        if count is None:
            count = self.num_blocks_of(request) - first
            if count == 0:
                return np.empty(0, dtype=np.int32)
        # No request holds more than num_blocks blocks, so a larger count fails its range check before the
        # engine writes anything: a one-entry buffer stands in for one of that size.
        fits = 0 <= count <= self._num_blocks
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
        cap = min(max(max_blocks, 0), self._num_blocks)
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
        out = np.empty(max(buckets, 0), dtype=np.int64)
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
        cap = count if 0 < count <= self._num_blocks else 1
        buf = np.empty((cap, 2), dtype=np.int32)
        status = self._f_append_runs(
            self._handle, request, _check_i64(count, "count"), _check_i64(hint, "hint"), buf.ctypes.data, cap,
            self._i64_p,
        )
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
        if any(r < 0 or r >= 2**64 for r in ids):
            raise OutOfRangeError(TAGMA_E_OUT_OF_RANGE, "requests has a value outside uint64")
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


class AppendBatch:
    """A prepared ``tagma_append_runs_batch`` on one engine: the range manager's one crossing per step.

    The caller writes entry i into ``requests[i]`` (0: create a request; its id is written back) and
    ``counts[i]`` (ctypes arrays of :attr:`capacity` entries; :meth:`reserve` grows them), then calls
    ``batch(n)``: one prebound call with one prefilled-struct argument and no Python-side checking (the
    engine validates everything and changes nothing on error, raised as a :class:`TagmaError`). Entry i's
    runs are then the int32 pairs ``runs[2 * offsets[i] : 2 * offsets[i + 1]]``. ``runs`` holds a pair per
    block of the engine, so any batch that fits in the free blocks fits in it. With ``hints=True`` entry i
    also carries the growth hint ``hints[i]`` (RESERVE placement); otherwise none.
    """

    __slots__ = (
        "_arg", "_args", "_engine", "_fn", "_hinted", "_lib",
        "counts", "hints", "offsets", "requests", "runs",
    )  # fmt: skip

    def __init__(self, engine: RangeEngine, capacity: int = 64, hints: bool = False) -> None:
        self._engine = engine
        self._hinted = hints
        self.hints: Any = None
        self._lib = engine._lib
        self._fn = hot_function("tagma_append_runs_batch", _VP)
        self._args = _CAppendBatch(engine=engine.handle)
        self._arg = _VP(ctypes.addressof(self._args))
        self.runs = (_I32 * (2 * engine.num_blocks))()
        self._args.runs_out = ctypes.addressof(self.runs)
        self._args.runs_capacity = engine.num_blocks
        self.requests: Any = None
        self.counts: Any = None
        self.offsets: Any = None
        self._bind(max(1, int(capacity)))

    def _bind(self, capacity: int) -> None:
        requests, counts = (_U64 * capacity)(), (_I64 * capacity)()
        hints = (_I64 * capacity)() if self._hinted else None
        if self.requests is not None:  # keep what is written so far
            n = len(self.requests)
            requests[:n] = self.requests[:]
            counts[:n] = self.counts[:]
            if hints is not None:
                hints[:n] = self.hints[:]
        self.requests, self.counts, self.hints = requests, counts, hints
        self.offsets = (_I64 * (capacity + 1))()
        a = self._args
        a.requests = ctypes.addressof(requests)
        a.counts = ctypes.addressof(counts)
        a.hints = ctypes.addressof(hints) if hints is not None else None
        a.run_offsets = ctypes.addressof(self.offsets)

    @property
    def capacity(self) -> int:
        """Entries the bound arrays hold."""
        return len(self.requests)

    def reserve(self, n: int) -> None:
        """Room for ``n`` entries: rebinds the entry arrays (and ``offsets``), keeping what is written."""
        if n > len(self.requests):
            self._bind(max(n, 2 * len(self.requests)))

    def __call__(self, n: int) -> None:
        """Apply entries ``[0, n)`` in one engine call."""
        self._args.num_requests = n
        status = self._fn(self._arg)
        if status:
            _raise(self._lib, status)


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
    buffers alive while they are bound. A call does no Python-side checking: the engine validates every
    index against the bound capacities and returns an error status, raised here as a :class:`TagmaError`
    with the engine's message. See tagma.h for what the engine checks and assumes (each request's tokens
    are consecutive positions; ``query_start_loc`` has ``num_reqs + 1`` entries).
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
        a = self._args
        a.ranges = ranges_ptr
        a.ranges_capacity = ranges_capacity
        a.req_range_offsets = offsets_ptr
        a.max_reqs = max_reqs

    def bind_out(self, out_ptr: int | None, out_len: int) -> None:
        """vLLM's slot-mapping buffer: ``out_len`` int64 entries, padded with -1 past the step's tokens."""
        self._args.out = out_ptr
        self._args.out_len = out_len

    def __call__(
        self, num_reqs: int, query_start_loc_ptr: int, positions_ptr: int, num_positions: int
    ) -> None:
        """Fill the bound ``out`` for ``num_reqs`` requests: ``num_reqs + 1`` int32 query start locations at
        ``query_start_loc_ptr``, ``num_positions`` int64 positions at ``positions_ptr``."""
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
