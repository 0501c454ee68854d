"""Section ``prefix_ops``: prefix caching on, vLLM's hashed prefix cache against tagma's prefix index.

Both managers come from :func:`benchmarks.host.manager_ops.build_managers` (one full-attention group,
``block_size`` tokens per block, ``log_stats=True``); with caching on ``TagmaKVCacheManager(...)`` is
:class:`tagma.core.prefix_manager.PrefixKVCacheManager`. vLLM's requests carry its sha256 block hasher (its
default ``prefix_caching_hash_algo``); tagma's carry none, as tagma's engine core builds them.

* ``admission_free_hashed``: one request of ``context`` fresh (never cached) tokens, from its construction
  to its free: ``Request(...)`` (vLLM hashes every full block of the prompt there; tagma's request is built
  without a hasher) + ``get_computed_blocks`` + ``allocate_slots`` + ``free``. The pool holds 2n + 64
  blocks, so in the steady state every admission evicts about n cached blocks of the requests before it.
  Only the token list is made outside the timed region (the same lists on both sides).
* ``prefix_hit_lookup``: ``get_computed_blocks`` of a new request whose whole prompt is cached (its
  hashes, for vLLM, were computed when it was built, outside the timed region; tagma's lookup reads the
  prompt's token list inside it, in C through the prefix index's binding). Each sample looks up a fresh
  request object, so nothing a lookup leaves behind helps the next.

Both sides see the same operations in the same order; their outcomes (hit lengths, new blocks) are
compared and must be identical.
"""

from __future__ import annotations

import gc
from typing import Any

from vllm.v1.request import Request

from benchmarks.host.manager_ops import SIDES, Tokens, admit, build_managers, make_request
from benchmarks.host.timing import calibrate, interleaved, pair_entry, timed_ns

__all__ = ["run"]


def _request(side: str, rid: str, tokens: list[int], block_size: int) -> Request:
    # vLLM's request is hashed on construction; tagma's engine core builds requests without a hasher.
    return make_request(rid, tokens, block_size, caching=side == "paged")


def admission_free_hashed(
    cfg: dict[str, Any], context: int, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // block_size
    managers = build_managers(2 * n + 64, block_size, context + block_size, True, cfg["manager"]["policy"])
    tokens = {side: Tokens(cfg["seed"] + 7 * context) for side in SIDES}  # the same sequence on both sides
    seq = dict.fromkeys(SIDES, 0)

    def batch_ns(side: str, batch: int) -> int:
        manager = managers[side]
        lists = [tokens[side](context) for _ in range(batch)]
        first = seq[side]
        seq[side] += batch
        log = outcomes[side]

        def body() -> None:
            for i, toks in enumerate(lists):
                req = _request(side, f"h{first + i}", toks, block_size)
                log.append(admit(manager, req))
                manager.free(req)

        return timed_ns(body)

    min_ns = int(timing["min_sample_us"]) * 1000
    batch = calibrate(lambda b: max(batch_ns(s, b) for s in SIDES), min_ns, int(cfg["manager"]["max_batch"]))
    warmup = max(int(timing["warmup"]), -(-3 // batch))  # >= 3 admissions first: the pool is full of cache
    samples = interleaved(
        {s: (lambda s=s: batch_ns(s, batch) / batch) for s in SIDES}, int(timing["repeats"]), warmup
    )
    entry = pair_entry(
        samples["paged"],
        samples["tagma"],
        "ms",
        scale=1e-6,
        op="admission_free_hashed",
        context_tokens=context,
        blocks=n,
        batch=batch,
        pool_blocks=managers["paged"].block_pool.num_gpu_blocks,
    )
    return entry


def prefix_hit_lookup(cfg: dict[str, Any], context: int, outcomes: dict[str, list[Any]]) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // block_size
    managers = build_managers(n + 64, block_size, context + block_size, True, cfg["manager"]["policy"])
    prompt = Tokens(cfg["seed"] + 11 * context)(context)
    for side in SIDES:
        owner = _request(side, "owner", prompt, block_size)
        admit(managers[side], owner)
        managers[side].free(owner)  # its blocks stay cached
    seq = dict.fromkeys(SIDES, 0)

    def batch_ns(side: str, batch: int) -> int:
        manager = managers[side]
        reqs = []
        for _ in range(batch):
            seq[side] += 1
            reqs.append(_request(side, f"q{seq[side]}", prompt, block_size))
        hits: list[int] = []

        def body() -> None:
            for req in reqs:
                hits.append(manager.get_computed_blocks(req)[1])

        ns = timed_ns(body)
        outcomes[side].append(("lookup", hits[0]))
        return ns

    min_ns = int(timing["min_sample_us"]) * 1000
    batch = calibrate(lambda b: max(batch_ns(s, b) for s in SIDES), min_ns, int(cfg["manager"]["max_batch"]))
    samples = interleaved(
        {s: (lambda s=s: batch_ns(s, batch) / batch) for s in SIDES},
        int(timing["repeats"]),
        int(timing["warmup"]),
    )
    entry = pair_entry(
        samples["paged"],
        samples["tagma"],
        "ms",
        scale=1e-6,
        op="prefix_hit_lookup",
        context_tokens=context,
        blocks=n,
        batch=batch,
        hit_tokens=outcomes["paged"][-1][1],
    )
    return entry


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    pcfg = cfg["prefix_ops"]
    outcomes: dict[str, list[Any]] = {s: [] for s in SIDES}
    admissions = []
    for c in pcfg["contexts"]:
        admissions.append(admission_free_hashed(cfg, int(c), outcomes))
        gc.collect()  # the managers hold reference cycles: free them before building the next
    lookups = []
    for c in pcfg["contexts"]:
        lookups.append(prefix_hit_lookup(cfg, int(c), outcomes))
        gc.collect()
    return {
        "description": __doc__,
        "block_size": int(cfg["block_size"]),
        "hash": "sha256 (vLLM's default prefix_caching_hash_algo)",
        "admission_free_hashed": admissions,
        "prefix_hit_lookup": lookups,
        "outcomes_identical": outcomes["paged"] == outcomes["tagma"],
        "num_outcomes": len(outcomes["paged"]),
    }
