"""How fragmented do requests' ranges get under serving? One trace simulator for every benchmark that asks.

The simulator drives an allocator the way vLLM's scheduler drives the KV cache manager (prefix caching off),
at block granularity. Every job waits in one queue from the start. One tick is ``block_size`` decode tokens:
the next job in the queue is admitted while fewer than ``slots`` run and its first prefill chunk fits; then,
in admission order, every prefilling job appends its next chunk (``chunk_blocks``, chunked prefill) and every
decoding job appends one block; a job that has written its prompt and output releases its blocks. When an
append does not fit, the most recently admitted job is preempted (released and requeued from scratch), as
vLLM's scheduler does. Those decisions depend only on free-block counts, so every placement policy, and
vLLM's own ``BlockPool`` as the paged reference, runs exactly the same trace.

Two users, one simulator:

* the host benchmark's fragmentation section (:mod:`benchmarks.host.fragmentation`): ranges per request at
  completion and over time, in-place growth share, free-space fragmentation, per policy and pool size;
* the GPU kernel benchmark's fragmented placements (:mod:`benchmarks.gpu.placement`): the histogram of range
  lengths seen in every live request at each sample, stored per policy in
  ``benchmarks/gpu/fragmentation_trace.json`` (``python -m benchmarks.fragmentation_sim`` regenerates it
  from :class:`TraceConfig`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TRACE_PATH",
    "POLICIES",
    "EngineSide",
    "Job",
    "PagedSide",
    "TraceConfig",
    "fixed_context_jobs",
    "load_trace",
    "log_uniform_jobs",
    "run_trace",
    "simulate",
]

DEFAULT_TRACE_PATH = Path(__file__).parent / "gpu" / "fragmentation_trace.json"
# the manager's default (headroom), the range manager under TAGMA_PLACEMENT=reserve, and the two classics
POLICIES = ("headroom", "reserve+hint+admit100x4", "best_fit", "first_fit")
SEED_DESIGN_RANGE_CAP = 256


# ------------------------------------------------------------------------------------------------ jobs


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    prompt_blocks: int
    output_blocks: int
    max_output_blocks: int = 0  # the trace's largest output (a max_tokens cap); 0: the output itself


def fixed_context_jobs(
    num_jobs: int, context: int, block_size: int, prompt_min_frac: float, output_min: int, output_max: int,
    seed: int,
) -> list[Job]:  # fmt: skip
    """Prompts of U(prompt_min_frac, 1) x ``context`` tokens, outputs U(output_min, output_max) tokens."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(num_jobs):
        prompt = int(rng.uniform(float(prompt_min_frac), 1.0) * context)
        output = int(rng.integers(int(output_min), int(output_max) + 1))
        cap = -(-int(output_max) // block_size)
        jobs.append(Job(i, max(1, -(-prompt // block_size)), max(1, -(-output // block_size)), cap))
    return jobs


def log_uniform_jobs(
    num_jobs: int, prompt_min: int, prompt_max: int, output_min: int, output_max: int, block_size: int,
    seed: int,
) -> list[Job]:  # fmt: skip
    """Prompts log-uniform in [prompt_min, prompt_max] tokens, outputs U(output_min, output_max) tokens."""
    rng = np.random.default_rng(seed)
    prompts = np.exp(rng.uniform(math.log(prompt_min), math.log(prompt_max), num_jobs))
    outputs = rng.integers(output_min, output_max + 1, num_jobs)
    cap = -(-output_max // block_size)
    return [
        Job(i, max(1, -(-int(p) // block_size)), max(1, -(-int(o) // block_size)), cap)
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ]


# ------------------------------------------------------------------------------------------------ allocators


@dataclass
class Live:
    job: Job
    handle: Any
    prefilled: int = 0
    decoded: int = 0
    blocks: list[Any] = field(default_factory=list)  # paged reference only
    ranges: int = 0


class EngineSide:
    """The trace's allocator calls on a tagma engine, with the per-policy measurements.

    With ``record_lengths``, every sample also counts the length (in blocks) of every range of every live
    request: the histogram the GPU benchmark's fragmented placements draw from.
    """

    def __init__(self, pool_blocks: int, policy: str, record_lengths: bool = False) -> None:
        from tagma.engine import Policy, RangeEngine

        # "<policy>[+hint|+maxhint][+admit<percent>]": with "+hint", appends carry the request's remaining
        # expected blocks, prompt + output (the range manager's prompt + max_tokens when max_tokens is the
        # output); "+maxhint" hints prompt + the trace's largest output instead (max_tokens as a cap, the hint
        # overestimating). "+admit<percent>x<pieces>" sets the engine's RESERVE admission
        # (tagma_engine_set_admission): a job is admitted once <percent>% of its hint fits in its <pieces>
        # largest free parts clear of other jobs' expected growth.
        base, *flags = policy.split("+")
        self.hinted = "hint" in flags or "maxhint" in flags
        self.max_hint = "maxhint" in flags
        admit = [tuple(int(x) for x in f[len("admit") :].split("x")) for f in flags if f.startswith("admit")]
        unknown = [f for f in flags if f not in ("hint", "maxhint") and not f.startswith("admit")]
        if unknown or len(admit) > 1:
            raise ValueError(f"policy {policy!r}: unknown or repeated suffix")
        self.engine = RangeEngine(pool_blocks, policy=Policy.parse(base))
        if admit:
            self.engine.set_admission(*admit[0])
        self.decode_appends = 0
        self.decode_in_place = 0
        self.exceeded_cap = 0
        self.lengths: Counter[int] | None = Counter() if record_lengths else None
        self.blocks_per_request: list[int] = []

    def admit(self, live: Live) -> None:
        live.handle = self.engine.create_request()

    def append(self, live: Live, count: int, decode: bool) -> bool:
        from tagma.engine import NoSpaceError

        try:
            if self.hinted:
                job = live.job
                output = (job.max_output_blocks or job.output_blocks) if self.max_hint else job.output_blocks
                hint = max(count, job.prompt_blocks + output - live.prefilled - live.decoded)
                self.engine.append_runs(live.handle, count, hint)
            else:
                self.engine.append(live.handle, count)
        except NoSpaceError:
            return False  # the trace only asks when the free count allows: the placement declined
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

    def sample(self, running: list[Live]) -> tuple[float, float, float, int]:
        if self.lengths is not None:
            for live in running:
                if live.prefilled:
                    self.lengths.update(self.engine.ranges_array(live.handle)[:, 1].tolist())
                    self.blocks_per_request.append(live.prefilled + live.decoded)
        s = self.engine.stats()
        mean = s.total_request_ranges / s.live_requests if s.live_requests else 0.0
        return mean, float(s.largest_free_range), s.external_fragmentation, s.max_request_ranges


class PagedSide:
    """vLLM's BlockPool under the same calls; ranges = runs of consecutive ids in a request's block list."""

    def __init__(self, pool_blocks: int, block_size: int) -> None:
        from vllm.v1.core.block_pool import BlockPool

        self.pool = BlockPool(pool_blocks, enable_caching=False, hash_block_size=block_size)
        self.live: dict[int, Live] = {}

    @staticmethod
    def runs(blocks: list[Any]) -> int:
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

    def sample(self, running: list[Live]) -> tuple[float, float, float, int]:
        counts = [self.runs(x.blocks) for x in self.live.values() if x.blocks]
        return (float(np.mean(counts)) if counts else 0.0, float("nan"), float("nan"), max(counts, default=0))


# ------------------------------------------------------------------------------------------------ the trace


def _engine_stats(side: EngineSide, arr: np.ndarray, rejected: int, samples: int) -> dict[str, Any]:
    """An engine side's placement measurements: free-range samples, in-place share, the engine's counters."""
    stats = side.engine.stats()
    return {
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
        "rejected": rejected,
        "samples": samples,
    }


def simulate(
    side: EngineSide | PagedSide,
    jobs: list[Job],
    slots: int,
    pool_blocks: int,
    chunk_blocks: int,
    sample_every: int,
    warmup_jobs: int = 0,
    max_ticks: int | None = None,
) -> dict[str, Any]:
    """Run ``jobs`` through ``side``; samples every ``sample_every`` ticks once ``warmup_jobs`` finished.

    Returns the trace's measurements as a JSON-ready dict (closes an engine side's engine).
    """
    queue: deque[Job] = deque(jobs)
    running: list[Live] = []
    free = pool_blocks - 1  # block 0 is the null block
    finished_ranges: list[int] = []
    samples: list[tuple[float, float, float, int]] = []
    preemptions = ticks = refusals = 0
    running_sum = appended_tokens = 0
    limit = max_ticks or 100 * (sum(j.prompt_blocks + j.output_blocks for j in jobs) // max(1, slots) + 1)
    start = time.perf_counter()

    def release(live: Live, done: bool) -> None:
        nonlocal free
        ranges = side.release(live)
        free += live.prefilled + live.decoded
        if done:
            finished_ranges.append(ranges)

    def grow(live: Live, need: int) -> bool:
        """One allocation as vLLM's scheduler makes it: the free count first, then the allocator."""
        nonlocal refusals
        if need > free:
            return False
        if side.append(live, need, decode=live.prefilled >= live.job.prompt_blocks):
            return True
        refusals += 1  # enough blocks were free: the allocator declined (a placement limit)
        return False

    while (queue or running) and ticks < limit:
        preempted = False
        # running requests in admission order; one that cannot get its blocks preempts the most recently
        # admitted (itself last), and then no later running request is scheduled in this tick
        i = 0
        while i < len(running):
            live = running[i]
            prefill = live.prefilled < live.job.prompt_blocks
            need = min(chunk_blocks, live.job.prompt_blocks - live.prefilled) if prefill else 1
            ok = grow(live, need)
            while not ok:
                victim = running.pop()
                release(victim, done=False)
                queue.appendleft(victim.job)
                preemptions += 1
                preempted = True
                if victim is live:
                    break
                ok = grow(live, need)
            if not ok:
                break
            free -= need
            appended_tokens += need
            if prefill:
                live.prefilled += need
            else:
                live.decoded += 1
            if live.decoded >= live.job.output_blocks:
                running.pop(i)
                release(live, done=True)
            else:
                i += 1
        # admission (none in a tick with a preemption, as vLLM): the next job when its first chunk is placed
        while not preempted and queue and len(running) < slots:
            live = Live(queue[0], None)
            need = min(chunk_blocks, live.job.prompt_blocks)
            side.admit(live)
            if not grow(live, need):
                side.release(live)
                break
            queue.popleft()
            free -= need
            appended_tokens += need
            live.prefilled = need
            running.append(live)
        ticks += 1
        running_sum += len(running)
        if ticks % sample_every == 0 and running and len(finished_ranges) >= warmup_jobs:
            samples.append(side.sample(running))
    elapsed = time.perf_counter() - start
    fr = np.asarray(finished_ranges, dtype=float)
    arr = np.asarray(samples, dtype=float) if samples else np.zeros((0, 4))
    useful = sum(j.prompt_blocks + j.output_blocks for j in jobs)
    out: dict[str, Any] = {
        "ticks": ticks,
        "finished": len(finished_ranges),
        "unfinished": len(jobs) - len(finished_ranges),
        "preemptions": preemptions,
        "refusals": refusals,
        "running_mean": running_sum / max(1, ticks),
        "blocks_per_tick": useful / max(1, ticks),
        "appended_blocks_per_tick": appended_tokens / max(1, ticks),
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
        out.update(_engine_stats(side, arr, len(jobs) - len(finished_ranges), len(samples)))
        side.engine.close()
    return out


# ------------------------------------------------------------------------------------------ GPU placements


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """The trace whose range lengths the GPU benchmark's fragmented placements draw from."""

    num_blocks: int = 65536  # 1M tokens of 16: an 8B model's KV cache on an 80-140 GB GPU
    block_size: int = 16
    policy: str = "headroom"  # the manager's default placement policy
    num_requests: int = 400
    max_running: int = 64
    prefill_chunk_tokens: int = 8192  # max_num_batched_tokens
    prompt_min: int = 2048
    prompt_max: int = 131072
    output_min: int = 128
    output_max: int = 1024
    warmup_requests: int = 40
    sample_every: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.prompt_min <= self.prompt_max or not 0 < self.output_min <= self.output_max:
            raise ValueError("prompt and output lengths need 0 < min <= max")
        need = math.ceil((self.prompt_max + self.output_max) / self.block_size)
        if need > self.num_blocks - 1:
            raise ValueError(f"a {need}-block request cannot fit in {self.num_blocks - 1} usable blocks")
        if self.warmup_requests >= self.num_requests:
            raise ValueError("warmup_requests must be below num_requests")


def run_trace(config: TraceConfig | None = None) -> dict[str, Any]:
    """Run the trace of ``config`` and return its JSON-ready record (config, histogram, summary)."""
    from tagma.engine import version

    cfg = config or TraceConfig()
    jobs = log_uniform_jobs(
        cfg.num_requests, cfg.prompt_min, cfg.prompt_max, cfg.output_min, cfg.output_max, cfg.block_size,
        cfg.seed,
    )  # fmt: skip
    side = EngineSide(cfg.num_blocks, cfg.policy, record_lengths=True)
    chunk_blocks = max(1, cfg.prefill_chunk_tokens // cfg.block_size)
    result = simulate(
        side, jobs, cfg.max_running, cfg.num_blocks, chunk_blocks, cfg.sample_every, cfg.warmup_requests
    )
    assert side.lengths is not None
    lengths = sorted(side.lengths)
    counts = [side.lengths[n] for n in lengths]
    arr_len, arr_cnt = np.array(lengths, dtype=np.float64), np.array(counts, dtype=np.float64)
    cum = np.cumsum(arr_cnt) / arr_cnt.sum()
    result.pop("seconds")  # the stored trace is deterministic for a config and engine
    return {
        "source": "benchmarks.fragmentation_sim: RangeEngine under a chunked-prefill + decode trace",
        "engine_version": version(),
        "config": asdict(cfg),
        "range_length_blocks": {"lengths": lengths, "counts": counts},
        "summary": {
            "ranges_seen": int(arr_cnt.sum()),
            "range_blocks_mean": float((arr_len * arr_cnt).sum() / arr_cnt.sum()),
            "range_blocks_p10": float(arr_len[np.searchsorted(cum, 0.10)]),
            "range_blocks_median": float(arr_len[np.searchsorted(cum, 0.50)]),
            "range_blocks_p90": float(arr_len[np.searchsorted(cum, 0.90)]),
            "range_blocks_block_weighted_mean": float(
                (arr_len**2 * arr_cnt).sum() / (arr_len * arr_cnt).sum()
            ),
            "blocks_per_request_mean": float(np.mean(side.blocks_per_request)),
            **result,
        },
    }


def load_trace(policy: str = "headroom", path: str | Path | None = None) -> dict[str, Any]:
    """The stored trace of one placement policy (``fragmentation_trace.json`` holds one per policy)."""
    traces = json.loads(Path(path or DEFAULT_TRACE_PATH).read_text())["traces"]
    if policy not in traces:
        raise KeyError(f"no stored trace for policy {policy!r}; stored: {', '.join(traces)}")
    return traces[policy]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the GPU benchmark's fragmentation traces.")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=TraceConfig().seed)
    parser.add_argument("--out", type=Path, default=DEFAULT_TRACE_PATH)
    args = parser.parse_args(argv)
    traces = {p: run_trace(TraceConfig(policy=p, seed=args.seed)) for p in args.policies.split(",")}
    args.out.write_text(json.dumps({"traces": traces}, indent=None, separators=(",", ":")) + "\n")
    for policy, trace in traces.items():
        print(policy, json.dumps(trace["summary"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
