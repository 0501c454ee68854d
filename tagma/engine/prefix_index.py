"""Binding of the engine's prefix index (``tagma.h``, "prefix index" section).

The index maps a prompt's longest cached prefix, in full blocks, to the physical blocks holding it: a trie
per namespace whose nodes are blocks keyed by their token ids (no hash), inside the range engine, which
keeps the blocks' cache references and evicts by the index's mode (:class:`EvictionMode`). A namespace is a
uint64 the caller interns (:meth:`PrefixIndex.namespace`), e.g. from ``(cache_salt, lora_name, extra
keys)``: requests of different namespaces never share a block.

Token ids come from vLLM as Python lists (``Request.prompt_token_ids``; ``all_token_ids`` is a
``ConstantList`` over one). Getting them to C costs more than the index itself, so for a list, tuple or
``ConstantList`` the binding makes one call into ``libtagma_pylist.so``, a CPython extension built beside the
engine (``METH_FASTCALL``, no ctypes machinery), which reads the items in place into a thread-local int32
buffer and calls the engine function through its address; an int32 buffer (numpy int32 array,
``array.array('i')``) is read in place through the buffer protocol. Without the extension (no Python
headers at build time) int32 buffers go by address and other sequences through ``array.array('i', ...)``,
whose length (never the caller's) is the count passed; buffers that are not 1-D C-contiguous native int32
(``bytes``, int64 arrays, strided views) are refused on both paths with the same
:class:`~tagma.errors.TokenIdsError`, token ids outside int32 with :class:`~tagma.errors.TokenRangeError`.
Measured on this project's 2-core CPU machine, loaded, outside ``make bench-host`` (131,072 random ids
below 128,000, block 16, medians of 7): ``array.array('i', lst)`` 16-35 ns/token, ``np.array(lst,
dtype=np.int32)`` 68, ``np.fromiter`` 52; the index from int32 tokens: insert 0.58 + lookup 0.23 ns/token;
from the list through the reader: insert 2.25 + lookup 1.15 ns/token (conversion included), against 142
ns/token for vLLM's sha256 block hashing in the same run. A one-block lookup from a list cost 0.41 us
against 0.55 us for a bare 3-argument ctypes call of the engine (the reader's fastcall path is cheaper
than ctypes'). ``make bench-host`` (section ``prefix_index``) re-measures all of this.

Functions are bound once (ctypes prototypes for the engine, the reader's function); a call does no
Python-side validation that the engine repeats (it validates every argument and the binding raises its
status as a :class:`tagma.errors.TagmaError`), only what the engine cannot see: that ids and counts fit
their C types (ctypes would wrap them) and what a token container holds.
"""

from __future__ import annotations

import array
import ctypes
import enum
import importlib.machinery
import importlib.util
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from tagma.engine.abi import (
    _I32_MAX,
    _I32_MIN,
    _I64_MAX,
    _I64_MIN,
    _U64_END,
    I32Array,
    _as_int_array,
    _check_i64,
    _check_u64,
    parse_member,
)
from tagma.engine.loader import _load, _raise, library_path
from tagma.engine.range_engine import RangeEngine
from tagma.errors import TAGMA_E_INVALID_ARG, TAGMA_E_OUT_OF_RANGE, TokenIdsError, TokenRangeError

__all__ = ["EvictionMode", "PrefixIndex", "PrefixStats", "pylist_available"]

_VP = ctypes.c_void_p
_I32 = ctypes.c_int32
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_STATUS = ctypes.c_int32

_SIGNATURES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "tagma_prefix_enable": (_STATUS, [_U64, _I64, _I32]),
    "tagma_prefix_set_eviction_mode": (_STATUS, [_U64, _I32]),
    "tagma_prefix_lookup": (_STATUS, [_U64, _U64, _VP, _I64, _I64, _VP, _VP]),
    "tagma_prefix_lookup_attach": (_STATUS, [_U64, _U64, _U64, _VP, _I64, _I64, _VP]),
    "tagma_prefix_insert": (_STATUS, [_U64, _U64, _U64, _VP, _I64, _I64, _VP]),
    "tagma_prefix_clear": (_STATUS, [_U64, _VP]),
    "tagma_prefix_stats_get": (_STATUS, [_U64, _VP]),
}

_PYLIST_NAME: Final = "libtagma_pylist.so"
_bound: ctypes.CDLL | None = None
_pylist: Any = None  # the reader extension's module, False when it is not there
_lock = threading.Lock()


