"""Paired timing of kernel variants, achieved bandwidth, and ratios of medians with bootstrap intervals."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.gpu.settings import Settings


@dataclass(slots=True)
class Timer:
    s: Settings

    def __call__(self, fn: Callable[[], Any]) -> list[float]:
        if self.s.device == "cuda":
            import triton.testing

            return list(
                triton.testing.do_bench(fn, warmup=self.s.warmup_ms, rep=self.s.rep_ms, return_mode="all")
            )
        times = []
        for _ in range(self.s.cpu_reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def pair(self, fns: dict[str, Callable[[], Any]]) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(self.s.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                samples[name].extend(self(fns[name]))
        return samples


def summarize(ms: list[float], nbytes: int, info: dict[str, Any]) -> dict[str, Any]:
    a = np.asarray(ms)
    med = float(np.median(a))
    gbps = nbytes / (med * 1e-3) / 1e9 if med > 0 else None
    out = {
        "median_ms": med,
        "p10_ms": float(np.percentile(a, 10)),
        "p90_ms": float(np.percentile(a, 90)),
        "mean_ms": float(a.mean()),
        "std_ms": float(a.std()),
        "n": int(a.size),
        "bytes": int(nbytes),
        "gbps": gbps,
        "frac_peak": gbps / info["peak_gbps"] if gbps and info.get("peak_gbps") else None,
        "frac_copy": gbps / info["copy_gbps"] if gbps and info.get("copy_gbps") else None,
    }
    return out


def ratio(
    num: list[float], den: list[float], rng: np.random.Generator, draws: int = 1000
) -> dict[str, float]:
    """Ratio of medians num/den with a bootstrap 95% interval (resampling each side's samples)."""
    a, b = np.asarray(num), np.asarray(den)
    ra = np.median(rng.choice(a, (draws, a.size)), axis=1)
    rb = np.median(rng.choice(b, (draws, b.size)), axis=1)
    boot = ra / rb
    return {
        "ratio": float(np.median(a) / np.median(b)),
        "ci95_lo": float(np.percentile(boot, 2.5)),
        "ci95_hi": float(np.percentile(boot, 97.5)),
    }


