"""The eviction bound over a family of generated traces (:mod:`benchmarks.host.trace_family`).

Every member of the family is replayed (:func:`benchmarks.host.trace_replay.replay`) at pool sizes that are
factors (0.25x to 2x by default) of its working set, the distinct engine blocks it touches
(:func:`~benchmarks.host.trace_family.working_set_blocks`; a pool is never smaller than the largest request
needs). Sides: vLLM's ``KVCacheManager`` (``paged``, whose eviction is exact LRU: the reference), tagma's
default (``tagma``) and the configured variants (e.g. ``tagma_lru``, ``tagma_contiguous``).

The bound (:func:`bound`), for a policy against exact LRU on one trace and pool: it loses at most
``max(0.5 point, 5% of exact LRU's hit rate)`` of prefix hit rate, and its missed prompt tokens (the prefill
it causes) are at most 5% above exact LRU's. :func:`run_family` reports, per side and pool factor, the worst
case over the family (the largest share of the allowed loss used) and whether every point met the bound.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.host import trace_family, trace_replay
from benchmarks.host.trace_jobs import ReplayConfig, jobs_from_records
from benchmarks.host.trace_replay import replay

__all__ = [
    "DEFAULT_FACTORS",
    "HIT_POINTS_FLOOR",
    "HIT_SHARE",
    "MISSED_EXCESS",
    "bound",
    "pool_for",
    "replay_point",
    "run_family",
    "worst_cases",
]

DEFAULT_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
HIT_POINTS_FLOOR = 0.5  # points of hit rate a policy may lose...
HIT_SHARE = 0.05  # ...or this share of exact LRU's hit rate, whichever is larger
MISSED_EXCESS = 0.05  # its missed prompt tokens at most this much above exact LRU's
REFERENCE = "paged"  # vLLM's manager: exact LRU


def bound(side: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Whether ``side`` (a replay's side result) keeps the bound against ``reference`` (exact LRU)."""
    prompt = side["prompt_tokens"]
    if prompt != reference["prompt_tokens"]:
        raise ValueError("the sides replayed different prompts")
    ref_rate, rate = 100.0 * reference["hit_rate"], 100.0 * side["hit_rate"]
    allowed = max(HIT_POINTS_FLOOR, HIT_SHARE * ref_rate)
    loss = ref_rate - rate
    ref_missed, missed = prompt - reference["hit_tokens"], prompt - side["hit_tokens"]
    excess = (missed - ref_missed) / ref_missed if ref_missed else (0.0 if missed == 0 else math.inf)
    used = max(loss / allowed, excess / MISSED_EXCESS)  # > 1: the bound is broken
    return {
        "hit_rate": rate,
        "lru_hit_rate": ref_rate,
        "loss_points": loss,
        "allowed_points": allowed,
        "missed_share": 100.0 * missed / prompt,
        "lru_missed_share": 100.0 * ref_missed / prompt,
        "missed_excess": excess,
        "bound_used": used,
        "met": loss <= allowed + 1e-9 and excess <= MISSED_EXCESS + 1e-9,
    }


def pool_for(records: Sequence[Any], factor: float, cfg: ReplayConfig) -> tuple[int, int, bool]:
    """(pool blocks, working set, whether the pool was raised to fit the largest request)."""
    ws = trace_family.working_set_blocks(records, cfg.block_size, cfg.hash_block_tokens)
    largest = max(
        math.ceil((r.input_length + max(1, r.output_length) + cfg.decode_tokens) / cfg.block_size)
        for r in records
    )
    want = max(2, math.ceil(factor * ws))
    need = largest + 2  # + vLLM's null block and one spare
    return max(want, need), ws, need > want


