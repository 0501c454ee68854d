"""Section trace_replay: a request trace with prefix sharing through vLLM's KV cache manager and tagma's.

The trace is a JSONL file of Mooncake records (:mod:`harness.workload.trace_file`; by default the shipped
FAST'25 conversation trace): arrival time, prompt and output lengths, and one hash id per 512-token block of
the prompt. Each side is one manager built from the same ``KVCacheConfig`` (``pool_blocks`` blocks of
``block_size`` tokens, one full-attention group, prefix caching on): vLLM's own ``KVCacheManager`` and
``TagmaKVCacheManager(...)`` (the factory: whichever manager tagma builds with caching on), in one process,
stepped alternately (A B, B A, ...) on one simulated clock. ``tagma_variants`` adds tagma managers built with
extra factory arguments (e.g. ``prefix_eviction: contiguous``, the opt-in contiguity-aware eviction of the
prefix-index manager, against its default exact LRU: ``eviction_cost_points`` is what the non-LRU side gives
up in hit rate); a variant whose arguments this tagma's factory does not take is skipped, with the reason
recorded. ``family`` (when enabled) replays the generated trace family of
:mod:`benchmarks.host.trace_family_replay` at pools 0.25x-2x of each trace's working set and reports the
worst case of every tagma side against vLLM's exact LRU under the eviction bound.

Prompts: every hash id ``h`` stands for 512 deterministic token ids (the first is ``2**20 + h``, so ids that
differ give blocks that differ; the rest are small ids derived from ``h``); a prompt is its hash ids' tokens
in order, cut at ``input_length`` (the last trace block partial). Equal leading hash ids therefore give equal
leading engine blocks (512 / block_size of them per trace block), and vLLM's chain hash (sha256, the
scheduler's default) sees exactly the trace's sharing. Output tokens are fresh per request (never shared).

The scheduler model is vLLM's, simplified to one step of simulated time (``step_ms``):
1. requests whose (windowed, scaled) arrival time has come join the waiting queue, in arrival order;
2. running requests first, in admission order, within ``max_num_batched_tokens``: a prefilling request
   gets its next chunk (chunked prefill), a decoding one ``decode_tokens_per_step`` tokens (one
   ``allocate_slots`` call for them, as a multi-token step; ``block_size`` by default, so every decode step
   crosses one block boundary). When ``allocate_slots`` fails, the last running request is preempted
   (``free``, status PREEMPTED, computed tokens reset, back to the front of the waiting queue; its outputs
   stay part of its tokens), until the call succeeds or the request preempted itself;
3. if nothing was preempted in the step, waiting requests are admitted in order while
   ``max_num_seqs`` and the token budget allow: ``get_computed_blocks`` then ``allocate_slots(req, n, hit,
   computed)`` (the admission, timed); a refusal stops admission for the step;
4. computed tokens advance; a prefill that reached the prompt's end and every decode step append sampled
   tokens (which hashes new full blocks, as vLLM does); a request that has produced
   ``min(output_length, max_output_tokens)`` tokens is freed (``free``, timed) after its block ids are read.
When nothing runs or waits on either side, the clock jumps to the next arrival.

Measured per side: prefix hit rate (tokens found cached at a request's first admission / its prompt tokens;
re-admissions after preemption separately), admission cost (``get_computed_blocks`` + ``allocate_slots`` of
every successful admission, wall ns per request and per prompt token; refused attempts counted apart), the
cost of building each request (vLLM's ``Request``, whose constructor hashes the prompt's blocks unless the
manager says ``uses_block_hashes = False``, as tagma's scheduler then builds them), ``free`` cost, ranges
per request at completion (runs of consecutive block ids in the request's block table, for every side),
preemptions. With ``vllm_fast_hash`` set (xxhash by default in configs/host_bench.yaml) one more vLLM
side, ``paged_xxhash``, is vLLM's manager whose requests hash with that algorithm
(``--prefix-caching-hash-algo``): its request build is vLLM's cheapest, and its hits must equal sha256's
(``same_hits_per_request_vs_paged``). Every side's NONE_HASH is vLLM's for its algorithm
(:mod:`benchmarks.host.hashing`), put in place before the side's step. ``infinite_pool_hit_rate`` is
the trace's reuse bound at this block size: the share of prompt tokens whose blocks an earlier request
already held; ``hits_over_reuse_bound`` counts a side's requests whose hit exceeds their own bound (a wrong
hit; 0 expected).
The time cost of a step (the model's forward pass) is not modelled beyond ``step_ms``.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.request import Request, RequestStatus

from benchmarks.host import hashing
from benchmarks.host.manager_ops import kv_cache_config
from benchmarks.host.trace_jobs import (
    OUTPUT_TOKEN_BASE,
    Job,
    ReplayConfig,
    jobs_from_records,
    prompt_tokens,
    reuse_bound,
    select_records,
)
from harness.workload import trace_file
from tagma.core.registry import build_kv_cache_manager as TagmaKVCacheManager

__all__ = ["Side", "eviction_cost", "replay", "run", "runs_of_ids"]

init_none_hash(sha256)


def runs_of_ids(ids: Sequence[int]) -> int:
    """Runs of consecutive block ids (what a range descriptor of the block table would need)."""
    if not ids:
        return 0
    arr = np.asarray(ids, dtype=np.int64)
    return 1 + int(np.count_nonzero(np.diff(arr) != 1))


def uses_block_hashes(manager: KVCacheManager) -> bool:
    """Whether requests for ``manager`` need vLLM's per-request block hashes (its prefix-cache keys).

    A manager that keys its prefix cache otherwise says so with a false ``uses_block_hashes`` attribute;
    vLLM's manager and tagma's block-object manager read ``request.block_hashes``.
    """
    return bool(getattr(manager, "uses_block_hashes", True))


@dataclass
class Live:
    job: Job
    request: Request | None = None
    prefill_end: int = 0  # tokens to compute before the next sampled token (set at admission)
    first_hit: int | None = None


@dataclass
class SideStats:
    admitted: int = 0
    readmitted: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    readmit_tokens: int = 0
    readmit_hit_tokens: int = 0
    preemptions: int = 0
    refused_admissions: int = 0
    refused_admission_ns: int = 0
    finished: int = 0
    admission_ns: list[int] = field(default_factory=list)  # successful first admissions
    admission_tokens: list[int] = field(default_factory=list)
    readmission_ns: list[int] = field(default_factory=list)
    build_ns: list[int] = field(default_factory=list)
    free_ns: list[int] = field(default_factory=list)
    running_allocate_ns: int = 0
    running_allocate_calls: int = 0
    ranges: list[int] = field(default_factory=list)
    hits: dict[int, int] = field(default_factory=dict)  # job index -> tokens hit at its first admission


class Side:
    """One manager under the scheduler model."""

    def __init__(
        self,
        name: str,
        manager: KVCacheManager,
        cfg: ReplayConfig,
        jobs: Sequence[Job],
        hash_algo: str = hashing.DEFAULT,
    ) -> None:
        self.name = name
        self.hash_algo = hash_algo
        self.manager = manager
        self.cfg = cfg
        self.pending: deque[Job] = deque(jobs)
        self.waiting: deque[Live] = deque()
        self.running: list[Live] = []
        self.stats = SideStats()
        self.hasher = hashing.block_hasher(cfg.block_size, hash_algo) if uses_block_hashes(manager) else None
        self.params = SamplingParams(max_tokens=1 << 20)
        self.params.update_from_generation_config({}, eos_token_id=OUTPUT_TOKEN_BASE - 1)

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.running)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running)

    def next_arrival(self) -> float | None:
        return self.pending[0].arrival_ms if self.pending else None

    def _build(self, live: Live) -> Request:
        tokens = prompt_tokens(live.job.record, self.cfg.hash_block_tokens)
        t0 = time.perf_counter_ns()
        req = Request(
            request_id=f"r{live.job.index}",
            prompt_token_ids=tokens,
            sampling_params=self.params,
            pooling_params=None,
            arrival_time=live.job.arrival_ms / 1000.0,
            block_hasher=self.hasher,
        )
        self.stats.build_ns.append(time.perf_counter_ns() - t0)
        return req

    def _preempt(self, victim: Live) -> None:
        req = victim.request
        assert req is not None
        self.manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1

    def _finish(self, live: Live) -> None:
        req = live.request
        assert req is not None
        ids = self.manager.get_block_ids(req.request_id)[0]
        self.stats.ranges.append(runs_of_ids(ids))
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        t0 = time.perf_counter_ns()
        self.manager.free(req)
        self.stats.free_ns.append(time.perf_counter_ns() - t0)
        live.request = None
        self.stats.finished += 1

    def step(self, now_ms: float) -> None:
        cfg, mgr, st = self.cfg, self.manager, self.stats
        while self.pending and self.pending[0].arrival_ms <= now_ms:
            self.waiting.append(Live(self.pending.popleft()))
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Live, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            live = self.running[i]
            req = live.request
            assert req is not None
            if req.num_computed_tokens < live.prefill_end:
                n = min(live.prefill_end - req.num_computed_tokens, budget)
            else:
                n = min(cfg.decode_tokens, budget, live.job.output_tokens - req.num_output_tokens)
            while True:
                t0 = time.perf_counter_ns()
                new = mgr.allocate_slots(req, n)
                st.running_allocate_ns += time.perf_counter_ns() - t0
                st.running_allocate_calls += 1
                if new is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            if new is None:
                break
            scheduled.append((live, n))
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                live = self.waiting[0]
                if live.request is None:
                    live.request = self._build(live)
                req = live.request
                t0 = time.perf_counter_ns()
                computed, hit, *_ = mgr.get_computed_blocks(req)
                n = min(req.num_tokens - hit, budget)
                new = mgr.allocate_slots(req, n, hit, computed, has_scheduled_reqs=bool(self.running))
                ns = time.perf_counter_ns() - t0
                if new is None:
                    st.refused_admissions += 1
                    st.refused_admission_ns += ns
                    break
                self.waiting.popleft()
                if live.first_hit is None:
                    live.first_hit = hit
                    st.admitted += 1
                    st.prompt_tokens += req.num_tokens
                    st.hit_tokens += hit
                    st.hits[live.job.index] = hit
                    st.admission_ns.append(ns)
                    st.admission_tokens.append(req.num_tokens)
                else:
                    st.readmitted += 1
                    st.readmit_tokens += req.num_tokens
                    st.readmit_hit_tokens += hit
                    st.readmission_ns.append(ns)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = hit
                live.prefill_end = req.num_tokens
                self.running.append(live)
                scheduled.append((live, n))
                budget -= n
        # after the step: computed tokens advance, sampled tokens arrive, finished requests leave
        finished: list[Live] = []
        for live, n in scheduled:
            req = live.request
            assert req is not None
            before = req.num_computed_tokens
            req.num_computed_tokens += n
            if before < live.prefill_end:
                if req.num_computed_tokens < live.prefill_end:
                    continue  # a chunk in the middle of the prefill samples nothing
                new_tokens = 1
            else:
                new_tokens = n
            req.append_output_token_ids([OUTPUT_TOKEN_BASE + live.job.index] * new_tokens)
            if req.num_output_tokens >= live.job.output_tokens:
                finished.append(live)
        for live in finished:
            self.running.remove(live)
            self._finish(live)


def _summary(values: Sequence[float]) -> dict[str, float] | None:
    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
        "count": len(a),
    }


def side_result(side: Side) -> dict[str, Any]:
    st = side.stats
    adm = np.asarray(st.admission_ns, dtype=np.float64)
    toks = np.asarray(st.admission_tokens, dtype=np.float64)
    build = np.asarray(st.build_ns, dtype=np.float64)
    return {
        "manager_class": type(side.manager).__name__,
        "prefix_eviction": getattr(side.manager, "prefix_eviction", None),
        "request_block_hashes": side.hasher is not None,
        "hash_algo": side.hash_algo if side.hasher is not None else None,
        "admitted": st.admitted,
        "finished": st.finished,
        "prompt_tokens": st.prompt_tokens,
        "hit_tokens": st.hit_tokens,
        "hit_rate": st.hit_tokens / st.prompt_tokens if st.prompt_tokens else None,
        "readmissions": st.readmitted,
        "readmission_hit_rate": st.readmit_hit_tokens / st.readmit_tokens if st.readmit_tokens else None,
        "preemptions": st.preemptions,
        "refused_admissions": st.refused_admissions,
        "refused_admission_ms_total": st.refused_admission_ns / 1e6,
        "admission_us": _summary(adm / 1e3) if len(adm) else None,
        "admission_ns_per_prompt_token": float(adm.sum() / toks.sum()) if len(adm) else None,
        "request_build_us": _summary(build / 1e3) if len(build) else None,
        "request_build_ns_per_prompt_token": float(build.sum() / sum(st.admission_tokens))
        if st.admission_tokens and len(build)
        else None,
        "admission_with_build_us_mean": float((adm.sum() + build.sum()) / len(adm) / 1e3)
        if len(adm)
        else None,
        "readmission_us": _summary(np.asarray(st.readmission_ns, dtype=np.float64) / 1e3)
        if st.readmission_ns
        else None,
        "free_us": _summary(np.asarray(st.free_ns, dtype=np.float64) / 1e3) if st.free_ns else None,
        "running_allocate_us_mean": st.running_allocate_ns / st.running_allocate_calls / 1e3
        if st.running_allocate_calls
        else None,
        "running_allocate_calls": st.running_allocate_calls,
        "ranges_per_request": _summary(st.ranges),
    }


def replay(
    jobs: Sequence[Job],
    cfg: ReplayConfig,
    managers: dict[str, KVCacheManager] | None = None,
    progress: Callable[[int, float], None] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    hash_sides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Replay ``jobs`` through every manager (built from ``cfg``, ``variants`` and ``hash_sides`` unless
    given).

    ``managers`` maps side names to managers; it must hold ``paged`` and ``tagma``. ``hash_sides`` maps
    side names to a vLLM hash algorithm (``prefix_caching_hash_algo``): each is one more vLLM manager whose
    requests hash with it (the others hash with sha256). Returns a JSON-ready result whose ``sides`` follow
    the managers' order.
    """
    hash_sides = dict(hash_sides or {})
    if not jobs:
        raise ValueError("no request to replay")
    max_len = max(j.record.input_length + j.output_tokens for j in jobs) + cfg.decode_tokens + cfg.block_size
    skipped: dict[str, str] = {}
    if managers is None:
        managers, skipped = build_managers(cfg, max_len, variants, list(hash_sides))
    sides = [
        Side(name, manager, cfg, jobs, hash_sides.get(name, hashing.DEFAULT))
        for name, manager in managers.items()
    ]
    now = min(j.arrival_ms for j in jobs)
    steps = 0
    gc.collect()
    gc.freeze()  # the managers' long-lived objects: the periodic collections below skip them
    was_enabled = gc.isenabled()
    gc.disable()  # no collection inside a timed call; requests' reference cycles are collected between steps
    start = time.perf_counter()
    try:
        while not all(s.done for s in sides):
            if all(s.idle for s in sides):
                arrivals = [a for a in (s.next_arrival() for s in sides) if a is not None]
                now = max(now, min(arrivals))
            for side in sides if steps % 2 == 0 else reversed(sides):
                hashing.set_active(side.hash_algo)  # the NONE_HASH its requests chain onto, untimed
                side.step(now)
            steps += 1
            now += cfg.step_ms
            if steps % cfg.gc_every_steps == 0:
                gc.collect()
                if progress is not None:
                    progress(steps, now)
    finally:
        hashing.set_active(hashing.DEFAULT)
        if was_enabled:
            gc.enable()
        gc.unfreeze()
    elapsed = time.perf_counter() - start
    results = {s.name: side_result(s) for s in sides}
    bounds = reuse_bound(jobs, cfg.block_size, cfg.hash_block_tokens)
    hit, prompt = sum(bounds), sum(j.record.input_length for j in jobs)
    hits = {s.name: s.stats.hits for s in sides}
    for s in sides:  # a hit no earlier prompt could have given is a wrong hit
        results[s.name]["hits_over_reuse_bound"] = sum(
            1 for job, bound in zip(jobs, bounds, strict=True) if hits[s.name].get(job.index, 0) > bound
        )
    points = {name: _points(results[name], results["paged"]) for name in results if name != "paged"}
    out: dict[str, Any] = {
        "config": asdict(cfg),
        "max_model_len": max_len,
        "requests": len(jobs),
        "prompt_tokens": prompt,
        "steps": steps,
        "simulated_s": round((now - min(j.arrival_ms for j in jobs)) / 1000.0, 3),
        "seconds": round(elapsed, 2),
        "infinite_pool_hit_rate": hit / prompt if prompt else None,
        "sides": results,
        "variants_skipped": skipped,
        "hit_rate_points_tagma_minus_paged": points["tagma"],
        "hit_rate_points_vs_paged": points,
        "same_hits_per_request": hits["paged"] == hits["tagma"],
        "same_hits_per_request_vs_paged": {n: hits[n] == hits["paged"] for n in hits if n != "paged"},
        "eviction_cost_points": eviction_cost(results),
        "fast_hash": {name: fast_hash_result(results, name, algo) for name, algo in hash_sides.items()},
    }
    return out


