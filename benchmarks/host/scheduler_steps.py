"""Section scheduler: vLLM's real ``Scheduler`` in this process, paged against tagma, per engine step.

The in-server components (``tagma.probes.host_time_hooks``) split a step's scheduler CPU into the KV cache
manager, the rest of ``schedule()`` (``schedule_other``) and the rest of ``update_from_output()``
(``update_other``). In servers those parts carry a server lifetime's spread (10-20% here), and
``schedule_other``, the same vLLM code on both arms, came out 7-15% higher for tagma in some cells. This
section measures the same parts with the same wrappers where nothing but the scheduler runs: both arms'
schedulers (vLLM's ``Scheduler`` and ``TagmaScheduler``, the class ``--scheduler-cls`` names) are driven
through the same closed-loop workload by a stand-in model runner that samples one token per request that
finished its prompt, interleaved over ``repeats`` runs (ABAB...). Each request's block hasher is what its
engine core gives it: vLLM's (sha256) on the paged arm with caching on, none on tagma's prefix managers.

A run's steps must be the same on both arms (requests and tokens scheduled per step): the comparison is
then per identical step. Layouts: ``llama`` (one full-attention group) and the hybrid ``gpt-oss`` (a
128-token window group and a full group); ``caching`` on and off. Reported per busy step (us, thread CPU,
the timer's own cost subtracted): kv_manager (and its 99th percentile over the run's steps), schedule_other,
update_other, request_build (the requests' construction, where vLLM hashes the prompt, spread over the steps)
and engine_core (their sum), each with its ratio tagma / paged (median of the per-run ratios, with the runs'
spread).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from benchmarks.host import group_ops, manager_ops
from benchmarks.host.timing import pair_entry
from tagma.core.scheduler import TagmaScheduler
from tagma.probes import host_time_hooks as hooks
from tagma.probes.host_time import COLUMNS, measure_timer_overhead_ns

__all__ = [
    "PARTS", "build_scheduler", "drive", "engine_core_hashes", "make_requests", "measure", "per_step", "run",
]  # fmt: skip

SIDES = ("paged", "tagma")
PARTS = ("kv_manager", "kv_manager_p99", "schedule_other", "update_other", "request_build", "engine_core")
ENGINE_CORE_PARTS = ("kv_manager", "schedule_other", "update_other", "request_build")
SAMPLED_TOKEN = 7


CLOCK = hooks.SCHEDULER_CLOCK  # the process's clock, as in a server


def _vllm_config(model: str, w: dict[str, Any], block_size: int, caching: bool) -> VllmConfig:
    max_len = int(w["prompt_tokens"]) + int(w["output_tokens"]) + block_size
    model_config = ModelConfig(model=model, dtype="float32", seed=0, max_model_len=max_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=int(w["concurrency"]),
        max_num_batched_tokens=int(w["max_num_batched_tokens"]),
        max_model_len=max_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=caching)
    return VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config)


def build_scheduler(side: str, model: str, layout: str, w: dict[str, Any], block_size: int,
                    caching: bool) -> Scheduler:  # fmt: skip
    """One arm's scheduler over a pool that holds every request in flight (nothing is preempted)."""
    vllm_config = _vllm_config(model, w, block_size, caching)
    per_request = -(-vllm_config.model_config.max_model_len // block_size)
    groups = 1 if layout == "llama" else len(group_ops.LAYOUTS[layout])
    num_blocks = groups * per_request * int(w["concurrency"]) + 64
    kv_cache_config = (
        manager_ops.kv_cache_config(num_blocks, block_size)
        if layout == "llama"
        else group_ops.kv_cache_config(layout, num_blocks, block_size)
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    cls = Scheduler if side == "paged" else TagmaScheduler
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )
    hooks.instrument_kv_manager(scheduler.kv_cache_manager, CLOCK, hooks.kv_manager_methods(KVCacheManager))
    hooks.wrap_block_id_reads(CLOCK)  # the scheduler's reads of the returned blocks, as in a server
    return scheduler


def engine_core_hashes(scheduler: Scheduler) -> bool:
    """Whether this arm's engine core would give its requests vLLM's block hasher."""
    return (
        bool(scheduler.cache_config.enable_prefix_caching)
        and getattr(scheduler.kv_cache_manager, "uses_block_hashes", True) is not False
    )


def make_requests(w: dict[str, Any], block_size: int, hashed: bool, seed: int) -> tuple[list[Request], int]:
    """The workload's requests and the thread CPU ns their construction took: the engine core builds each
    request as it arrives, and vLLM's block hasher (``hashed``) hashes every full prompt block there, outside
    the scheduler's calls. The prompts (random token ids) are drawn before the clock starts."""
    rng = random.Random(seed)
    n, p, out_len = int(w["num_requests"]), int(w["prompt_tokens"]), int(w["output_tokens"])
    lengths = [rng.randint(max(1, p * 7 // 8), p) for _ in range(n)]
    prompts = [[rng.randrange(1000, 30000) for _ in range(length)] for length in lengths]
    out = []
    t0 = time.thread_time_ns()
    for i, tokens in enumerate(prompts):
        req = manager_ops.make_request(f"r{i}", tokens, block_size, hashed)
        req.sampling_params.max_tokens = req.max_tokens = out_len
        out.append(req)
    return out, time.thread_time_ns() - t0


def _model_output(scheduler: Scheduler, out: Any) -> ModelRunnerOutput:
    """One sampled token for each scheduled request whose prompt is done after this step."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = scheduler.requests[rid]
        sampled.append([SAMPLED_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def drive(scheduler: Scheduler, requests: list[Request], concurrency: int) -> list[tuple[int, ...]]:
    """Run the requests closed-loop (``concurrency`` in flight) to the end; the clock's rows per step."""
    rows: list[tuple[int, ...]] = []
    CLOCK.restart(SimpleNamespace(add=rows.append))
    pending = list(reversed(requests))
    in_flight = 0
    while pending and in_flight < concurrency:
        scheduler.add_request(pending.pop())
        in_flight += 1
    while in_flight:
        out = scheduler.schedule()
        result = scheduler.update_from_output(out, _model_output(scheduler, out))
        for outputs in result.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    in_flight -= 1
                    if pending:
                        scheduler.add_request(pending.pop())
                        in_flight += 1
    return rows


def per_step(rows: list[tuple[int, ...]], overhead_ns: int, build_ns: int = 0) -> dict[str, Any]:
    """Mean us per busy step of each part (timer cost subtracted per timed call), the requests' construction
    spread over the steps, their sum (the engine core's scheduling CPU), and the step shapes."""
    busy = [dict(zip(COLUMNS["scheduler"], r, strict=True)) for r in rows]
    busy = [r for r in busy if r["num_reqs"] > 0]
    if not busy:
        raise RuntimeError("the scheduler made no busy step")
    kv = [
        r["kv_manager_ns"] + r["update_kv_manager_ns"] + r["outside_kv_manager_ns"]
        - overhead_ns * (r["kv_calls"] + r["update_kv_calls"] + r["outside_kv_calls"])
        for r in busy
    ]  # fmt: skip
    out: dict[str, Any] = {
        "kv_manager": statistics.fmean(kv) / 1e3,
        "kv_manager_p99": float(np.percentile(kv, 99)) / 1e3,
        # an enclosing interval holds both reads of every timed call in it (harness.analysis.host_time)
        "schedule_other": statistics.fmean(r["schedule_other_ns"] - overhead_ns * (r["kv_calls"] + 1)
                                           for r in busy) / 1e3,
        "update_other": statistics.fmean(r["update_other_ns"] - overhead_ns * (r["update_kv_calls"] + 1)
                                         for r in busy) / 1e3,
        "request_build": build_ns / len(busy) / 1e3,
        "steps": len(busy),
        "shape": [(r["num_reqs"], r["num_tokens"]) for r in busy],
    }  # fmt: skip
    out["engine_core"] = sum(out[k] for k in ENGINE_CORE_PARTS)
    return out


def measure(model: str, layout: str, w: dict[str, Any], block_size: int, caching: bool, repeats: int,
            seed: int) -> dict[str, Any]:  # fmt: skip
    """Both arms, ``repeats`` runs each interleaved (a fresh scheduler per run), per-step parts compared."""
    overhead = measure_timer_overhead_ns()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    classes: dict[str, str] = {}
    for rep in range(repeats + 1):  # run 0 of each arm warms up and is dropped
        for side in SIDES if rep % 2 == 0 else reversed(SIDES):
            scheduler = build_scheduler(side, model, layout, w, block_size, caching)
            classes[side] = type(scheduler.kv_cache_manager).__name__
            requests, build_ns = make_requests(w, block_size, engine_core_hashes(scheduler), seed)
            gc.collect()
            gc.freeze()
            try:
                rows = drive(scheduler, requests, int(w["concurrency"]))
            finally:
                gc.unfreeze()
            if rep:
                runs[side].append(per_step(rows, overhead, build_ns))
    same = all(p["shape"] == t["shape"] for p, t in zip(runs["paged"], runs["tagma"], strict=True))
    entry: dict[str, Any] = {
        "layout": layout, "caching": caching, "block_size": block_size, **w, "repeats": repeats,
        "managers": classes, "same_steps": same, "steps": runs["paged"][0]["steps"],
        "timer_overhead_ns": overhead,
    }  # fmt: skip
    for part in PARTS:
        entry[part] = pair_entry(
            [r[part] for r in runs["paged"]], [r[part] for r in runs["tagma"]], "us/step"
        )
    return entry


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every configured (layout, caching, block size, workload) cell."""
    sc = cfg["scheduler"]
    model = str(Path(cfg["repo_dir"]) / "data" / "tiny-llama")
    hooks.wrap_scheduler_class(Scheduler, CLOCK)
    entries = []
    started = time.perf_counter()
    for layout in sc["layouts"]:
        for caching in sc["caching"]:
            for block_size in sc["block_sizes"]:
                for w in sc["workloads"]:
                    entries.append(measure(model, layout, dict(w), int(block_size), bool(caching),
                                           int(sc["repeats"]), int(cfg["seed"])))  # fmt: skip
    return {
        "parts": list(PARTS),
        "entries": entries,
        "same_steps": all(e["same_steps"] for e in entries),
        "wall_s": time.perf_counter() - started,
    }

