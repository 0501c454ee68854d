"""Section 1: the range engine's operations, natively (tagma_bench) and through the ctypes binding.

The same operations as the native binary (see ``tagma/csrc/bench/bench_engine.cpp``), here through
:class:`tagma.engine.RangeEngine`, at every context length (n = context / block_size blocks):

* ``coord_offset``: :func:`tagma.engine.coord_offset` (the binding builds its layout struct per call).
* ``alloc_release``: create a request, append n blocks (ids returned), release it.
  Paged counterpart: vLLM's ``BlockPool.get_new_blocks(n)`` + ``free_blocks`` (prefix caching off).
* ``grow_in_place``: append one block to a request of n blocks that has free blocks right after it.
* ``grow_in_place_batch``: the same through the range manager's crossing: the prepared
  :class:`tagma.engine.AppendBatch` call its ``_flush`` makes (one ``tagma_append_runs_batch`` of one entry
  of 1 block, through a prebound prototype with one prefilled-struct argument, into reused buffers); its
  overhead over the native loop of the same C call (tagma_bench's ``grow_in_place_batch``) is the binding's
  fixed cost per crossing.
  Paged counterpart: vLLM's ``BlockPool.get_new_blocks(1)`` (a decode step's new block).
* ``append_new_range``: append one block to a request of n blocks whose tail a neighbour holds (first
  fit): the block opens a new range. (No paged counterpart: a paged block is always "a new range".)
* ``prefix_share_release``: a new request attaches the n blocks of a live request, then is released.
  Paged counterpart: ``BlockPool.touch(blocks)`` + ``free_blocks`` of blocks in use.
* ``prefix_hit_release``: the same on n cache-only blocks (a prefix-cache hit after the owner finished).
  Paged counterpart: ``BlockPool.touch`` (takes them out of the free queue) + ``free_blocks``.
* ``evict_range``: ``cache_evict(n)`` of one released, cache-marked request (the LRU head).

Setup an operation consumes (requests to evict, owners whose tail is blocked) is done before the clock
starts; each sample times a calibrated batch of operations and divides. Paged and tagma samples are taken in
the same loop, alternating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock

from benchmarks.host.timing import calibrate, interleaved, pair_entry, summarize, timed_ns
from tagma import engine as tagma_engine
from tagma.engine import AppendBatch, CoordLayout, Policy, RangeEngine

__all__ = ["run"]

OPS = (
    "coord_offset",
    "alloc_release",
    "grow_in_place",
    "grow_in_place_batch",
    "append_new_range",
    "prefix_share_release",
    "prefix_hit_release",
    "evict_range",
)


def _noop(*_: Any) -> None:
    return None


@dataclass
class BatchOp:
    """``setup(batch)`` (untimed), ``run(batch)`` (timed), ``teardown()`` (untimed)."""

    run: Callable[[int], None]
    setup: Callable[[int], None] = _noop
    teardown: Callable[[], None] = _noop
    blocks_per_op: int = 0
    state: dict[str, Any] = field(default_factory=dict)

    def batch_ns(self, batch: int) -> int:
        self.setup(batch)
        try:
            return timed_ns(lambda: self.run(batch))
        finally:
            self.teardown()

    def sampler(self, batch: int) -> Callable[[], float]:
        return lambda: self.batch_ns(batch) / batch


def _batch_for(op: BatchOp, timing: dict[str, Any]) -> int:
    cap = int(timing["max_batch"])
    if op.blocks_per_op:
        cap = max(1, min(cap, int(timing["max_batch_blocks"]) // op.blocks_per_op))
    return calibrate(op.batch_ns, int(timing["min_sample_us"]) * 1000, cap)


# ------------------------------------------------------------------------------------------ tagma (ctypes)


def _grow_in_place_op(n: int) -> BatchOp:
    """One block appended in place to an n-block request, per op (engine.append)."""
    grow = BatchOp(_noop, blocks_per_op=1)

    def grow_setup(batch: int) -> None:
        eng = RangeEngine(n + batch + 64, policy=Policy.HEADROOM)
        r = eng.create_request()
        eng.append(r, n)
        grow.state.update(engine=eng, request=r, before=eng.stats().in_place_growths, batch=batch)

    def grow_run(batch: int) -> None:
        eng, r = grow.state["engine"], grow.state["request"]
        for _ in range(batch):
            eng.append(r, 1)

    def grow_teardown() -> None:
        eng = grow.state.pop("engine")
        stats = eng.stats()
        if (
            stats.in_place_growths - grow.state["before"] != grow.state["batch"]
            or stats.max_request_ranges != 1
        ):
            raise AssertionError("grow_in_place: an append did not grow in place")
        eng.close()

    grow.setup, grow.run, grow.teardown = grow_setup, grow_run, grow_teardown
    return grow


def _grow_in_place_batch_op(n: int) -> BatchOp:
    """The range manager's crossing for a decode block: the AppendBatch call its _flush makes."""
    lean = BatchOp(_noop, blocks_per_op=1)

    def lean_setup(batch: int) -> None:
        eng = RangeEngine(n + batch + 64, policy=Policy.HEADROOM)
        r = eng.create_request()
        eng.append(r, n)
        step = AppendBatch(eng, capacity=1)
        step.requests[0] = r
        step.counts[0] = 1
        lean.state.update(engine=eng, before=eng.stats().in_place_growths, batch=batch, step=step)

    def lean_run(batch: int) -> None:
        step = lean.state["step"]
        for _ in range(batch):
            step(1)

    def lean_teardown() -> None:
        eng = lean.state.pop("engine")
        lean.state.pop("step")
        stats = eng.stats()
        grown = stats.in_place_growths - lean.state["before"]
        if grown != lean.state["batch"] or stats.max_request_ranges != 1:
            raise AssertionError("grow_in_place_batch: an append did not grow in place")
        eng.close()

    lean.setup, lean.run, lean.teardown = lean_setup, lean_run, lean_teardown
    return lean


