"""Binding of the prefix index's keyed side groups (``tagma.h``, "keyed side groups").

Where no full-attention group keys the others (a model whose every layer slides, Mistral-style), a group's
cached block is found by a chained 128-bit content key: key(block i) = hash(key(block i - 1), block i's
tokens), key(block -1) from the request's namespace, as vLLM chains its block hashes (the engine also compares
the block's own tokens on a lookup). One table entry per cached block, sized when enabled; a keyed block is
a side block in every other way (cache reference, LRU, eviction alone, attached with
:meth:`PrefixSideGroups.attach <tagma.engine.prefix_side.PrefixSideGroups.attach>`).
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tagma.engine.abi import I32Array, _check_i32, _check_i64, _check_u64
from tagma.engine.loader import _raise
from tagma.engine.prefix_index import PrefixIndex
from tagma.engine.prefix_side import _I32, _I64, _STATUS, _U64, _VP, PrefixSideGroups, _bind

__all__ = ["KeyArray", "PrefixKeyedGroups"]

KeyArray = npt.NDArray[np.uint64]  # shape (blocks, 2): each block's key (lo, hi)

_SIGNATURES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "tagma_prefix_keyed_enable": (_STATUS, [_U64, _I32]),
    "tagma_prefix_chain_keys": (_STATUS, [_U64, _U64, _VP, _VP, _I64, _VP]),
    "tagma_prefix_keyed_insert": (_STATUS, [_U64, _I32, _U64, _I64, _I64, _I64, _VP, _VP, _VP, _VP]),
    "tagma_prefix_keyed_lookup": (_STATUS, [_U64, _I32, _VP, _VP, _I64, _VP]),
}


class PrefixKeyedGroups(PrefixSideGroups):
    """The keyed side groups of one :class:`PrefixIndex` (enabled by the constructor, instead of node-keyed
    side groups). Groups are numbered from 0 by the caller. Tokens are int32 arrays (``tokens_array``)."""

    __slots__ = ("_block_size", "_f_keys", "_f_keyed_insert", "_f_keyed_lookup")

    def __init__(self, index: PrefixIndex, groups: int) -> None:
        lib = _bind(_SIGNATURES)
        status = lib.tagma_prefix_keyed_enable(index.engine.handle, _check_i32(groups, "groups"))
        if status:
            _raise(lib, status)
        super().__init__(index, groups, enable=False)
        self._block_size = index.block_size
        self._f_keys = lib.tagma_prefix_chain_keys
        self._f_keyed_insert = lib.tagma_prefix_keyed_insert
        self._f_keyed_lookup = lib.tagma_prefix_keyed_lookup

    def _blocks_of(self, tokens: I32Array) -> int:
        if tokens.dtype != np.int32 or tokens.ndim != 1 or not tokens.flags.c_contiguous:
            raise ValueError(f"tokens must be contiguous 1-D int32, not {tokens.dtype} {tokens.shape}")
        return tokens.size // self._block_size

    def keys(self, ns: int, tokens: I32Array, prev: KeyArray | None = None) -> KeyArray:
        """The chained keys of ``tokens``' full blocks, from ``prev`` (the key of the block before, shape
        (2,)) or, when None, from the start of namespace ``ns``."""
        n = self._blocks_of(tokens)
        out = np.empty((n, 2), dtype=np.uint64)
        if n:
            prev_ptr = None
            if prev is not None:
                prev = np.ascontiguousarray(prev, dtype=np.uint64)
                if prev.shape != (2,):
                    raise ValueError(f"prev must be one key (2 uint64), got shape {prev.shape}")
                prev_ptr = prev.ctypes.data
            ns = _check_u64(ns, "ns")
            status = self._f_keys(self._h, ns, prev_ptr, tokens.ctypes.data, n, out.ctypes.data)
            if status:
                _raise(self._lib, status)
        return out

    def lookup_keyed(self, group: int, keys: KeyArray, tokens: I32Array) -> I32Array:
        """Group ``group``'s block cached under each key (holding the block's tokens), -1 where none."""
        n = len(keys)
        if self._blocks_of(tokens) < n or keys.dtype != np.uint64 or not keys.flags.c_contiguous:
            raise ValueError(f"{n} keys need contiguous uint64 keys and {n} blocks of tokens")
        out = np.empty(n, dtype=np.int32)
        if n:
            status = self._f_keyed_lookup(self._h, _check_i32(group, "group"), keys.ctypes.data,
                                          tokens.ctypes.data, n, out.ctypes.data)  # fmt: skip
            if status:
                _raise(self._lib, status)
        return out

    def insert_keyed(
        self,
        group: int,
        side_request: int,
        side_first_logical: int,
        start: int,
        keys: KeyArray,
        tokens: I32Array,
        mask: npt.NDArray[np.bool_] | None = None,
    ) -> int:
        """Cache ``side_request``'s blocks for ``group`` at logical positions [start, start + len(keys))
        (its local block 0 is ``side_first_logical``) under ``keys``, with ``tokens`` (those positions'
        tokens) where ``mask`` (None: all) is set. Returns the blocks cached."""
        n = len(keys)
        if self._blocks_of(tokens) < n or keys.dtype != np.uint64 or not keys.flags.c_contiguous:
            raise ValueError(f"{n} keys need contiguous uint64 keys and {n} blocks of tokens")
        ptr = None
        if mask is not None:
            arr = np.ascontiguousarray(mask, dtype=np.uint8)
            if arr.ndim != 1 or arr.size != n:
                raise ValueError(f"mask has {arr.size} entries for {n} keys")
            ptr = arr.ctypes.data
        start = _check_i64(start, "start")
        status = self._f_keyed_insert(
            self._h, _check_i32(group, "group"), _check_u64(side_request, "side_request"),
            _check_i64(side_first_logical, "side_first_logical"), start, _check_i64(start + n, "end"),
            keys.ctypes.data, tokens.ctypes.data, ptr, ctypes.byref(self._i64),
        )  # fmt: skip
        if status:
            _raise(self._lib, status)
        return self._i64.value