class EvictionMode(enum.IntEnum):
    """Which cache-only blocks an append evicts (tagma.h, ``TAGMA_EVICT_*``)."""

    #: exactly vLLM's order: LRU victims (with their subtrees) until enough blocks are free
    LRU = 0
    #: cache-only blocks are placeable space: growth in place over the blocks after a request, new ranges
    #: where their growth hint fits (anchored at an LRU victim), evicting only the cached blocks taken
    CONTIGUOUS = 1

    @classmethod
    def parse(cls, value: str | int) -> EvictionMode:
        return parse_member(cls, value, "eviction mode")


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """Mirror of ``tagma_prefix_stats``."""

    block_size: int
    eviction_mode: int
    namespaces: int
    indexed_blocks: int
    lookups: int
    lookup_blocks: int
    hit_blocks: int
    inserted_blocks: int
    duplicate_blocks: int
    evicted_blocks: int
    subtree_blocks: int
    in_place_evictions: int
    window_evictions: int
    clears: int


class _CPrefixStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in PrefixStats.__dataclass_fields__]


def _bind() -> ctypes.CDLL:
    global _bound, _pylist
    if _bound is not None:
        return _bound
    with _lock:
        if _bound is None:
            lib = _load()
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)  # the engine's loader already names a stale build
                fn.restype = restype
                fn.argtypes = argtypes
            path = library_path().with_name(_PYLIST_NAME)
            reader: Any = False
            if path.is_file():
                try:
                    loader = importlib.machinery.ExtensionFileLoader("libtagma_pylist", str(path))
                    spec = importlib.util.spec_from_file_location("libtagma_pylist", path, loader=loader)
                    assert spec is not None
                    module = importlib.util.module_from_spec(spec)
                    loader.exec_module(module)
                    reader = module
                except (ImportError, OSError, AttributeError):
                    reader = False
            _pylist = reader
            _bound = lib
    return _bound


def _bounds_error(start: int, stop: int, size: int) -> ValueError:
    return ValueError(f"token bounds [{start}, {stop}) are invalid for {size} tokens")  # the reader's words


def _token_view(token_ids: Any) -> memoryview | None:
    """``token_ids`` as a 1-D C-contiguous native int32 memoryview, or None when it is no buffer (a list, a
    tuple, another sequence); any other buffer is refused as the C reader refuses it."""
    if type(token_ids) is list or type(token_ids) is tuple:
        return None
    try:
        view = memoryview(token_ids)
    except TypeError:
        return None
    fmt = view.format
    if not (view.itemsize == 4 and view.ndim == 1 and fmt[-1:] == "i" and (len(fmt) == 1 or fmt[0] in "=@<")):
        raise TokenIdsError(
            TAGMA_E_INVALID_ARG,
            f"a token buffer must be 1-D native int32, got format '{fmt}' of {view.itemsize} bytes",
        )
    if not view.c_contiguous:
        raise TokenIdsError(TAGMA_E_INVALID_ARG, "a token buffer must be C-contiguous, got a strided view")
    return view


def _token_item_error(items: Any, start: int) -> TokenIdsError | TokenRangeError | None:
    """The reader's error for the first token of ``items`` (ids from ``start`` on) that is no int32 int."""
    for i, item in enumerate(items):
        if not isinstance(item, int):
            return TokenIdsError(
                TAGMA_E_INVALID_ARG, f"token id at index {start + i} is a {type(item).__name__}, not an int"
            )
        if not _I32_MIN <= item <= _I32_MAX:
            return TokenRangeError(TAGMA_E_OUT_OF_RANGE, f"token id at index {start + i} does not fit int32")
    return None


def _as_token_array(token_ids: Any, start: int, stop: int) -> array.array[int]:
    """``token_ids[start:stop]`` (a sequence that is no buffer) as a new ``array.array('i')``, or the
    reader's typed error. Its length, not ``stop - start``, is what the engine may read."""
    part = token_ids[start:stop]
    if type(part) is not list and _token_view(part) is not None:  # a slice that is a buffer: int32 only
        buf = array.array("i")
        buf.frombytes(part)
        return buf
    try:
        return array.array("i", part)
    except (TypeError, OverflowError) as exc:
        error = _token_item_error(part, start)
        if error is None:
            raise TokenIdsError(TAGMA_E_INVALID_ARG, f"token ids: {exc}") from None
        raise error from None


def _reader_error(token_ids: Any, exc: Exception) -> None:
    """Raise the typed error for what the C reader refused (its own message); return when it is not about
    the tokens (bounds: the caller re-raises the reader's ``ValueError``)."""
    _token_view(token_ids)  # a buffer it refused: not int32, or strided (a BufferError or ValueError there)
    if isinstance(exc, TypeError):
        raise TokenIdsError(TAGMA_E_INVALID_ARG, str(exc)) from None
    if isinstance(exc, OverflowError):
        raise TokenRangeError(TAGMA_E_OUT_OF_RANGE, str(exc)) from None


