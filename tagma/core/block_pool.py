"""vLLM's BlockPool with tagma placement: which physical block a request gets comes from the range engine.

Everything else stays vLLM's: the ``KVCacheBlock`` objects, their ``ref_cnt``, the prefix-cache hash map,
hashing, KV events and metrics hooks. A fresh ``BlockPool`` is converted in place
(:meth:`TagmaBlockPool.adopt`) so every holder of it (coordinator, single-type managers, the scheduler)
keeps the same object.

vLLM's pool methods do not receive a request id: the manager sets the pool's request context (``_ctx``, and
``_freeing`` for a whole-request free) around every call that takes blocks for a request or frees them. Each
vLLM request with blocks has one engine request: created on its first block, released when vLLM frees the
request's blocks (immediately, or later through ``free_blocks`` after ``pop_blocks_for_free``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import numpy as np
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.request import Request

from tagma.engine import NoSpaceError, RangeEngine
from tagma.errors import TagmaUnsupported

__all__ = ["FreeBlockCount", "RangeRelease", "TagmaBlockPool", "unsupported"]


def unsupported(feature: str) -> NoReturn:
    raise TagmaUnsupported(feature)


class RangeRelease:
    """A whole request's blocks popped for a deferred free (range manager): its engine request and size.

    The scheduler keeps it and later hands it (or ``reversed`` of it) to ``block_pool.free_blocks``, which
    releases the engine request in one call. No block list is built.
    """

    __slots__ = ("engine_request", "num_blocks")

    def __init__(self, engine_request: int | None, num_blocks: int) -> None:
        self.engine_request = engine_request
        self.num_blocks = num_blocks

    def __len__(self) -> int:
        return self.num_blocks

    def release(self, pool: TagmaBlockPool) -> None:
        """Release the engine request into ``pool`` (a second call is a no-op)."""
        if self.engine_request is not None:
            pool.engine.release(self.engine_request)
            self.engine_request = None
            pool._num_free += self.num_blocks

    def __reversed__(self) -> RangeRelease:
        return self  # the engine releases a request's blocks in reverse logical order itself

    def __iter__(self) -> Any:
        unsupported("iterating the blocks of a deferred range release")

    def __repr__(self) -> str:
        return f"RangeRelease(engine_request={self.engine_request}, num_blocks={self.num_blocks})"


class FreeBlockCount:
    """Read-only stand-in for vLLM's ``FreeKVCacheBlockQueue``: tagma keeps no free queue.

    ``num_free_blocks`` has the queue's meaning (blocks with ref_cnt 0, cached ones included, null block
    excluded). ``get_all_free_blocks`` lists them in the engine's reuse order (free list in address order,
    then cache-only blocks in LRU order); every other queue operation is refused.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool: TagmaBlockPool) -> None:
        self._pool = pool

    @property
    def num_free_blocks(self) -> int:
        return self._pool._num_free

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        engine = self._pool.engine
        ids = [b for s, c in engine.free_ranges() for b in range(s, s + c)]
        ids.extend(engine.lru_order().tolist())
        blocks = self._pool.blocks
        return [blocks[i] for i in ids]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        unsupported(f"free_block_queue.{name} (tagma has no free block queue)")


