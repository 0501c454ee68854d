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
headers at build time) numpy arrays go by address and other sequences through ``array.array('i', ...)``.
Measured on this project's 2-core CPU machine, loaded, outside ``make bench-host`` (131,072 random ids
below 128,000, block 16, medians of 7): ``array.array('i', lst)`` 16-35 ns/token, ``np.array(lst,
dtype=np.int32)`` 68, ``np.fromiter`` 52; the index from int32 tokens: insert 0.58 + lookup 0.23 ns/token;
from the list through the reader: insert 2.25 + lookup 1.15 ns/token (conversion included), against 142
ns/token for vLLM's sha256 block hashing in the same run. A one-block lookup from a list cost 0.41 us
against 0.55 us for a bare 3-argument ctypes call of the engine (the reader's fastcall path is cheaper
than ctypes'). ``make bench-host`` (section ``prefix_index``) re-measures all of this.

Functions are bound once (ctypes prototypes for the engine, the reader's function); a call does no
Python-side validation that the engine repeats (it validates every argument and the binding raises its
status as a :class:`tagma.errors.TagmaError`).
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

from tagma.engine.abi import I32Array, parse_member
from tagma.engine.loader import _load, _raise, library_path
from tagma.engine.range_engine import RangeEngine

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
            raise ValueError(f"token bounds [{start}, {end}) are invalid for {len(token_ids)} tokens")
        if self._tokens_into is None or type(token_ids) is np.ndarray:
            return np.array(token_ids[start:end], dtype=np.int32)
        out = np.empty(end - start, dtype=np.int32)
        self._tokens_into(token_ids, start, end, out.ctypes.data, out.size)
        return out

    # ---- operations

    def _call(self, op: int, ns: int, request: int, token_ids: Any, start: int, stop: int, max_blocks: int,
              ids_out: int | None) -> int:
        """One engine call on token_ids[start:stop] (stop clipped to the length); returns its int result."""
        if self._reader:
            result: int = self._reader(
                self._fns[op], op, self._h, ns, request, token_ids, start, stop, max_blocks, ids_out
            )
            if result < 0:
                _raise(self._lib, -result)
            return result
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