def _append_new_range_op(n: int) -> BatchOp:
    """One block appended as a new range (the block after the owner's range is taken)."""
    new_range = BatchOp(_noop, blocks_per_op=n + 2)

    def new_range_setup(batch: int) -> None:
        eng = RangeEngine(batch * (n + 2) + 64, policy=Policy.FIRST_FIT)
        owners = []
        for _ in range(batch):
            owner = eng.create_request()
            eng.append(owner, n)
            eng.append(eng.create_request(), 1)  # the neighbour takes the block after the owner's range
            owners.append(owner)
        new_range.state.update(engine=eng, owners=owners, before=eng.stats().new_ranges, batch=batch)

    def new_range_run(batch: int) -> None:
        eng, owners = new_range.state["engine"], new_range.state["owners"]
        for i in range(batch):
            eng.append(owners[i], 1)

    def new_range_teardown() -> None:
        eng = new_range.state.pop("engine")
        if eng.stats().new_ranges - new_range.state["before"] != new_range.state["batch"]:
            raise AssertionError("append_new_range: an append grew in place")
        eng.close()

    new_range.setup, new_range.run, new_range.teardown = new_range_setup, new_range_run, new_range_teardown
    return new_range


def _evict_range_op(n: int) -> BatchOp:
    """n cached blocks evicted as one range, per op."""
    evict = BatchOp(_noop, blocks_per_op=n)

    def evict_setup(batch: int) -> None:
        eng = RangeEngine(batch * n + 64, policy=Policy.HEADROOM)
        for _ in range(batch):
            r = eng.create_request()
            eng.cache_mark(eng.append(r, n).new_blocks)
            eng.release(r)
        evict.state["engine"] = eng

    def evict_run(batch: int) -> None:
        eng = evict.state["engine"]
        for _ in range(batch):
            if eng.cache_evict(n).size != n:
                raise AssertionError("evict_range: evicted fewer blocks than asked")

    def evict_teardown() -> None:
        evict.state.pop("engine").close()

    evict.setup, evict.run, evict.teardown = evict_setup, evict_run, evict_teardown
    return evict


def _prefix_ops(n: int) -> dict[str, BatchOp]:
    """Attach an n-block prefix to a new request and release it: shared with a live owner, or cached only."""
    ops: dict[str, BatchOp] = {}
    for cache_only in (False, True):
        eng = RangeEngine(n + 64, policy=Policy.HEADROOM)
        owner = eng.create_request()
        prefix = eng.append(owner, n).new_blocks.copy()
        if cache_only:
            eng.cache_mark(prefix)
            eng.release(owner)

        def share(batch: int, eng: RangeEngine = eng, prefix: np.ndarray = prefix) -> None:
            for _ in range(batch):
                r = eng.create_request()
                eng.attach(r, prefix)
                eng.release(r)

        ops["prefix_hit_release" if cache_only else "prefix_share_release"] = BatchOp(share)
    return ops


def tagma_ops(n: int, block_size: int) -> dict[str, BatchOp]:
    ops: dict[str, BatchOp] = {}

    layout = CoordLayout(num_layers=32, num_blocks=n + 1, block_size=block_size, bytes_per_token=4096)

    def coord(batch: int) -> None:
        offset = tagma_engine.coord_offset
        for i in range(batch):
            offset(layout, i & 31, i % n, i % block_size)

    ops["coord_offset"] = BatchOp(coord)

    alloc_engine = RangeEngine(2 * n + 64, policy=Policy.HEADROOM)

    def alloc_release(batch: int) -> None:
        eng = alloc_engine
        for _ in range(batch):
            r = eng.create_request()
            eng.append(r, n)
            eng.release(r)

    ops["alloc_release"] = BatchOp(alloc_release)
    ops["grow_in_place"] = _grow_in_place_op(n)
    ops["grow_in_place_batch"] = _grow_in_place_batch_op(n)
    ops["append_new_range"] = _append_new_range_op(n)
    ops.update(_prefix_ops(n))
    ops["evict_range"] = _evict_range_op(n)
    return ops