def replay_point(
    gen: trace_family.GeneratedTrace,
    factor: float,
    base: ReplayConfig,
    variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One trace at one pool factor: every side's hit rate, missed share, ranges, and the bound per side."""
    cfg0 = ReplayConfig(**{**base.__dict__, "hash_block_tokens": gen.params.hash_block_tokens})
    pool, ws, raised = pool_for(gen.records, factor, cfg0)
    cfg = ReplayConfig(**{**cfg0.__dict__, "pool_blocks": pool})
    jobs, too_large = jobs_from_records(gen.records, cfg)
    out = replay(jobs, cfg, variants=variants)
    ref = out["sides"][REFERENCE]
    sides: dict[str, Any] = {}
    for name, s in out["sides"].items():
        sides[name] = {
            "prefix_eviction": s["prefix_eviction"],
            "hit_rate": 100.0 * s["hit_rate"],
            "missed_share": 100.0 * (s["prompt_tokens"] - s["hit_tokens"]) / s["prompt_tokens"],
            "ranges_mean": s["ranges_per_request"]["mean"],
            "ranges_p99": s["ranges_per_request"]["p99"],
            "preemptions": s["preemptions"],
            "hits_over_reuse_bound": s["hits_over_reuse_bound"],
            "bound": bound(s, ref) if name != REFERENCE else None,
        }
    return {
        "trace": gen.params.name,
        "seed": gen.seed,
        "factor": factor,
        "working_set_blocks": ws,
        "pool_blocks": pool,
        "pool_raised_to_fit": raised,
        "too_large": too_large,
        "requests": out["requests"],
        "infinite_pool_hit_rate": 100.0 * out["infinite_pool_hit_rate"],
        "same_hits_per_request_vs_paged": out["same_hits_per_request_vs_paged"],
        "sides": sides,
    }


def worst_cases(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per side (not the reference): the worst point over all traces and pools, and per pool factor; a
    point is worse when it uses more of the bound (``bound_used``)."""
    out: dict[str, Any] = {}
    names = [n for n in points[0]["sides"] if n != REFERENCE] if points else []
    for name in names:

        def summary(pts: Sequence[dict[str, Any]], name: str = name) -> dict[str, Any]:
            worst = max(pts, key=lambda p: p["sides"][name]["bound"]["bound_used"])
            b = worst["sides"][name]["bound"]
            return {
                "met": all(p["sides"][name]["bound"]["met"] for p in pts),
                "points": len(pts),
                "broken": sum(1 for p in pts if not p["sides"][name]["bound"]["met"]),
                "trace": worst["trace"],
                "factor": worst["factor"],
                "pool_blocks": worst["pool_blocks"],
                "max_loss_points": max(p["sides"][name]["bound"]["loss_points"] for p in pts),
                "max_missed_excess": max(p["sides"][name]["bound"]["missed_excess"] for p in pts),
                "ranges_mean_max": max(p["sides"][name]["ranges_mean"] for p in pts),
                "lru_ranges_mean_max": max(p["sides"][REFERENCE]["ranges_mean"] for p in pts),
                "worst": {
                    **b,
                    "ranges_mean": worst["sides"][name]["ranges_mean"],
                    "lru_ranges_mean": worst["sides"][REFERENCE]["ranges_mean"],
                },
            }

        factors = sorted({p["factor"] for p in points})
        out[name] = {
            "prefix_eviction": points[0]["sides"][name]["prefix_eviction"],
            "overall": summary(points),
            "per_factor": {str(f): summary([p for p in points if p["factor"] == f]) for f in factors},
        }
    return out


def run_family(
    scale: str = "ci",
    mixtures: int = 6,
    factors: Sequence[float] = DEFAULT_FACTORS,
    base: ReplayConfig | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    members: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every member (or those named in ``members``) at every factor; the points and the worst cases."""
    base = base or ReplayConfig(pool_blocks=2, max_num_seqs=32, max_num_batched_tokens=2048)
    points: list[dict[str, Any]] = []
    described: list[dict[str, Any]] = []
    for params, seed in trace_family.family(scale, mixtures):
        if members is not None and params.name not in members:
            continue
        gen = trace_family.generate(params, seed)
        described.append(gen.describe())
        for factor in factors:
            points.append(replay_point(gen, float(factor), base, variants))
            if progress is not None:
                p = points[-1]
                progress(
                    f"{p['trace']} x{factor}: pool {p['pool_blocks']}, "
                    + ", ".join(f"{n} {s['hit_rate']:.2f}%" for n, s in p["sides"].items())
                )
    if not points:
        raise ValueError("no family member selected")
    return {
        "scale": scale,
        "factors": [float(f) for f in factors],
        "bound": {
            "hit_points_floor": HIT_POINTS_FLOOR,
            "hit_share": HIT_SHARE,
            "missed_excess": MISSED_EXCESS,
            "reference": REFERENCE,
        },
        "members": described,
        "points": points,
        "worst": worst_cases(points),
        "lru_matches_vllm": {
            n: all(p["same_hits_per_request_vs_paged"].get(n, False) for p in points)
            for n in points[0]["same_hits_per_request_vs_paged"]
        },
    }


def run_family_section(
    fcfg: dict[str, Any],
    rcfg: ReplayConfig,
    variants: dict[str, dict[str, Any]],
    info: Callable[..., None],
) -> dict[str, Any]:
    """The trace family (``trace_replay.family``): its worst cases under the eviction bound."""
    base = ReplayConfig(
        pool_blocks=2,
        block_size=rcfg.block_size,
        max_num_seqs=int(fcfg.get("max_num_seqs") or rcfg.max_num_seqs),
        max_num_batched_tokens=int(fcfg.get("max_num_batched_tokens") or rcfg.max_num_batched_tokens),
        step_ms=rcfg.step_ms,
        policy=rcfg.policy,
    )
    members = fcfg.get("members")
    t0 = time.perf_counter()
    out = run_family(
        scale=str(fcfg.get("scale") or "ci"),
        mixtures=int(fcfg.get("mixtures", 6)),
        factors=[float(f) for f in (fcfg.get("pool_factors") or DEFAULT_FACTORS)],
        base=base,
        variants=variants,
        members=list(members) if members else None,
        progress=lambda line: info("trace_replay family: %s", line),
    )
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def section(cfg: dict[str, Any]) -> dict[str, Any]:
    """bench-host's trace_replay section: the trace through every side (:func:`trace_replay.run`), plus the
    trace family's worst cases when ``trace_replay.family.enabled``."""
    result = trace_replay.run(cfg)
    fcfg = cfg["trace_replay"].get("family") or {}
    if fcfg.get("enabled"):
        rcfg, variants = trace_replay.replay_settings(cfg)
        result["family"] = run_family_section(fcfg, rcfg, variants, logging.getLogger("benchmarks.host").info)
    return result
