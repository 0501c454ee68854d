"""Section ``prefix_ops``: prefix caching on, vLLM's hashed prefix cache against tagma's prefix index.

Both managers come from :func:`benchmarks.host.manager_ops.build_managers` (one full-attention group,
``block_size`` tokens per block, ``log_stats=True``); with caching on ``TagmaKVCacheManager(...)`` is
:class:`tagma.core.prefix_manager.PrefixKVCacheManager`. vLLM's requests carry its sha256 block hasher (its
default ``prefix_caching_hash_algo``); tagma's carry none, as tagma's engine core builds them. Where vLLM's
hashing is timed (``admission_free_hashed``) a third side, ``paged_xxhash``, is vLLM's manager whose requests
hash with ``xxhash`` (``--prefix-caching-hash-algo xxhash``, vLLM's fastest; config ``vllm_fast_hash``,
null: no third side), measured in the same interleaved rounds: the entry's ``ratio_vs_fast_hash`` is tagma
against it, ``ratio`` stays tagma against sha256. Each side's NONE_HASH is vLLM's for its algorithm
(:mod:`benchmarks.host.hashing`), put in place before the side's sample, outside the timed region.

* ``admission_free_hashed``: one request of ``context`` fresh (never cached) tokens, from its construction
  to its free: ``Request(...)`` (vLLM hashes every full block of the prompt there; tagma's request is built
  without a hasher) + ``get_computed_blocks`` + ``allocate_slots`` + ``free``. The pool holds 2n + 64
  blocks, so in the steady state every admission evicts about n cached blocks of the requests before it.
  Only the token list is made outside the timed region (the same lists on both sides).
* ``prefix_hit_lookup``: ``get_computed_blocks`` of a new request whose whole prompt is cached (its
  hashes, for vLLM, were computed when it was built, outside the timed region; tagma's lookup reads the
  prompt's token list inside it, in C through the prefix index's binding). Each sample looks up a fresh
  request object, so nothing a lookup leaves behind helps the next.

All sides see the same operations in the same order; their outcomes (hit lengths, new blocks) are
compared and must be identical.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

from vllm.v1.request import Request

from benchmarks.host import hashing
from benchmarks.host.manager_ops import SIDES, Tokens, admit, build_managers, make_request, vllm_manager
from benchmarks.host.timing import calibrate, interleaved, pair_entry, summarize, timed_ns

__all__ = ["run"]


def _request(side: str, rid: str, tokens: list[int], block_size: int, fast: str | None = None) -> Request:
    # vLLM's request is hashed on construction; tagma's engine core builds requests without a hasher.
    if side == "tagma":
        return make_request(rid, tokens, block_size, caching=False)
    return make_request(rid, tokens, block_size, caching=True, hash_algo=_algo(side, fast))


def fast_hash(cfg: dict[str, Any]) -> str | None:
    """The configured faster vLLM hash algorithm (``vllm_fast_hash``), None when off or unavailable here."""
    algo = cfg.get("vllm_fast_hash")
    if not algo or algo == hashing.DEFAULT or hashing.available(str(algo)) is not None:
        return None
    return str(algo)


def _algo(side: str, fast: str | None) -> str:
    return fast if fast is not None and side == hashing.side_name(fast) else hashing.DEFAULT


def add_fast_side(entry: dict[str, Any], samples: list[float], side: str, algo: str, scale: float) -> None:
    """The third side's summary in a pair entry, and tagma's ratios against it (median and paired)."""
    entry[side] = summarize(samples, entry["unit"], scale)
    entry["fast_hash"] = {"algo": algo, "side": side, "none_hash_seed": hashing.seed_source(algo)}
    median = entry[side]["median"]
    entry["ratio_vs_fast_hash"] = entry["tagma"]["median"] / median if median > 0 else None
    fast = entry[side]["samples"]  # scaled as tagma's: the per-repeat ratios pair samples of one round
    per_repeat = [t / x for x, t in zip(fast, entry["tagma"]["samples"], strict=True) if x > 0]
    entry["ratio_paired_vs_fast_hash"] = statistics.median(per_repeat) if per_repeat else None
    entry["speedup_vs_fast_hash"] = 1.0 / entry["ratio_vs_fast_hash"] if entry["ratio_vs_fast_hash"] else None
    entry["fast_hash/paged"] = median / entry["paged"]["median"] if entry["paged"]["median"] > 0 else None


def admission_free_hashed(
    cfg: dict[str, Any], context: int, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // block_size
    managers = build_managers(2 * n + 64, block_size, context + block_size, True, cfg["manager"]["policy"])
    fast = fast_hash(cfg)
    sides = SIDES
    if fast is not None:
        sides = (*SIDES, hashing.side_name(fast))
        managers[sides[-1]] = vllm_manager(2 * n + 64, block_size, context + block_size, True)
    tokens = {side: Tokens(cfg["seed"] + 7 * context) for side in sides}  # the same sequence on every side
    seq = dict.fromkeys(sides, 0)

    def batch_ns(side: str, batch: int) -> int:
        manager = managers[side]
        lists = [tokens[side](context) for _ in range(batch)]
        first = seq[side]
        seq[side] += batch
        log = outcomes.setdefault(side, [])

        def body() -> None:
            for i, toks in enumerate(lists):
                req = _request(side, f"h{first + i}", toks, block_size, fast)
                log.append(admit(manager, req))
                manager.free(req)

        with hashing.use(_algo(side, fast)):  # the side's NONE_HASH, set outside the timed body
            return timed_ns(body)

    min_ns = int(timing["min_sample_us"]) * 1000
    batch = calibrate(lambda b: max(batch_ns(s, b) for s in sides), min_ns, int(cfg["manager"]["max_batch"]))
    warmup = max(int(timing["warmup"]), -(-3 // batch))  # >= 3 admissions first: the pool is full of cache
    samples = interleaved(
        {s: (lambda s=s: batch_ns(s, batch) / batch) for s in sides}, int(timing["repeats"]), warmup
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
    if fast is not None:
        add_fast_side(entry, samples[sides[-1]], sides[-1], fast, 1e-6)
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
    outcomes: dict[str, list[Any]] = {s: [] for s in SIDES}  # plus the fast-hash side's, when it runs
    admissions = []
    for c in pcfg["contexts"]:
        admissions.append(admission_free_hashed(cfg, int(c), outcomes))
        gc.collect()  # the managers hold reference cycles: free them before building the next
    lookups = []
    for c in pcfg["contexts"]:
        lookups.append(prefix_hit_lookup(cfg, int(c), outcomes))
        gc.collect()
    fast = fast_hash(cfg)
    fast_side = hashing.side_name(fast) if fast else None
    configured = cfg.get("vllm_fast_hash")
    return {
        "description": __doc__,
        "block_size": int(cfg["block_size"]),
        "hash": "sha256 (vLLM's default prefix_caching_hash_algo)",
        "fast_hash": {
            "configured": configured,
            "algo": fast,
            "side": fast_side,
            "unavailable": hashing.available(str(configured)) if configured else None,
            "rows": ["admission_free_hashed"] if fast else [],
        },
        "admission_free_hashed": admissions,
        "prefix_hit_lookup": lookups,
        "outcomes_identical": outcomes["paged"] == outcomes["tagma"],
        # the fast-hash side's admissions against sha256's (the same ones: outcomes must match)
        "fast_hash_outcomes_identical": (
            outcomes[fast_side] == outcomes["paged"][: len(outcomes[fast_side])] if fast_side else None
        ),
        "num_outcomes": len(outcomes["paged"]),
    }