# --------------------------------------------------------------------------------- paged (vLLM BlockPool)


def paged_ops(n: int, block_size: int) -> dict[str, BatchOp]:
    ops: dict[str, BatchOp] = {}

    alloc_pool = BlockPool(n + 64, enable_caching=False, hash_block_size=block_size)

    def alloc_release(batch: int) -> None:
        pool = alloc_pool
        for _ in range(batch):
            blocks = pool.get_new_blocks(n)
            blocks.reverse()  # vLLM's manager frees a request's blocks tail first
            pool.free_blocks(blocks)

    ops["alloc_release"] = BatchOp(alloc_release)

    grow = BatchOp(_noop, blocks_per_op=1)

    def grow_setup(batch: int) -> None:
        pool = BlockPool(n + batch + 64, enable_caching=False, hash_block_size=block_size)
        grow.state.update(pool=pool, held=pool.get_new_blocks(n), new=[])

    def grow_run(batch: int) -> None:
        pool, new = grow.state["pool"], grow.state["new"]
        for _ in range(batch):
            new.extend(pool.get_new_blocks(1))

    def grow_teardown() -> None:
        grow.state.clear()

    grow.setup, grow.run, grow.teardown = grow_setup, grow_run, grow_teardown
    ops["grow_in_place"] = grow


    for cache_only in (False, True):
        pool = BlockPool(n + 64, enable_caching=True, hash_block_size=block_size)
        blocks = pool.get_new_blocks(n)
        if cache_only:
            pool.free_blocks(list(reversed(blocks)))  # ref_cnt 0: back in the free queue

        def share(batch: int, pool: BlockPool = pool, blocks: list[KVCacheBlock] = blocks) -> None:
            backwards = list(reversed(blocks))
            for _ in range(batch):
                pool.touch(blocks)
                pool.free_blocks(backwards)

        ops["prefix_hit_release" if cache_only else "prefix_share_release"] = BatchOp(share)
    return ops


# ----------------------------------------------------------------------------------------------- section


def _native_rows(native: dict[str, Any] | None) -> dict[tuple[str, int], list[float]]:
    if not native:
        return {}
    return {
        (r["op"], int(r["context_tokens"])): r["ns_per_op"]
        for r in native.get("results", [])
        if "layout" not in r
    }


def run(cfg: dict[str, Any], native: dict[str, Any] | None) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    repeats = int(timing["repeats"])
    warmup = int(timing["warmup"])
    native_rows = _native_rows(native)
    rows: list[dict[str, Any]] = []
    for context in cfg["contexts"]:
        n = int(context) // block_size
        tagma = tagma_ops(n, block_size)
        paged = paged_ops(n, block_size)
        for op in OPS:
            t_op = tagma[op]
            t_batch = _batch_for(t_op, timing)
            if op in paged:
                p_op = paged[op]
                p_batch = _batch_for(p_op, timing)
                samples = interleaved(
                    {"paged": p_op.sampler(p_batch), "tagma": t_op.sampler(t_batch)}, repeats, warmup
                )
                row = pair_entry(
                    samples["paged"],
                    samples["tagma"],
                    "ns",
                    op=op,
                    context_tokens=int(context),
                    blocks=n,
                    batch={"paged": p_batch, "tagma": t_batch},
                    paged_impl="vllm.v1.core.block_pool.BlockPool (Python)",
                    tagma_impl="tagma.engine.RangeEngine (ctypes)",
                )
                row["ctypes"] = row["tagma"]
            else:
                samples = interleaved({"tagma": t_op.sampler(t_batch)}, repeats, warmup)
                row = {
                    "op": op,
                    "context_tokens": int(context),
                    "blocks": n,
                    "unit": "ns",
                    "batch": {"tagma": t_batch},
                    "tagma_impl": "tagma.engine.RangeEngine (ctypes)",
                    "ctypes": summarize(samples["tagma"], "ns"),
                }
            nat = native_rows.get((op, int(context)))
            row["native"] = summarize(nat, "ns") if nat else None
            if nat:
                row["binding_overhead_ns"] = row["ctypes"]["median"] - row["native"]["median"]
                row["native_per_block_ns"] = row["native"]["median"] / n
            rows.append(row)
    return {
        "description": __doc__,
        "rows": rows,
        "native_available": bool(native_rows),
    }