def fast_hash_result(results: dict[str, dict[str, Any]], name: str, algo: str) -> dict[str, Any]:
    """A vLLM side hashing with ``algo`` against vLLM with sha256 and tagma: request build and admission
    (per request, mean) and tagma's ratios against both vLLM sides."""
    fast, paged, tagma = results[name], results["paged"], results["tagma"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    build = {k: (r["request_build_us"] or {}).get("mean") for k, r in (("paged", paged), (name, fast))}
    with_build = {k: r["admission_with_build_us_mean"] for k, r in (("paged", paged), ("tagma", tagma),
                                                                      (name, fast))}  # fmt: skip
    return {
        "algo": algo,
        "none_hash_seed": hashing.seed_source(algo),
        "request_build_us_mean": build,
        "request_build_ns_per_prompt_token": {
            "paged": paged["request_build_ns_per_prompt_token"],
            name: fast["request_build_ns_per_prompt_token"],
        },
        "admission_with_build_us_mean": with_build,
        "fast/paged_request_build": ratio(build[name], build["paged"]),
        "tagma/paged_admission_with_build": ratio(with_build["tagma"], with_build["paged"]),
        "tagma/fast_admission_with_build": ratio(with_build["tagma"], with_build[name]),
        "same_hits_as_sha256": fast["hit_tokens"] == paged["hit_tokens"],
    }


def _points(side: dict[str, Any], paged: dict[str, Any]) -> float | None:
    if side["hit_rate"] is None or paged["hit_rate"] is None:
        return None
    return 100.0 * (side["hit_rate"] - paged["hit_rate"])


def eviction_cost(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Hit rate (points) a tagma side with a non-LRU eviction (the default's, else a variant's) gives up
    against a tagma side with exact LRU (the default's, else a variant's), when both ran."""
    tagma = results.get("tagma")
    if tagma is None:
        return None
    tagma_sides = [n for n in results if n != "paged"]  # "tagma" first, then the variants in order
    lru = next((n for n in tagma_sides if results[n].get("prefix_eviction") == "lru"), None)
    other = next((n for n in tagma_sides if results[n].get("prefix_eviction") not in (None, "lru")), None)
    if lru is None or other is None:
        return None
    return {
        "default": tagma.get("prefix_eviction"),
        "side": other,
        "eviction": results[other]["prefix_eviction"],
        "lru_side": lru,
        "points_below_lru": _points(results[lru], results[other]),
    }


def build_managers(
    cfg: ReplayConfig,
    max_model_len: int,
    variants: dict[str, dict[str, Any]] | None = None,
    vllm_sides: Sequence[str] = (),
) -> tuple[dict[str, KVCacheManager], dict[str, str]]:
    """vLLM's manager, tagma's (through the factory), one tagma manager per variant (name -> extra
    keyword arguments of ``TagmaKVCacheManager(...)``) and one more vLLM manager per name in
    ``vllm_sides``, caching on, as vLLM's scheduler builds them.

    Returns (managers, variants skipped with the reason: the factory refused their arguments).
    """
    config = kv_cache_config(cfg.pool_blocks, cfg.block_size)
    kwargs: dict[str, Any] = {
        "max_model_len": max_model_len,
        "scheduler_block_size": cfg.block_size,
        "hash_block_size": cfg.block_size,
        "enable_caching": True,
        "log_stats": True,
    }
    managers: dict[str, KVCacheManager] = {
        "paged": KVCacheManager(config, **kwargs),
        "tagma": TagmaKVCacheManager(config, placement_policy=cfg.policy, **kwargs),
    }
    for name in vllm_sides:
        if name in managers:
            raise ValueError(f"side name {name!r} is taken")
        managers[name] = KVCacheManager(config, **kwargs)
    skipped: dict[str, str] = {}
    for name, extra in (variants or {}).items():
        if name in managers:
            raise ValueError(f"variant name {name!r} is taken")
        try:
            managers[name] = TagmaKVCacheManager(config, placement_policy=cfg.policy, **kwargs, **extra)
        except TypeError as exc:  # this tagma's factory does not take the variant's arguments
            skipped[name] = f"{type(exc).__name__}: {exc}"
    return managers, skipped


def replay_settings(cfg: dict[str, Any]) -> tuple[ReplayConfig, dict[str, dict[str, Any]]]:
    """The section's replay config and its tagma variants (name -> extra factory arguments)."""
    tcfg = cfg["trace_replay"]
    hash_block = int(tcfg.get("hash_block_tokens") or trace_file.DEFAULT_HASH_BLOCK_TOKENS)
    rcfg = ReplayConfig(
        pool_blocks=int(tcfg["pool_blocks"]),
        block_size=int(cfg["block_size"]),
        hash_block_tokens=hash_block,
        max_num_seqs=int(tcfg["max_num_seqs"]),
        max_num_batched_tokens=int(tcfg["max_num_batched_tokens"]),
        decode_tokens_per_step=tcfg.get("decode_tokens_per_step"),
        step_ms=float(tcfg["step_ms"]),
        max_output_tokens=tcfg.get("max_output_tokens"),
        policy=str(tcfg.get("policy") or cfg["manager"]["policy"]),
    )
    variants = {str(k): dict(v) for k, v in (tcfg.get("tagma_variants") or {}).items()}
    return rcfg, variants


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The section: load the configured trace (the shipped one by default), window it, replay it."""
    import logging

    log = logging.getLogger("benchmarks.host")
    tcfg = cfg["trace_replay"]
    hash_block = int(tcfg.get("hash_block_tokens") or trace_file.DEFAULT_HASH_BLOCK_TOKENS)
    trace = trace_file.load(cfg.get("trace") or None, hash_block_tokens=hash_block)
    records, selection = select_records(trace, tcfg)
    rcfg, variants = replay_settings(cfg)
    jobs, too_large = jobs_from_records(records, rcfg)
    selection["too_large_for_pool"] = too_large
    log.info(
        "trace_replay: %d requests of %s, pool %d blocks", len(jobs), trace.provenance.path, rcfg.pool_blocks
    )

    def progress(steps: int, now: float) -> None:
        if steps % (cfg["trace_replay"].get("log_every_steps") or 4096) == 0:
            log.info("trace_replay: step %d, simulated %.0f s", steps, now / 1000.0)

    fast = cfg.get("vllm_fast_hash")
    unavailable = hashing.available(str(fast)) if fast else None
    if unavailable:
        log.warning("trace_replay: no %s side: %s", fast, unavailable)
    use_fast = fast and not unavailable and fast != hashing.DEFAULT
    hash_sides = {hashing.side_name(str(fast)): str(fast)} if use_fast else {}
    out = replay(jobs, rcfg, progress=progress, variants=variants, hash_sides=hash_sides)
    result = {
        "description": __doc__,
        "trace": trace.provenance.as_dict(),
        "selection": selection,
        **out,
    }
    return result
