"""Section groups: hybrid KV cache layouts (sliding window + full attention), vLLM's coordinator against
tagma's group managers, prefix caching off and (``caching`` in the config) on.

Layouts: ``gpt-oss`` (one window-128 group, one full group) and ``gemma3`` (five window-1,024 groups, one
full group), at each configured block size. vLLM's side is its own ``KVCacheManager`` (the
``KVCacheCoordinatorNoPrefixCache`` over a ``SlidingWindowManager`` per window group and a
``FullAttentionManager``); tagma's is :class:`~tagma.core.group_range_manager.GroupRangeKVCacheManager`.
Both get the same real vLLM ``Request`` objects and the same calls; their outcomes must be identical.

* ``admission_free``: one request of ``context`` tokens admitted whole (``get_computed_blocks`` +
  ``allocate_slots`` + ``get_blocks(...).get_block_ids()``) and freed.
* ``decode_step``: R running requests of about ``context`` tokens; one step = ``new_step_starts()`` + R x
  ``allocate_slots(req, 1)`` + reading the new ids; per request-step. The window groups' start advances:
  vLLM frees a block and writes a null block every ``block_size`` tokens per window group, tagma cuts the
  first range with one engine call. A sample is ``block_size`` steps.
* ``window_blocks_held``: blocks a request holds in its window groups after the decode (both sides).
* ``churn``: per request-step in decode, the window groups' block frees and allocations, and the calls
  that do them (vLLM: ``BlockPool.free_blocks`` / ``get_new_blocks``; tagma: engine ``free_front`` /
  ``append``), counted in an untimed pass.
* ``resident_bytes``: Python heap bytes per resident request (tracemalloc), after the admission and the
  window groups' release of what lies before the window (vLLM keeps a null entry per dropped block).

With prefix caching on (entries marked ``"caching": true``) vLLM's side is its ``HybridKVCacheCoordinator``
(sha256 block hashes, made when the request is built: not timed) and tagma's the
:class:`~tagma.core.group_prefix_manager.GroupPrefixKVCacheManager`. ``admission_free`` then admits the same
prompt again and again: every admission after the first hits the cache (the full group's prefix, each window's
tail before the prompt's replay boundary), attaches the hit and allocates the last block; the hit lengths
must be equal. ``decode_step`` also caches each block as it fills (and the window's, where vLLM's sparse
retention keeps it); vLLM hashes a block when its last token is appended, outside the timed step.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus

from benchmarks.host.manager_ops import (
    SIDES,
    Tokens,
    admit,
    make_request,
    per_request_samples,
    run_decode_steps,
    traced_admissions,
)
from benchmarks.host.timing import calibrate, interleaved, pair_entry, timed_ns
from tagma.core.group_prefix_manager import GroupPrefixKVCacheManager
from tagma.core.group_range_manager import GroupRangeKVCacheManager
from tagma.core.registry import build_kv_cache_manager

__all__ = ["LAYOUTS", "build_managers", "run"]

# Layout -> the window of each group (None: full attention), in vLLM's group order for the model.
LAYOUTS: dict[str, tuple[int | None, ...]] = {
    "gpt-oss": (128, None),
    "gemma3": (1024, 1024, 1024, 1024, 1024, None),
}


def kv_cache_config(layout: str, num_blocks: int, block_size: int) -> KVCacheConfig:
    groups = []
    for i, window in enumerate(LAYOUTS[layout]):
        common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
        spec = (
            FullAttentionSpec(**common)
            if window is None
            else SlidingWindowSpec(**common, sliding_window=window)
        )
        groups.append(KVCacheGroupSpec([f"layer{i}"], spec))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    config.prefix_cache_retention_interval = 0  # the server's default (sparse window retention)
    return config


def build_managers(
    layout: str, num_blocks: int, block_size: int, max_model_len: int, caching: bool = False
) -> dict[str, Any]:
    config = kv_cache_config(layout, num_blocks, block_size)
    kwargs = {
        "max_model_len": max_model_len,
        "scheduler_block_size": block_size,
        "hash_block_size": block_size,
        "enable_caching": caching,
        "log_stats": True,
    }
    managers = {"paged": KVCacheManager(config, **kwargs), "tagma": build_kv_cache_manager(config, **kwargs)}
    assert type(managers["tagma"]) is (GroupPrefixKVCacheManager if caching else GroupRangeKVCacheManager)
    return managers


def _request(side: str, rid: str, tokens: list[int], block_size: int, caching: bool) -> Request:
    """vLLM's request carries its block hasher with caching on; tagma's never (its engine core's)."""
    return make_request(rid, tokens, block_size, caching and side == "paged")


def _windows(layout: str) -> list[int]:
    return [g for g, window in enumerate(LAYOUTS[layout]) if window is not None]


def _window_blocks_held(manager: Any, side: str, rid: str, groups: list[int]) -> int:
    if side == "tagma":
        return sum(manager.num_blocks_held(rid, g) for g in groups)
    managers = manager.coordinator.single_type_managers
    return sum(sum(not b.is_null for b in managers[g].req_to_blocks.get(rid, ())) for g in groups)


def _window_pool_blocks(layout: str, block_size: int) -> int:
    return sum(-(-(w - 1) // block_size) + 1 for w in LAYOUTS[layout] if w is not None)


# ------------------------------------------------------------------------------------------ admission


def admission_free(
    cfg: dict[str, Any],
    layout: str,
    block_size: int,
    context: int,
    outcomes: dict[str, list[Any]],
    caching: bool = False,
) -> dict[str, Any]:
    timing = cfg["timing"]
    n = -(-context // block_size)
    groups = len(LAYOUTS[layout])
    managers = build_managers(layout, 2 * groups * n + 64, block_size, context + block_size, caching)
    tokens = {side: Tokens(cfg["seed"] + context) for side in SIDES}
    fixed = {side: _request(side, "fixed", tokens[side](context), block_size, caching) for side in SIDES}

    def batch_ns(side: str, batch: int) -> int:
        manager, req, log = managers[side], fixed[side], outcomes[side]

        def body() -> None:
            for _ in range(batch):
                log.append(admit(manager, req))
                manager.free(req)

        return timed_ns(body)

    def sampler(side: str, batch: int) -> Callable[[], float]:
        return lambda: batch_ns(side, batch) / batch

    min_ns = int(timing["min_sample_us"]) * 1000
    batch = calibrate(lambda b: max(batch_ns(s, b) for s in SIDES), min_ns, int(cfg["groups"]["max_batch"]))
    samples = interleaved(
        {s: sampler(s, batch) for s in SIDES}, int(timing["repeats"]), int(timing["warmup"])
    )
    return pair_entry(
        samples["paged"],
        samples["tagma"],
        "ms",
        scale=1e-6,
        op="admission_free",
        layout=layout,
        block_size=block_size,
        context_tokens=context,
        groups=groups,
        blocks_per_group=n,
        batch=batch,
        caching=caching,
        hit_tokens={side: outcomes[side][-1][0] for side in SIDES},
    )


# --------------------------------------------------------------------------------------------- decode


def decode_step(
    cfg: dict[str, Any],
    layout: str,
    block_size: int,
    requests: int,
    context: int,
    outcomes: dict[str, list[Any]],
    caching: bool = False,
) -> dict[str, Any]:
    dcfg = cfg["groups"]["decode"]
    repeats, warmup_steps = int(dcfg["repeats"]), int(dcfg["warmup_steps"])
    steps = warmup_steps + repeats * block_size
    n = context // block_size
    growth = steps // block_size + 2
    windows = _windows(layout)
    groups = len(LAYOUTS[layout])
    full_groups = groups - len(windows)
    # Each request keeps its full groups' blocks and a window's worth per window group; one admission at a
    # time holds every group's n blocks until its window groups drop what lies before the window.
    pool = requests * (full_groups * (n + growth) + _window_pool_blocks(layout, block_size) + 2) + groups * (
        n + 1
    )
    managers = build_managers(layout, pool + 64, block_size, context + steps + block_size, caching)
    tokens = Tokens(cfg["seed"] + 7 * context + requests)
    prompts = [tokens(context - i % block_size) for i in range(requests)]
    running: dict[str, list[Request]] = {}
    for side in SIDES:
        manager = managers[side]
        reqs = [_request(side, f"d{i}", prompts[i], block_size, caching) for i in range(requests)]
        for req in reqs:
            if admit(manager, req)[1] is None:
                raise AssertionError(f"groups decode_step: {side} could not admit {req.request_id}")
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
            manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        running[side] = reqs
    del prompts
    token_rng = np.random.default_rng(cfg["seed"])

    def one_step(side: str) -> int:
        manager, reqs = managers[side], running[side]
        counts: list[tuple[int, ...]] = []

        def body() -> None:
            manager.new_step_starts()
            step = [manager.allocate_slots(req, 1) for req in reqs]
            for new in step:
                ids = None if new is None else new.get_block_ids(allow_none=True)
                counts.append(() if ids is None else tuple(len(g) for g in ids))

        ns = timed_ns(body)
        for req in reqs:
            req.num_computed_tokens += 1
        outcomes[side].append((tuple(counts), manager.usage))
        return ns

    step_ns = run_decode_steps(running, one_step, steps, token_rng)
    per_sample = per_request_samples(step_ns, warmup_steps, block_size, requests, repeats)
    churn = _count_churn(
        managers, requests, block_size, lambda: run_decode_steps(running, one_step, block_size, token_rng)
    )
    entry = pair_entry(
        per_sample["paged"],
        per_sample["tagma"],
        "us",
        scale=1e-3,
        op="decode_step_per_request",
        layout=layout,
        block_size=block_size,
        context_tokens=context,
        requests=requests,
        steps=steps,
        pool_blocks=pool + 64,
        caching=caching,
    )
    entry["window_blocks_held"] = {
        side: max(_window_blocks_held(managers[side], side, r.request_id, windows) for r in running[side])
        for side in SIDES
    }
    entry["window_blocks_held_by_vllm_bound"] = _window_pool_blocks(layout, block_size)
    entry["churn_per_request_step"] = churn
    for side in SIDES:
        for req in running[side]:
            managers[side].free(req)
    return entry


def _count_churn(
    managers: dict[str, Any], requests: int, block_size: int, steps: Callable[[], Any]
) -> dict[str, dict[str, float]]:
    """``steps()`` (block_size more decode steps) with the block movers counted: blocks freed and allocated,
    and the calls, per request-step."""
    counts = {
        side: {"blocks_freed": 0, "blocks_allocated": 0, "free_calls": 0, "allocate_calls": 0}
        for side in SIDES
    }
    paged_pool = managers["paged"].block_pool
    tagma = managers["tagma"]
    engine = tagma.engine
    free_blocks, get_new_blocks = paged_pool.free_blocks, paged_pool.get_new_blocks

    def paged_free(blocks: Any) -> None:
        blocks = list(blocks)
        counts["paged"]["free_calls"] += 1
        counts["paged"]["blocks_freed"] += len(blocks)
        free_blocks(blocks)

    def paged_new(num: int) -> Any:
        counts["paged"]["allocate_calls"] += 1
        counts["paged"]["blocks_allocated"] += num
        return get_new_blocks(num)

    class CountingEngine:
        """The engine, with its block movers counted (the engine's own class keeps no instance dict)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def free_front(self, request: int, count: int) -> None:
            counts["tagma"]["free_calls"] += 1
            counts["tagma"]["blocks_freed"] += count
            engine.free_front(request, count)

        def append(self, request: int, count: int) -> Any:
            counts["tagma"]["allocate_calls"] += 1
            counts["tagma"]["blocks_allocated"] += count
            return engine.append(request, count)

        def append_runs(self, request: int, count: int, hint: int = 0) -> Any:
            counts["tagma"]["allocate_calls"] += 1
            counts["tagma"]["blocks_allocated"] += count
            return engine.append_runs(request, count, hint)

    paged_pool.free_blocks, paged_pool.get_new_blocks = paged_free, paged_new  # type: ignore[method-assign]
    tagma.engine = CountingEngine()
    try:
        steps()
    finally:
        del paged_pool.free_blocks, paged_pool.get_new_blocks
        tagma.engine = engine
    request_steps = block_size * requests
    return {side: {k: v / request_steps for k, v in c.items()} for side, c in counts.items()}


# ------------------------------------------------------------------------------------- resident bytes


def resident_bytes(
    cfg: dict[str, Any], layout: str, block_size: int, context: int, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    count = int(cfg["groups"]["resident_requests"])
    n = -(-context // block_size)
    groups = len(LAYOUTS[layout])
    full_groups = groups - len(_windows(layout))
    pool = count * (full_groups * n + _window_pool_blocks(layout, block_size) + 2) + groups * n + 64
    managers = build_managers(layout, pool, block_size, context + block_size)
    prompts = [Tokens(cfg["seed"] + 11 * context + i)(context) for i in range(count)]
    per_request: dict[str, float] = {}
    for side in SIDES:
        manager = managers[side]
        reqs = [make_request(f"m{i}", prompts[i], block_size, False) for i in range(count)]

        def drop_before_window(req: Request, manager: Any = manager) -> None:
            req.num_computed_tokens = req.num_tokens
            manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens)

        log, per_request[side] = traced_admissions(manager, reqs, drop_before_window)
        outcomes[side].append(("resident", log))
        for req in reqs:
            manager.free(req)
    return {
        "op": "resident_bytes_per_request",
        "layout": layout,
        "block_size": block_size,
        "context_tokens": context,
        "requests": count,
        "bytes_per_request": per_request,
        "unit": "B",
        "tagma/paged": per_request["tagma"] / per_request["paged"] if per_request["paged"] else None,
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    gcfg = cfg["groups"]
    outcomes: dict[str, list[Any]] = {s: [] for s in SIDES}
    admissions, decode, resident = [], [], []
    for layout in gcfg["layouts"]:
        for block_size in gcfg["block_sizes"]:
            bs = int(block_size)
            for context in gcfg["contexts"]:
                for caching in gcfg.get("caching", [False]):
                    on = bool(caching)
                    admissions.append(admission_free(cfg, layout, bs, int(context), outcomes, on))
                    gc.collect()
                    requests = int(gcfg["decode"]["requests"])
                    decode.append(decode_step(cfg, layout, bs, requests, int(context), outcomes, on))
                    gc.collect()
                resident.append(resident_bytes(cfg, layout, bs, int(context), outcomes))
                gc.collect()
    return {
        "description": __doc__,
        "layouts": {name: list(LAYOUTS[name]) for name in gcfg["layouts"]},
        "admission_free": admissions,
        "decode_step": decode,
        "resident_bytes": resident,
        "outcomes_compared": len(outcomes["paged"]),
        "outcomes_identical": outcomes["paged"] == outcomes["tagma"],
    }
