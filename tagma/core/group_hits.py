"""vLLM's prefix-cache hit rules across KV cache groups, on rows of cached flags (no block hashes).

The group prefix manager (:mod:`tagma.core.group_prefix_manager`) looks up, per group, which of a request's
leading blocks are cached (the full group's trie walk, each other group's side blocks at its nodes or its
content keys) and decides the hit here, as vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit`` does
over ``SlidingWindowManager``'s, ``ChunkedLocalAttentionManager``'s and ``MambaManager``'s rules, with vLLM's
EAGLE drop.
:class:`GroupHitBlocks` carries the hit to ``allocate_slots``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.kv_cache_interface import KVCacheConfig, SlidingWindowSpec

from tagma.engine.prefix_keyed import KeyArray

__all__ = ["GroupHitBlocks", "eagle_groups", "hit_length", "reconcile", "run_blocks", "window_hit"]


def eagle_groups(kv_cache_config: KVCacheConfig, args: dict[str, Any]) -> set[int]:
    """vLLM's EAGLE groups (the coordinator's ``eagle_group_ids``): the groups marked as an EAGLE drafter's,
    or every group when ``use_eagle`` is set and none is marked."""
    groups = kv_cache_config.kv_cache_groups
    marked = {g for g, group in enumerate(groups) if getattr(group, "is_eagle_group", False)}
    if args.get("use_eagle") and not marked:
        return set(range(len(groups)))
    return marked


class GroupHitBlocks(KVCacheBlocks):
    """A prefix-cache hit over every group: per group, null blocks before the window, then the hit ids."""

    __slots__ = ("_groups", "_pool", "keys")

    def __init__(
        self, groups: tuple[tuple[int, np.ndarray], ...], pool: Any, keys: KeyArray | None = None
    ) -> None:
        self._groups = groups
        self._pool = pool
        self.keys = keys  # content-keyed groups: the lookup's block keys (the chain goes on from the hit's)

    def _ids(self, g: int) -> list[int]:
        dropped, ids = self._groups[g]
        return [self._pool.null_block.block_id] * dropped + ids.tolist()

    @property
    def blocks(self) -> tuple[list[Any], ...]:  # type: ignore[override]
        table = self._pool.blocks
        return tuple([table[i] for i in self._ids(g)] for g in range(len(self._groups)))

    @property
    def groups(self) -> tuple[tuple[int, np.ndarray], ...]:
        return self._groups

    def get_block_ids(  # type: ignore[override]
        self, allow_none: bool = False, *, group_ids: Any = None
    ) -> tuple[list[int], ...] | None:
        chosen = range(len(self._groups)) if group_ids is None else group_ids
        if allow_none and all(not self._groups[g][0] and not len(self._groups[g][1]) for g in chosen):
            return None
        return tuple(self._ids(g) for g in chosen)

    def get_unhashed_block_ids(self) -> list[int]:
        return []  # every hit block is cached

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [[] for _ in self._groups]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self._groups))

    def __repr__(self) -> str:
        return f"GroupHitBlocks({[(d, ids.tolist()) for d, ids in self._groups]!r})"


def hit_length(group: tuple[int, np.ndarray]) -> int:
    """A group's hit in blocks: those its window skips (null blocks) and those it holds."""
    dropped, ids = group
    return dropped + len(ids)


def run_blocks(spec: Any, bs: int) -> int:
    """The cached blocks a hit's run needs in a window group (``SlidingWindowManager``: the last
    ``cdiv(window - 1, bs)``) or a state group (``MambaManager``: the last cached block, a window of 2)."""
    window = spec.sliding_window if isinstance(spec, SlidingWindowSpec) else 2
    return -(-(window - 1) // bs)


def window_hit(cached: np.ndarray, limit: int, need: int) -> int:
    """vLLM's ``SlidingWindowManager.find_longest_cache_hit`` on a row of cached flags (block alignment):
    the end of the last run of ``need`` cached blocks within ``limit``, else the cached run from block 0."""
    c = cached[:limit]
    if 0 < need <= limit and c[limit - need :].all():  # the common case: the run ends at the limit
        return limit
    if need <= 0:  # a window of one token: the last cached block (vLLM's loop with a zero-length run)
        found = np.flatnonzero(c)
        return int(found[-1]) + 1 if found.size else 0
    if limit >= need:
        sums = np.convolve(c.astype(np.int32), np.ones(need, dtype=np.int32), mode="valid")
        starts = np.flatnonzero(sums == need)
        if starts.size:
            return int(starts[-1]) + need
    misses = np.flatnonzero(~c)
    return int(misses[0]) if misses.size else limit


def reconcile(
    spec_groups: tuple[tuple[int, tuple[int, ...], bool, int], ...],
    full_hit: int,
    sides: list[np.ndarray],
    keyed: bool,
    bs: int,
) -> tuple[int, int, dict[int, int]]:
    """vLLM's fixed point over the spec groups (full attention first, its hit ``full_hit``; ``keyed``: no
    full group, ``full_hit`` the longest hit allowed): (hit, longest single-group hit, each chunked spec
    group's first looked-up block), in blocks of ``bs`` tokens. ``spec_groups``: per spec group, the blocks
    a window's hit needs, its members' rows in ``sides`` (a row: a block id per block, -1 where uncached),
    its EAGLE drop, its chunk size in tokens (0: a window).

    A chunked group (``ChunkedLocalAttentionManager``) needs nothing before the chunk of the candidate's
    end (null blocks) and the cached run from that chunk's first block on.
    An EAGLE spec group looks one block past the candidate (within the rows looked up), needs one block
    more in its run and drops the run's last block; it takes the drop once per candidate length, as
    vLLM's ``eagle_verified`` does: a verified group is checked without it until another group cuts the
    length."""
    cached = [s >= 0 for s in sides]
    joint = [
        (need, np.logical_and.reduce([cached[k] for k in members]), drop, chunk)
        for need, members, drop, chunk in spec_groups
    ]
    hit = full_hit
    longest = 0 if keyed else full_hit
    simple = len(joint) == 1 and not keyed  # vLLM's "simple hybrid": full attention and one other spec
    verified: set[int] = set()
    starts: dict[int, int] = {}
    while True:
        curr = hit
        for k, (need, row, drop, chunk) in enumerate(joint):
            if chunk:
                start = curr * bs // chunk * chunk // bs
                misses = np.flatnonzero(~row[start:curr])
                got = start + int(misses[0]) if misses.size else curr
                starts[k] = start
                if got < curr:
                    verified.clear()
                curr = got
            elif drop and k not in verified:
                peek = curr + 1 if curr < len(row) else len(row)
                got = window_hit(row, peek, need + 1)
                curr = got - 1 if got else 0
                verified.add(k)
            else:
                got = window_hit(row, curr, need)
                if got < curr:
                    verified.clear()
                curr = got
            if curr > longest:
                longest = curr
        if curr >= hit or simple:
            return curr, longest, starts
        hit = curr
