"""ctypes binding of the engine's prefix index (``tagma.h``, "prefix index" section).

The index maps a prompt's longest cached prefix, in full blocks, to the physical blocks holding it: a trie
per namespace whose nodes are blocks keyed by their token ids (no hash), inside the range engine, which
keeps the blocks' cache references and evicts by the index's mode (:class:`EvictionMode`). A namespace is a
uint64 the caller interns (:meth:`PrefixIndex.namespace`), e.g. from ``(cache_salt, lora_name, extra
keys)``: requests of different namespaces never share a block.

Token ids come from vLLM as Python lists (``Request.prompt_token_ids``; ``all_token_ids`` is a
``ConstantList`` over one). Getting them to C costs more than the index itself, so the binding reads the
list in C through the CPython API (``libtagma_pylist.so``, loaded with ``ctypes.PyDLL``) into a scratch
int32 buffer it keeps, and falls back to ``array.array('i', ...)`` where that library was not built.
Measured on this project's 2-core CPU machine (131,072 random token ids, best of 5; `make bench-host`
section ``prefix_index`` re-measures): ``array.array('i', lst)`` 35 ns/token, ``np.array(lst,
dtype=np.int32)`` 68 ns/token, ``np.fromiter`` 52 ns/token; the C reader's number is in the bench report.
A numpy int32 array is used in place (no copy).

Prototypes are bound once; a call does no Python-side validation that the engine repeats (it validates
every argument and the binding raises its status as a :class:`tagma.engine.TagmaError`).
"""

from __future__ import annotations

import array
import ctypes
import enum
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from tagma.engine import I32Array, RangeEngine, _load, _raise, library_path

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
_pylist: Any = None  # the bound tagma_py_tokens_into, False when the library is not there
_lock = threading.Lock()


class EvictionMode(enum.IntEnum):
    """Which cache-only blocks an append evicts (tagma.h, ``TAGMA_EVICT_*``)."""

    #: exactly vLLM's order, one block at a time
    LRU = 0
    #: in-place growth over cache-only neighbours, then contiguous windows around the LRU victim
    CONTIGUOUS = 1
    #: CONTIGUOUS, and growth evicts its cache-only neighbours even when free blocks exist elsewhere
    IN_PLACE = 2

    @classmethod
    def parse(cls, value: str | int) -> EvictionMode:
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            try:
                return cls[key]
            except KeyError:
                names = ", ".join(m.name.lower() for m in cls)
                raise ValueError(f"unknown eviction mode {value!r}; expected one of: {names}") from None
        return cls(value)


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
                    reader = ctypes.PyDLL(str(path)).tagma_py_prefix_call
                except (OSError, AttributeError):
                    reader = False
                else:
                    reader.restype = _I32
                    reader.argtypes = [
                        _VP, _I32, _U64, _U64, _U64, ctypes.py_object, _I64, _I64, _I64, _VP, _VP
                    ]
            _pylist = reader
            _bound = lib
    return _bound


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
        mode = EvictionMode.parse(eviction_mode) if isinstance(eviction_mode, str) else int(eviction_mode)
        status = lib.tagma_prefix_enable(self._h, block_size, mode)
        if status:
            _raise(lib, status)
        self.block_size = int(block_size)
        self._f_lookup = lib.tagma_prefix_lookup
        self._f_attach = lib.tagma_prefix_lookup_attach
        self._f_insert = lib.tagma_prefix_insert
        self._f_clear = lib.tagma_prefix_clear
        self._f_stats = lib.tagma_prefix_stats_get
        self._f_mode = lib.tagma_prefix_set_eviction_mode
        self._reader = _pylist
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

    # ---- operations

    def _call(self, op: int, ns: int, request: int, token_ids: Any, start: int, stop: int, max_blocks: int,
              ids_out: int | None) -> int:
        """One engine call on token_ids[start:stop] (stop clipped to the length); returns its int result."""
        if self._reader and type(token_ids) is not np.ndarray:
            status = self._reader(
                self._fns[op], op, self._h, ns, request, token_ids, start, stop, max_blocks, ids_out,
                self._i64_p,
            )
        else:
            if type(token_ids) is np.ndarray:
                arr = token_ids
                if arr.dtype != np.int32 or not arr.flags.c_contiguous or arr.ndim != 1:
                    raise TypeError("a numpy token array must be 1-D, C-contiguous int32")
                stop = min(stop, arr.size)
                ptr = arr.ctypes.data + 4 * start
            else:
                stop = min(stop, len(token_ids))
                buf = array.array("i", token_ids[start:stop])
                ptr = buf.buffer_info()[0]
            count = stop - start
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
        return self._call(2, ns, request, token_ids, start, len(token_ids) if stop is None else stop, 0, None)

    def clear(self) -> int:
        """Drop every cached block (vLLM's ``reset_prefix_cache``); returns how many had a cache reference."""
        status = self._f_clear(self._h, self._i64_p)
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def set_eviction_mode(self, mode: EvictionMode | int | str) -> None:
        value = EvictionMode.parse(mode) if isinstance(mode, str) else int(mode)
        status = self._f_mode(self._h, value)
        if status:
            _raise(self._lib, status)

    def stats(self) -> PrefixStats:
        status = self._f_stats(self._h, self._stats_p)
        if status:
            _raise(self._lib, status)
        s = self._stats
        return PrefixStats(*(getattr(s, name) for name in PrefixStats.__dataclass_fields__))
