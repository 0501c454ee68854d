"""Binding of the prefix index's side groups (``tagma.h``, "side groups of the prefix index").

A side group is another KV cache group of the same requests (a sliding window's, beside full attention): its
blocks are cached at the full group's trie nodes, one per (node, group), as vLLM caches each group's block by
(block hash, group). A window's prefix-cache hit needs only the last few blocks of the full group's hit
(vLLM's right-to-left rule), so the caller walks the full group (:meth:`PrefixIndex.lookup_ids`), reads the
side blocks at those nodes (:meth:`PrefixSideGroups.lookup`) and attaches the run it picks
(:meth:`PrefixSideGroups.attach`). A side block is evicted on its own, or with its node.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tagma.engine.abi import I32Array, _as_int_array, _check_i32, _check_i64, _check_u64
from tagma.engine.loader import _load, _raise
from tagma.engine.prefix_index import PrefixIndex

__all__ = ["PrefixSideGroups", "PrefixSideStats"]

_VP = ctypes.c_void_p
_I32 = ctypes.c_int32
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_STATUS = ctypes.c_int32

_SIGNATURES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "tagma_prefix_side_enable": (_STATUS, [_U64, _I32]),
    "tagma_prefix_side_insert": (_STATUS, [_U64, _U64, _I32, _U64, _I64, _I64, _I64, _VP, _VP]),
    "tagma_prefix_side_lookup": (_STATUS, [_U64, _I32, _VP, _I64, _VP]),
    "tagma_prefix_side_attach": (_STATUS, [_U64, _U64, _VP, _I64]),
    "tagma_prefix_side_stats_get": (_STATUS, [_U64, _VP]),
}


@dataclass(frozen=True, slots=True)
class PrefixSideStats:
    """Mirror of ``tagma_prefix_side_stats``."""

    side_groups: int
    cached_blocks: int
    inserted_blocks: int
    evicted_blocks: int


class _CSideStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in PrefixSideStats.__dataclass_fields__]


def _bind(signatures: dict[str, tuple[Any, list[Any]]] = _SIGNATURES) -> ctypes.CDLL:
    """The engine library with ``signatures`` bound (the side groups' by default)."""
    lib = _load()
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class PrefixSideGroups:
    """The side groups of one :class:`PrefixIndex` (enabled by the constructor, before anything is indexed).
    Groups are numbered from 0 by the caller (not vLLM's group ids)."""

    __slots__ = ("_f_attach", "_f_insert", "_f_lookup", "_h", "_i64", "_lib", "_stats", "groups")

    def __init__(self, index: PrefixIndex, groups: int, *, enable: bool = True) -> None:
        """``enable``: size the index for ``groups`` side groups (False: the caller enabled them)."""
        lib = _bind()
        self._lib = lib
        self._h = index.engine.handle
        if enable:
            status = lib.tagma_prefix_side_enable(self._h, _check_i32(groups, "groups"))
            if status:
                _raise(lib, status)
        self.groups = int(groups)
        self._f_insert = lib.tagma_prefix_side_insert
        self._f_lookup = lib.tagma_prefix_side_lookup
        self._f_attach = lib.tagma_prefix_side_attach
        self._i64 = _I64(0)
        self._stats = _CSideStats()

    def insert(
        self,
        full_request: int,
        group: int,
        side_request: int,
        side_first_logical: int,
        start: int,
        end: int,
        mask: npt.NDArray[np.bool_] | None = None,
    ) -> int:
        """Cache ``side_request``'s blocks for ``group`` at ``full_request``'s nodes, positions [start, end)
        (absolute logical blocks; the side request's local block 0 is ``side_first_logical``) where ``mask``
        (None: all; else ``end - start`` booleans) is set. Returns the blocks cached."""
        ptr = None
        if mask is not None:
            arr = np.ascontiguousarray(mask, dtype=np.uint8)
            if arr.ndim != 1 or arr.size != max(end - start, 0):
                raise ValueError(f"mask has {arr.size} entries for [{start}, {end})")
            ptr = arr.ctypes.data
        status = self._f_insert(
            self._h,
            _check_u64(full_request, "full_request"),
            _check_i32(group, "group"),
            _check_u64(side_request, "side_request"),
            _check_i64(side_first_logical, "side_first_logical"),
            _check_i64(start, "start"),
            _check_i64(end, "end"),
            ptr,
            ctypes.byref(self._i64),
        )
        if status:
            _raise(self._lib, status)
        return self._i64.value

    def lookup(self, group: int, nodes: Any) -> I32Array:
        """Group ``group``'s side block at each of ``nodes`` (the full group's hit ids), -1 where none."""
        arr = _as_int_array(nodes, np.int32, "nodes")
        out = np.empty(arr.size, dtype=np.int32)
        if arr.size:
            group = _check_i32(group, "group")
            status = self._f_lookup(self._h, group, arr.ctypes.data, arr.size, out.ctypes.data)
            if status:
                _raise(self._lib, status)
        return out

    def attach(self, request: int, blocks: Any) -> None:
        """Give ``request`` (holding no block, not indexed) the cached side ``blocks``, in order."""
        arr = _as_int_array(blocks, np.int32, "blocks")
        ptr = arr.ctypes.data if arr.size else None
        status = self._f_attach(self._h, _check_u64(request, "request"), ptr, arr.size)
        if status:
            _raise(self._lib, status)

    def stats(self) -> PrefixSideStats:
        status = self._lib.tagma_prefix_side_stats_get(self._h, ctypes.byref(self._stats))
        if status:
            _raise(self._lib, status)
        s = self._stats
        return PrefixSideStats(*(getattr(s, name) for name in PrefixSideStats.__dataclass_fields__))