class TagmaBlockPool(BlockPool):
    """A ``BlockPool`` whose placement, free space and LRU eviction order live in a :class:`RangeEngine`.

    Invariants (checked by the tests): a block is in use in the engine iff its ``ref_cnt`` > 0; it carries a
    cache mark iff it has a vLLM block hash; ``_num_free`` = engine free + cache-only blocks.
    """

    engine: RangeEngine
    _num_free: int
    _ctx: str | None
    _freeing: bool
    _engine_reqs: dict[str, int]
    _deferred: dict[tuple[int, ...], list[int]]

    @classmethod
    def adopt(cls, pool: BlockPool, engine: RangeEngine) -> TagmaBlockPool:
        """Convert a fresh ``BlockPool`` (no block handed out yet) into a ``TagmaBlockPool`` in place."""
        if type(pool) is not BlockPool:
            unsupported(f"block pool {type(pool).__name__}")
        if engine.num_blocks != pool.num_gpu_blocks:
            raise ValueError(f"engine has {engine.num_blocks} blocks, the pool {pool.num_gpu_blocks}")
        free = pool.free_block_queue.num_free_blocks
        if free != pool.num_gpu_blocks - 1 or getattr(pool, "_reuse_watchers", None) or (
            len(pool.cached_block_hash_to_block)
        ):
            raise ValueError("tagma: the block pool must be fresh to be adopted")
        pool.__class__ = cls
        assert isinstance(pool, TagmaBlockPool)
        pool._init_tagma(engine)
        return pool

    def _init_tagma(self, engine: RangeEngine) -> None:
        self.engine = engine
        self._num_free = self.num_gpu_blocks - 1
        self._ctx = None
        self._freeing = False
        self._engine_reqs = {}
        self._deferred = {}
        for block in self.blocks:  # drop the old queue's links (and with them the queue)
            block.prev_free_block = None
            block.next_free_block = None
        self.free_block_queue = FreeBlockCount(self)  # type: ignore[assignment]

    # ---- request context

    def engine_request(self, request_id: str) -> int | None:
        """The engine request of a vLLM request, or None when it holds no block."""
        return self._engine_reqs.get(request_id)

    def _current_engine_request(self, what: str) -> int:
        rid = self._ctx
        if rid is None:
            unsupported(f"{what} outside a request's allocation")
        eng = self._engine_reqs.get(rid)
        if eng is None:
            eng = self.engine.create_request()
            self._engine_reqs[rid] = eng
        return eng

    # ---- allocation

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks <= 0:
            return []
        if num_blocks > self._num_free:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        eng = self._current_engine_request("get_new_blocks")
        try:
            result = self.engine.append(eng, num_blocks)
        except NoSpaceError as exc:  # cannot happen while _num_free is right
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool") from exc
        blocks = self.blocks
        if result.evicted.size:
            # The engine already dropped their cache marks: drop vLLM's hashes with vLLM's own eviction
            # (metrics hook, hash map, BlockRemoved events), bypassing this class's engine unmark.
            evict = BlockPool._maybe_evict_cached_block
            for block_id in result.evicted.tolist():
                evict(self, blocks[block_id])
        ret = [blocks[i] for i in result.new_blocks.tolist()]
        collector = self.metrics_collector
        if collector is None:
            for block in ret:
                block.ref_cnt = 1
        else:
            # As vLLM: with caching, reusing a block ends its previous residency (a no-op for a block
            # evicted just above).
            caching = self.enable_caching
            for block in ret:
                if caching:
                    collector.on_block_evicted(block)
                block.ref_cnt = 1
                collector.on_block_allocated(block)
        self._num_free -= num_blocks
        return ret

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        if not blocks:
            return
        ids = [b.block_id for b in blocks if not b.is_null]
        if ids:
            eng = self._current_engine_request("touch")
            self.engine.attach(eng, np.array(ids, dtype=np.int32))
        collector = self.metrics_collector
        newly_used = 0
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                newly_used += 1
            block.ref_cnt += 1
            if collector is not None:
                collector.on_block_accessed(block)
        self._num_free -= newly_used

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        if isinstance(ordered_blocks, RangeRelease):
            ordered_blocks.release(self)
            return
        if self._freeing:
            # A whole request's blocks, from TagmaKVCacheManager.free.
            eng = self._engine_reqs.pop(self._ctx, None)  # type: ignore[arg-type]
            if eng is not None:
                self.engine.release(eng)
            blocks: Iterable[KVCacheBlock] = ordered_blocks
        else:
            # Deferred free of blocks popped earlier by pop_blocks_for_free (scheduler deferral).
            blocks = list(ordered_blocks)
            if not blocks:
                return
            key = tuple(b.block_id for b in reversed(blocks))
            pending = self._deferred.get(key)
            if not pending:
                unsupported("free_blocks of blocks that are not one whole request's blocks")
            self.engine.release(pending.pop())
            if not pending:
                del self._deferred[key]
        freed = 0
        for block in blocks:
            if block.pool is not None and block.pool is not self:
                unsupported("free_blocks of another pool's blocks")
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                freed += 1
        self._num_free += freed

    def release_request(self, request_id: str) -> None:
        """Release the request's engine request, if it still has one."""
        eng = self._engine_reqs.pop(request_id, None)
        if eng is not None:
            self.engine.release(eng)

    def defer_release(self, request_id: str, blocks: list[KVCacheBlock]) -> None:
        """The request's blocks were popped without being freed: release its engine request when they are."""
        eng = self._engine_reqs.pop(request_id, None)
        if eng is None:
            return
        if not blocks:
            self.engine.release(eng)
            return
        self._deferred.setdefault(tuple(b.block_id for b in blocks), []).append(eng)

    def get_num_free_blocks(self) -> int:
        return self._num_free

    # ---- prefix cache

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        # Blocks that get their first hash now take one cache mark in the engine.
        if num_full_blocks - num_cached_blocks == 1:  # the decode case: one block just filled
            block = blocks[num_cached_blocks]
            fresh = block.block_hash is None
            super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            if fresh and block.block_hash is not None and not block.is_null:
                self.engine.cache_mark(np.array((block.block_id,), dtype=np.int32))
            return
        unhashed = [b for b in blocks[num_cached_blocks:num_full_blocks] if b.block_hash is None]
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        ids = [b.block_id for b in unhashed if b.block_hash is not None and not b.is_null]
        if ids:
            self.engine.cache_mark(np.array(ids, dtype=np.int32))

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        # Reached from evict_blocks (connector paths); engine evictions never come here.
        had_hash = block.block_hash is not None
        evicted = super()._maybe_evict_cached_block(block)
        if had_hash and block.block_hash is None:
            self.engine.cache_unmark(np.array([block.block_id], dtype=np.int32))
            # A cache-only block is now free (still counted as free: ref_cnt == 0 either way).
        return evicted

    def reset_prefix_cache(self) -> bool:
        if not super().reset_prefix_cache():
            return False
        self.engine.cache_clear()
        return True

    # ---- paths tagma does not take

    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Any) -> None:
        unsupported("unpin_blocks (HiSparse)")

    def cache_partial_block(self, *args: Any, **kwargs: Any) -> Any:
        unsupported("partial prefix-cache blocks (hash_block_size < block_size)")

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        unsupported("move_block_hashes (copy-on-write of cached blocks)")