def pylist_available() -> bool:
    """Whether token lists are read in C (``libtagma_pylist.so`` next to the engine library)."""
    _bind()
    return bool(_pylist)


class PrefixIndex:
    """The prefix index of one :class:`RangeEngine` (enabled on it by the constructor; once per engine).

    Token ids may be a list, a tuple, vLLM's ``ConstantList``, a numpy int32 array (used in place) or any
    sequence of ints (converted with ``array.array``). Calls on one engine must be serialized.
    """

    __slots__ = (
        "_engine",
        "_f_attach",
        "_f_clear",
        "_f_insert",
        "_f_lookup",
        "_f_mode",
        "_f_stats",
        "_fns",
        "_h",
        "_i64",
        "_i64_p",
        "_lib",
        "_namespaces",
        "_reader",
        "_tokens_into",
        "_stats",
        "_stats_p",
        "block_size",
    )

    def __init__(
        self, engine: RangeEngine, block_size: int, eviction_mode: EvictionMode | int | str = EvictionMode.LRU
    ) -> None:
        lib = _bind()
        self._lib = lib
        self._engine = engine
        self._h = engine.handle
        mode = EvictionMode.parse(eviction_mode)
        status = lib.tagma_prefix_enable(self._h, _check_i64(block_size, "block_size"), mode)
        if status:
            _raise(lib, status)
        self.block_size = int(block_size)
        self._f_lookup = lib.tagma_prefix_lookup
        self._f_attach = lib.tagma_prefix_lookup_attach
        self._f_insert = lib.tagma_prefix_insert
        self._f_clear = lib.tagma_prefix_clear
        self._f_stats = lib.tagma_prefix_stats_get
        self._f_mode = lib.tagma_prefix_set_eviction_mode
        self._reader = _pylist.prefix_call if _pylist else False
        self._tokens_into = _pylist.tokens_into if _pylist else None
        self._i64 = _I64(0)
        self._i64_p = ctypes.addressof(self._i64)
        self._stats = _CPrefixStats()
        self._stats_p = ctypes.addressof(self._stats)
        self._fns = tuple(
            ctypes.cast(fn, ctypes.c_void_p).value for fn in (self._f_lookup, self._f_attach, self._f_insert)
        )
        self._namespaces: dict[Hashable, int] = {}

    @property
    def engine(self) -> RangeEngine:
        return self._engine

    def namespace(self, key: Hashable) -> int:
        """The namespace id of ``key`` (e.g. ``(cache_salt, lora_name, extra_keys)``), interned: equal keys
        get equal ids, different keys different ids, for the life of this index."""
        ns = self._namespaces.get(key)
        if ns is None:
            ns = self._namespaces[key] = len(self._namespaces)
        return ns

    def tokens_array(self, token_ids: Sequence[int], start: int = 0, stop: int | None = None) -> I32Array:
        """``token_ids[start:stop]`` as a new int32 array (read in C where the reader is built): convert a
        request's prompt once and pass the array to later calls, which then read it in place."""
        end = len(token_ids) if stop is None else min(stop, len(token_ids))
        if start < 0 or end < start:
            raise _bounds_error(start, end, len(token_ids))
        if type(token_ids) is np.ndarray:  # any integer dtype; values outside int32 are refused, not wrapped
            if token_ids.ndim != 1 or token_ids.dtype.kind not in "iub":
                what = f"{token_ids.dtype} {token_ids.shape}"
                raise TokenIdsError(TAGMA_E_INVALID_ARG, f"a token array must be 1-D integers, got {what}")
            return np.array(_as_int_array(token_ids[start:end], np.int32, "token_ids", TokenRangeError))
        view = _token_view(token_ids)
        if view is not None:
            return np.array(view[start:end], dtype=np.int32)
        if self._tokens_into is None:
            return np.array(_as_token_array(token_ids, start, end), dtype=np.int32)
        out = np.empty(end - start, dtype=np.int32)
        try:
            self._tokens_into(token_ids, start, end, out.ctypes.data, out.size)
        except (TypeError, OverflowError) as exc:
            _reader_error(token_ids, exc)
            raise
        return out

    # ---- operations

    def _call(self, op: int, ns: int, request: int, token_ids: Any, start: int, stop: int, max_blocks: int,
              ids_out: int | None) -> int:
        """One engine call on token_ids[start:stop] (stop clipped to the length); returns its int result.

        ns and request must fit uint64, start, stop and max_blocks int64 (the callers check the latter)."""
        if not (0 <= ns < _U64_END and 0 <= request < _U64_END):
            _check_u64(ns, "ns")
            _check_u64(request, "request")
        if self._reader:
            try:
                result: int = self._reader(
                    self._fns[op], op, self._h, ns, request, token_ids, start, stop, max_blocks, ids_out
                )
            except (TypeError, OverflowError, ValueError, BufferError) as exc:
                _reader_error(token_ids, exc)
                raise
            if result < 0:
                _raise(self._lib, -result)
            return result
        else:
            view = _token_view(token_ids)
            if view is not None:  # read in place, within the buffer
                size = len(view)
                if start < 0 or min(stop, size) < start:
                    raise _bounds_error(start, stop, size)
                arr = token_ids if type(token_ids) is np.ndarray else np.frombuffer(view, dtype=np.int32)
                ptr = arr.ctypes.data + 4 * start
                count = min(stop, size) - start
            else:
                size = len(token_ids)
                if start < 0 or min(stop, size) < start:
                    raise _bounds_error(start, stop, size)
                buf = _as_token_array(token_ids, start, min(stop, size))
                ptr = buf.buffer_info()[0]
                count = len(buf)  # what was built, whatever the sequence's length claims
            if op == 0:
                status = self._f_lookup(self._h, ns, ptr, count, max_blocks, ids_out, self._i64_p)
            elif op == 1:
                status = self._f_attach(self._h, ns, request, ptr, count, max_blocks, self._i64_p)
            else:
                status = self._f_insert(self._h, ns, request, ptr, start, count, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def _span(self, token_ids: Any, max_blocks: int | None) -> tuple[int, int]:
        """(tokens to read, max_blocks to pass): only the full blocks a lookup may walk are converted."""
        if max_blocks is None:
            n = len(token_ids) // self.block_size
            return n * self.block_size, n
        if not _I64_MIN <= max_blocks <= _I64_MAX:
            _check_i64(max_blocks, "max_blocks")
        return max(min(max_blocks, len(token_ids) // self.block_size), 0) * self.block_size, max_blocks

    def lookup(self, ns: int, token_ids: Sequence[int] | I32Array, max_blocks: int | None = None) -> int:
        """Number of leading full blocks of token_ids cached in namespace ns (at most max_blocks)."""
        stop, cap = self._span(token_ids, max_blocks)
        return self._call(0, ns, 0, token_ids, 0, stop, cap, None)

    def lookup_ids(
        self, ns: int, token_ids: Sequence[int] | I32Array, max_blocks: int | None = None
    ) -> I32Array:
        """The physical ids of the cached prefix's blocks, in logical order."""
        stop, cap = self._span(token_ids, max_blocks)
        out = np.empty(stop // self.block_size, dtype=np.int32)
        hit = self._call(0, ns, 0, token_ids, 0, stop, min(cap, out.size), out.ctypes.data)
        return out[:hit]

    def lookup_attach(
        self, ns: int, request: int, token_ids: Sequence[int] | I32Array, max_blocks: int | None = None
    ) -> int:
        """Look up and attach the cached prefix to ``request`` (a fresh engine request) in one call; returns
        the number of blocks attached (the request's ranges hold them)."""
        stop, cap = self._span(token_ids, max_blocks)
        return self._call(1, ns, request, token_ids, 0, stop, cap, None)

    def insert(
        self,
        ns: int,
        request: int,
        token_ids: Sequence[int] | I32Array,
        start: int = 0,
        stop: int | None = None,
    ) -> int:
        """Index the request's full blocks not indexed yet; ``token_ids[start:stop]`` are read (the request's
        tokens from position ``start``, which must not be past its first unindexed token). Returns the number
        of the request's blocks indexed afterwards: pass ``start = that * block_size`` next time."""
        if start < 0:
            raise ValueError(f"start {start} must be >= 0")
        end = len(token_ids) if stop is None else min(_check_i64(stop, "stop"), len(token_ids))
        return self._call(2, ns, request, token_ids, _check_i64(start, "start"), end, 0, None)

    def clear(self) -> int:
        """Drop every cached block (vLLM's ``reset_prefix_cache``); returns how many had a cache reference."""
        status = self._f_clear(self._h, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def set_eviction_mode(self, mode: EvictionMode | int | str) -> None:
        status = self._f_mode(self._h, EvictionMode.parse(mode))
        if status:
            _raise(self._lib, status)

    def stats(self) -> PrefixStats:
        status = self._f_stats(self._h, self._stats_p)
        if status:
            _raise(self._lib, status)
        s = self._stats
        return PrefixStats(*(getattr(s, name) for name in PrefixStats.__dataclass_fields__))
