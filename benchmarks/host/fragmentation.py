"""Section 5: fragmentation of range placement under a concurrent decode trace, per placement policy.

A closed-loop trace at block granularity: ``requests`` slots stay busy; a request has a prompt of
U(prompt_min_frac, 1) x context tokens and an output of U(output_min, output_max) tokens. One tick is
block_size decode tokens: in slot order, every prefilling request appends its next chunk
(``prefill_chunk_tokens``, chunked prefill) and every decoding request appends one block; a request that
is done is released, and the next one in the queue is admitted when its first chunk fits. When an append
does not fit, the most recently admitted request is preempted (released and requeued from scratch), as
vLLM's scheduler does. Those decisions depend only on free-block counts, so every policy (and the paged
reference) runs exactly the same trace. The pool holds ``pool_factor`` x requests x (context + output_max)
tokens, for each of ``pool_factors`` (with a small factor the pool cannot hold every running request at its
longest: preemptions happen, and placement runs out of room to grow).

Per policy (the engine's first_fit / best_fit / headroom, the manager's default being headroom; a
"+hint" suffix passes each append the request's remaining expected blocks, prompt + output, so that a new
range goes where the whole request fits):
* ranges per request: at completion (mean, p50, p99, max over finished requests), and the time average of
  the mean over live requests; requests that ever exceeded 256 ranges (the seed design's cap);
* in-place growth share: the fraction of decode appends that extended the request's last range (the
  request's range count did not grow), and the engine's counters over all appends;
* largest free range (blocks) and external fragmentation (1 - largest / free), time-averaged and worst.

Paged reference: vLLM's own ``BlockPool`` (prefix caching off) driven by the same trace; its "ranges" are
the runs of consecutive block ids in a request's block list (what a range descriptor of that list would
need). The trace itself is :mod:`benchmarks.fragmentation_sim`, the simulator the GPU benchmark's
fragmented placements come from too.
"""

from __future__ import annotations

from typing import Any

from benchmarks.fragmentation_sim import EngineSide, PagedSide, fixed_context_jobs, simulate

__all__ = ["run"]


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    fcfg = cfg["fragmentation"]
    slots = int(fcfg["requests"])
    sample_every = int(fcfg["sample_every"])
    chunk_blocks = max(1, int(fcfg["prefill_chunk_tokens"]) // block_size)
    results = []
    for context in fcfg["contexts"]:
        context = int(context)
        jobs = fixed_context_jobs(
            slots * int(fcfg["turnovers"]), context, block_size, float(fcfg["prompt_min_frac"]),
            int(fcfg["output_min"]), int(fcfg["output_max"]), int(cfg["seed"]) + context,
        )  # fmt: skip
        for factor in fcfg["pool_factors"]:
            pool_blocks = int(float(factor) * slots * (context + int(fcfg["output_max"])) / block_size) + 1
            row: dict[str, Any] = {
                "context_tokens": context,
                "requests": slots,
                "jobs": len(jobs),
                "pool_factor": float(factor),
                "pool_blocks": pool_blocks,
                "prefill_chunk_blocks": chunk_blocks,
                "policies": {},
            }
            for policy in fcfg["policies"]:
                side = EngineSide(pool_blocks, policy)
                row["policies"][policy] = simulate(side, jobs, slots, pool_blocks, chunk_blocks, sample_every)
            row["paged_vllm_blockpool"] = None
            if pool_blocks <= int(fcfg["paged_reference_max_blocks"]):
                paged = PagedSide(pool_blocks, block_size)
                row["paged_vllm_blockpool"] = simulate(
                    paged, jobs, slots, pool_blocks, chunk_blocks, sample_every
                )
            results.append(row)
    return {"description": __doc__, "block_size": block_size, "traces": results}
