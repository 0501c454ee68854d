"""Section 5: fragmentation of range placement under a concurrent trace at saturation, per placement policy.

A closed-loop trace at block granularity (:mod:`benchmarks.fragmentation_sim`): ``requests`` slots; a
request has a prompt of U(prompt_min_frac, 1) x context tokens and an output of U(output_min, output_max)
tokens. One tick is block_size decode steps: in admission order every prefilling request appends its next
chunk (``prefill_chunk_tokens``) and every decoding request one block; a finished request is released. As
vLLM's scheduler: a request whose blocks do not fit (too few free, or the allocator declines) preempts the
most recently admitted request (itself when it is the last), and then no later request is scheduled in that
tick; waiting requests (preempted ones first) are admitted after the running ones, only in a tick without
a preemption, while their first chunk is placed. The pool holds ``pool_factor`` x requests x (context +
output_max) tokens, for each of ``pool_factors``: with a small factor the running requests outgrow it and
vLLM's paged pool preempts.

Per policy (the engine's first_fit / best_fit / headroom / reserve; suffixes: "+hint" passes each append
the request's remaining expected blocks, prompt + output; "+maxhint" prompt + output_max, max_tokens as a
cap; "+admit<P>x<K>" turns on RESERVE admission: a request is admitted once P% of its hint fits in its K
largest free parts clear of other requests' reservations; the range manager under TAGMA_PLACEMENT=reserve
is "reserve+hint+admit100x4" with max_tokens as the hint's output):
* ranges per request at completion (mean, p50, p99, max), the time average over live requests, requests
  over 256 ranges, in-place growth shares, largest free range and external fragmentation;
* the trade-off against paged at equal KV capacity: admitted concurrency (running requests, time average),
  preemptions, allocator refusals, the throughput proxy (the trace's tokens per simulated step: all jobs'
  blocks / ticks; recomputation after a preemption is not charged), and unfinished (rejected) requests.

Paged reference: vLLM's own ``BlockPool`` (prefix caching off) driven by the same rules; its "ranges" are
the runs of consecutive block ids in a request's block list. Policies that never decline (all but RESERVE
admission) make exactly the paged reference's decisions.
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
