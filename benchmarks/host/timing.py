"""Timing primitives of the host benchmark: interleaved repeats, calibrated batches, summaries.

Every sample is ``time.perf_counter_ns`` around a batch of operations (the batch divides it). The garbage
collector is disabled during each sample (as ``timeit`` does), so a collection triggered by one side's
allocations is not billed to the other side; collections run between samples. Before the timed rounds of a
measurement everything alive is collected once and frozen (``gc.freeze``: the collector then skips the
large, long-lived vLLM object graph) and unfrozen afterwards. Paired variants are measured in the same loop,
alternating their order every repeat (A B, B A, A B, ...), so drift and the load of a shared machine hit
both sides alike. Untimed warm-up rounds of every variant come first.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "calibrate",
    "ratio_range",
    "interleaved",
    "load_average",
    "pair_entry",
    "summarize",
    "timed_ns",
]

Sample = Callable[[], float]


def timed_ns(fn: Callable[[], Any]) -> int:
    """Wall-clock ns of one call of ``fn`` with the garbage collector off during it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - start
    finally:
        if was_enabled:
            gc.enable()


def calibrate(batch_ns: Callable[[int], int], min_ns: int, max_batch: int) -> int:
    """The smallest power-of-two batch (<= max_batch) whose timed run takes at least ``min_ns``."""
    batch = 1
    while batch < max_batch and batch_ns(batch) < min_ns:
        batch = min(max_batch, 2 * batch)
    return batch


def interleaved(variants: Mapping[str, Sample], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Samples of every variant: ``warmup`` untimed rounds, then ``repeats`` rounds in alternating order."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.freeze()
    try:
        for rep in range(repeats):
            for name in names if rep % 2 == 0 else reversed(names):
                samples[name].append(float(variants[name]()))
    finally:
        gc.unfreeze()
    return samples


def summarize(samples: Sequence[float], unit: str, scale: float = 1.0) -> dict[str, Any]:
    """median / min / max / repeats / unit of samples (each multiplied by ``scale``), samples kept."""
    values = [float(v) * scale for v in samples]
    if not values:
        raise ValueError("no samples")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "repeats": len(values),
        "unit": unit,
        "samples": values,
    }


def pair_entry(
    paged: Sequence[float], tagma: Sequence[float], unit: str, scale: float = 1.0, **meta: Any
) -> dict[str, Any]:
    """A paired measurement: both summaries, ratio = tagma median / paged median (< 1: tagma is cheaper),
    ratio_paired = median of the per-repeat ratios (the pairs were measured side by side), and speedup =
    1 / ratio."""
    p = summarize(paged, unit, scale)
    t = summarize(tagma, unit, scale)
    ratio = t["median"] / p["median"] if p["median"] > 0 else None
    per_repeat = [b / a for a, b in zip(paged, tagma, strict=True) if a > 0]
    entry: dict[str, Any] = dict(meta)
    entry.update(
        {
            "unit": unit,
            "paged": p,
            "tagma": t,
            "ratio": ratio,
            "ratio_paired": statistics.median(per_repeat) if per_repeat else None,
            "speedup": (1.0 / ratio) if ratio else None,
        }
    )
    return entry


def ratio_range(entry: Mapping[str, Any]) -> tuple[float, float]:
    """The lowest and highest per-repeat ratio tagma / paged of a :func:`pair_entry`."""
    ratios = [t / q for q, t in zip(entry["paged"]["samples"], entry["tagma"]["samples"], strict=True)]
    return min(ratios), max(ratios)


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
