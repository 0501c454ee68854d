"""Range lengths of the tagma engine under a concurrent serving trace: the fragmented placement's source.

The trace drives a :class:`tagma.engine.RangeEngine` the way vLLM's scheduler drives the KV cache manager
(no prefix caching): requests arrive with long prompts (log-uniform between ``prompt_min`` and
``prompt_max`` tokens) and ``output_min``-``output_max`` output tokens; every step has a budget of
``step_tokens`` tokens (``max_num_batched_tokens``), spent first on the running requests in arrival order
(one token per decoding request, a chunk of the prompt per prefilling one: chunked prefill), then on
admitting waiting requests; a request is admitted only while the blocks it will need at its end still fit
(so there is no preemption), at most ``max_running`` at once; a request releases its blocks when it has
written prompt + output tokens. Every ``snapshot_every`` steps after ``warmup_requests`` completions, the
ranges of every live request are recorded. The result, a histogram of range lengths (in blocks, one count
per range seen), is what :func:`benchmarks.gpu.placement.fragmented` samples from.

``python -m benchmarks.fragmentation_sim`` regenerates ``fragmentation_trace.json``: one trace per placement
policy (headroom, the manager's default; best_fit; first_fit), deterministic for a config and engine.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_TRACE_PATH", "POLICIES", "TraceConfig", "load_trace", "run_trace"]

DEFAULT_TRACE_PATH = Path(__file__).parent / "gpu" / "fragmentation_trace.json"


@dataclass(frozen=True, slots=True)
class TraceConfig:
    num_blocks: int = 65536  # 1M tokens of 16: an 8B model's KV cache on an 80-140 GB GPU
    block_size: int = 16
    policy: str = "headroom"  # the manager's default placement policy
    num_requests: int = 400
    max_running: int = 64
    step_tokens: int = 8192
    prompt_min: int = 2048
    prompt_max: int = 131072
    output_min: int = 128
    output_max: int = 1024
    warmup_requests: int = 40
    snapshot_every: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.prompt_min <= self.prompt_max or not 0 < self.output_min <= self.output_max:
            raise ValueError("prompt and output lengths need 0 < min <= max")
        need = math.ceil((self.prompt_max + self.output_max) / self.block_size)
        if need > self.num_blocks - 1:
            raise ValueError(f"a {need}-block request cannot fit in {self.num_blocks - 1} usable blocks")
        if self.warmup_requests >= self.num_requests:
            raise ValueError("warmup_requests must be below num_requests")


@dataclass(slots=True)
class _Request:
    engine_id: int
    prompt: int
    total: int
    need_blocks: int
    written: int = 0
    blocks: int = 0


@dataclass(slots=True)
class _Recorder:
    lengths: Counter[int] = field(default_factory=Counter)
    ranges_per_request: list[int] = field(default_factory=list)
    blocks_per_request: list[int] = field(default_factory=list)
    external_fragmentation: list[float] = field(default_factory=list)
    snapshots: int = 0


def run_trace(config: TraceConfig | None = None) -> dict[str, Any]:
    """Run the trace and return its JSON-ready record (config, histogram, summary)."""
    from tagma.engine import RangeEngine, version

    cfg = config or TraceConfig()
    rng = np.random.default_rng(cfg.seed)
    prompts = np.exp(rng.uniform(math.log(cfg.prompt_min), math.log(cfg.prompt_max), cfg.num_requests))
    outputs = rng.integers(cfg.output_min, cfg.output_max + 1, cfg.num_requests)
    bs = cfg.block_size
    usable = cfg.num_blocks - 1
    rec = _Recorder()
    with RangeEngine(cfg.num_blocks, policy=cfg.policy) as engine:

        def write(req: _Request, tokens: int) -> None:
            req.written += tokens
            need = -(-req.written // bs)
            if need > req.blocks:
                engine.append(req.engine_id, need - req.blocks)
                req.blocks = need

        waiting = deque(range(cfg.num_requests))
        running: list[_Request] = []
        committed = completed = step = 0
        while completed < cfg.num_requests:
            budget = cfg.step_tokens
            for req in running:
                tokens = min(req.prompt - req.written, budget) if req.written < req.prompt else min(1, budget)
                if tokens:
                    write(req, tokens)
                    budget -= tokens
            while waiting and len(running) < cfg.max_running and budget > 0:
                i = waiting[0]
                prompt, total = int(prompts[i]), int(prompts[i]) + int(outputs[i])
                need = -(-total // bs)
                if committed + need > usable:
                    break
                waiting.popleft()
                req = _Request(engine.create_request(), prompt, total, need)
                committed += need
                running.append(req)
                tokens = min(prompt, budget)
                write(req, tokens)
                budget -= tokens
            if completed >= cfg.warmup_requests and step % cfg.snapshot_every == 0:
                _snapshot(engine, running, rec)
            for req in [r for r in running if r.written >= r.total]:
                engine.release(req.engine_id)
                committed -= req.need_blocks
                completed += 1
            running = [r for r in running if r.written < r.total]
            step += 1
        stats = engine.stats()
    lengths = sorted(rec.lengths)
    counts = [rec.lengths[n] for n in lengths]
    arr_len, arr_cnt = np.array(lengths, dtype=np.float64), np.array(counts, dtype=np.float64)
    cum = np.cumsum(arr_cnt) / arr_cnt.sum()
    return {
        "source": "benchmarks.fragmentation_sim: RangeEngine, concurrent chunked-prefill + decode trace",
        "engine_version": version(),
        "config": asdict(cfg),
        "steps": step,
        "range_length_blocks": {"lengths": lengths, "counts": counts},
        "summary": {
            "snapshots": rec.snapshots,
            "ranges_seen": int(arr_cnt.sum()),
            "range_blocks_mean": float((arr_len * arr_cnt).sum() / arr_cnt.sum()),
            "range_blocks_p10": float(arr_len[np.searchsorted(cum, 0.10)]),
            "range_blocks_median": float(arr_len[np.searchsorted(cum, 0.50)]),
            "range_blocks_p90": float(arr_len[np.searchsorted(cum, 0.90)]),
            "range_blocks_block_weighted_mean": float(
                (arr_len**2 * arr_cnt).sum() / (arr_len * arr_cnt).sum()
            ),
            "ranges_per_request_mean": float(np.mean(rec.ranges_per_request)),
            "ranges_per_request_max": int(np.max(rec.ranges_per_request)),
            "blocks_per_request_mean": float(np.mean(rec.blocks_per_request)),
            "external_fragmentation_mean": float(np.mean(rec.external_fragmentation)),
            "engine_new_ranges": stats.new_ranges,
            "engine_in_place_growths": stats.in_place_growths,
            "engine_merges": stats.merges,
        },
    }


def _snapshot(engine: Any, running: list[_Request], rec: _Recorder) -> None:
    live = [r for r in running if r.blocks]
    if not live:
        return
    rec.snapshots += 1
    for req in live:
        ranges = engine.ranges_array(req.engine_id)
        rec.lengths.update(ranges[:, 1].tolist())
        rec.ranges_per_request.append(int(ranges.shape[0]))
        rec.blocks_per_request.append(req.blocks)
    rec.external_fragmentation.append(engine.stats().external_fragmentation)


POLICIES = ("headroom", "best_fit", "first_fit")


def load_trace(policy: str = "headroom", path: str | Path | None = None) -> dict[str, Any]:
    """The stored trace of one placement policy (``fragmentation_trace.json`` holds one per policy)."""
    traces = json.loads(Path(path or DEFAULT_TRACE_PATH).read_text())["traces"]
    if policy not in traces:
        raise KeyError(f"no stored trace for policy {policy!r}; stored: {', '.join(traces)}")
    return traces[policy]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
