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
need).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock

from tagma.engine import NoSpaceError, Policy, RangeEngine

__all__ = ["make_trace", "run"]

SEED_DESIGN_RANGE_CAP = 256


@dataclass
class Job:
    index: int
    prompt_blocks: int
    output_blocks: int


@dataclass
class Live:
    job: Job
    handle: Any
    prefilled: int = 0
    decoded: int = 0
    blocks: list[KVCacheBlock] = field(default_factory=list)  # paged reference only
    ranges: int = 0


def make_trace(num_jobs: int, context: int, block_size: int, fcfg: dict[str, Any], seed: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(num_jobs):
        prompt = int(rng.uniform(float(fcfg["prompt_min_frac"]), 1.0) * context)
        output = int(rng.integers(int(fcfg["output_min"]), int(fcfg["output_max"]) + 1))
        jobs.append(Job(i, max(1, -(-prompt // block_size)), max(1, -(-output // block_size))))
    return jobs


class EngineSide:
    """The trace's allocator calls on a tagma engine, with the per-policy measurements."""

    def __init__(self, pool_blocks: int, policy: str) -> None:
        # "<policy>+hint": appends carry the request's remaining expected blocks (prompt + output, as the
        # range manager's prompt + max_tokens), so new ranges go where the whole request fits.
        base, _, hinted = policy.partition("+")
        self.hinted = hinted == "hint"
        self.engine = RangeEngine(pool_blocks, policy=Policy.parse(base))
        self.decode_appends = 0
        self.decode_in_place = 0
        self.exceeded_cap = 0
        self.rejected = 0  # appends the engine refused although enough blocks were free

    def admit(self, live: Live) -> None:
        live.handle = self.engine.create_request()

    def append(self, live: Live, count: int, decode: bool) -> bool:
        try:
            if self.hinted:
                job = live.job
                hint = job.prompt_blocks + job.output_blocks - live.prefilled - live.decoded
                self.engine.append_runs(live.handle, count, hint)
            else:
                self.engine.append(live.handle, count)
        except NoSpaceError:
            self.rejected += 1  # the trace only appends what the free count allows: placement refused it
            return False
        ranges = self.engine.num_ranges(live.handle)
        if decode:
            self.decode_appends += 1
            self.decode_in_place += ranges <= live.ranges
        if ranges > SEED_DESIGN_RANGE_CAP >= live.ranges:
            self.exceeded_cap += 1
        live.ranges = ranges
        return True

    def release(self, live: Live) -> int:
        ranges = self.engine.num_ranges(live.handle)
        self.engine.release(live.handle)
        return ranges

    def sample(self) -> tuple[float, float, float, int]:
        s = self.engine.stats()
        mean = s.total_request_ranges / s.live_requests if s.live_requests else 0.0
        return mean, float(s.largest_free_range), s.external_fragmentation, s.max_request_ranges


class PagedSide:
    """vLLM's BlockPool under the same calls; ranges = runs of consecutive ids in a request's block list."""

    def __init__(self, pool_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(pool_blocks, enable_caching=False, hash_block_size=block_size)
        self.live: dict[int, Live] = {}

    @staticmethod
    def runs(blocks: list[KVCacheBlock]) -> int:
        if not blocks:
            return 0
        ids = np.fromiter((b.block_id for b in blocks), dtype=np.int64, count=len(blocks))
        return 1 + int(np.count_nonzero(np.diff(ids) != 1))

    def admit(self, live: Live) -> None:
        self.live[live.job.index] = live

    def append(self, live: Live, count: int, decode: bool) -> bool:
        live.blocks.extend(self.pool.get_new_blocks(count))
        return True

    def release(self, live: Live) -> int:
        ranges = self.runs(live.blocks)
        self.pool.free_blocks(list(reversed(live.blocks)))
        live.blocks = []
        self.live.pop(live.job.index, None)
        return ranges

    def sample(self) -> tuple[float, float, float, int]:
        counts = [self.runs(x.blocks) for x in self.live.values() if x.blocks]
        return (float(np.mean(counts)) if counts else 0.0, float("nan"), float("nan"), max(counts, default=0))


def simulate(
    side: EngineSide | PagedSide,
    jobs: list[Job],
    slots: int,
    pool_blocks: int,
    chunk_blocks: int,
    sample_every: int,
) -> dict[str, Any]:
    queue: deque[Job] = deque(jobs)
    running: list[Live] = []
    free = pool_blocks - 1  # block 0 is the null block
    finished_ranges: list[int] = []
    samples: list[tuple[float, float, float, int]] = []
    preemptions = ticks = 0
    start = time.perf_counter()

    def release(live: Live, done: bool) -> None:
        nonlocal free
        ranges = side.release(live)
        free += live.prefilled + live.decoded
        if done:
            finished_ranges.append(ranges)

    while queue or running:
        # admission: the next request when its first chunk fits
        while queue and len(running) < slots and free >= min(chunk_blocks, queue[0].prompt_blocks):
            live = Live(queue.popleft(), None)
            side.admit(live)
            running.append(live)
        for live in list(running):
            if live not in running:  # preempted earlier in this tick
                continue
            prefill = live.prefilled < live.job.prompt_blocks
            need = min(chunk_blocks, live.job.prompt_blocks - live.prefilled) if prefill else 1
            while need > free and running[-1] is not live:
                victim = running.pop()
                release(victim, done=False)
                queue.appendleft(Job(victim.job.index, victim.job.prompt_blocks, victim.job.output_blocks))
                preemptions += 1
            if need > free:  # alone and still no room: wait (cannot happen with a sane pool size)
                continue
            if not side.append(live, need, decode=not prefill):
                continue  # refused although `need` blocks are free: counted as rejected, retried next tick
            free -= need
            if prefill:
                live.prefilled += need
            else:
                live.decoded += 1
            if live.decoded >= live.job.output_blocks:
                running.remove(live)
                release(live, done=True)
        ticks += 1
        if ticks % sample_every == 0 and running:
            samples.append(side.sample())
    elapsed = time.perf_counter() - start
    fr = np.asarray(finished_ranges, dtype=float)
    arr = np.asarray(samples, dtype=float) if samples else np.zeros((0, 4))
    out: dict[str, Any] = {
        "ticks": ticks,
        "finished": len(finished_ranges),
        "preemptions": preemptions,
        "seconds": round(elapsed, 3),
        "ranges_at_completion": {
            "mean": float(fr.mean()),
            "p50": float(np.percentile(fr, 50)),
            "p99": float(np.percentile(fr, 99)),
            "max": int(fr.max()),
        },
        "ranges_live_time_avg": float(arr[:, 0].mean()) if len(arr) else None,
        "max_ranges_live": int(arr[:, 3].max()) if len(arr) else None,
    }
    if isinstance(side, EngineSide):
        stats = side.engine.stats()
        out.update(
            {
                "largest_free_range_time_avg": float(arr[:, 1].mean()) if len(arr) else None,
                "largest_free_range_min": int(arr[:, 1].min()) if len(arr) else None,
                "external_fragmentation_time_avg": float(arr[:, 2].mean()) if len(arr) else None,
                "external_fragmentation_max": float(arr[:, 2].max()) if len(arr) else None,
                "decode_appends": side.decode_appends,
                "decode_in_place_share": side.decode_in_place / side.decode_appends
                if side.decode_appends
                else None,
                "in_place_growths": stats.in_place_growths,
                "new_ranges": stats.new_ranges,
                "merges": stats.merges,
                "in_place_share_all_appends": stats.in_place_growths
                / max(1, stats.in_place_growths + stats.new_ranges),
                "requests_over_256_ranges": side.exceeded_cap,
                "rejected": side.rejected,
            }
        )
        side.engine.close()
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    fcfg = cfg["fragmentation"]
    slots = int(fcfg["requests"])
    sample_every = int(fcfg["sample_every"])
    chunk_blocks = max(1, int(fcfg["prefill_chunk_tokens"]) // block_size)
    results = []
    for context in fcfg["contexts"]:
        context = int(context)
        jobs = make_trace(
            slots * int(fcfg["turnovers"]), context, block_size, fcfg, int(cfg["seed"]) + context
        )
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
