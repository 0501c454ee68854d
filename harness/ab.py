"""A/B statistics: ABBA run order, bootstrap confidence intervals of tagma/paged ratios, verdicts.

Two kinds of samples are compared:
- per-request latencies (TTFT, TPOT, ITL, E2EL): both backends served the identical request list, so the
  bootstrap resamples request indices and applies the same draw to both sides (a paired bootstrap);
- per-run values (throughputs, goodput): one value per repeat, resampled within each side.
The ratio is statistic(tagma) / statistic(paged). The verdict is "parity" when the 95% interval contains 1,
otherwise "faster"/"slower" (or "higher"/"lower" for throughput) from tagma's point of view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

Statistic = Callable[[np.ndarray], float]


def abba_order(repeats: int, a: str = "paged", b: str = "tagma") -> list[str]:
    """A B B A A B B A ...: each backend `repeats` times, so drift over time hits both sides alike."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    order: list[str] = []
    for i in range(repeats):
        order += [a, b] if i % 2 == 0 else [b, a]
    return order


@dataclass(frozen=True)
class RatioCI:
    metric: str
    paged: float | None
    tagma: float | None
    ratio: float | None  # tagma / paged
    ci_low: float | None
    ci_high: float | None
    verdict: str  # faster | slower | higher | lower | parity | n/a
    samples_paged: int
    samples_tagma: int

    def to_dict(self) -> dict:
        return asdict(self)


def _verdict(lo: float, hi: float, lower_is_better: bool) -> str:
    if lo <= 1.0 <= hi:
        return "parity"
    better = hi < 1.0 if lower_is_better else lo > 1.0
    if lower_is_better:
        return "faster" if better else "slower"
    return "higher" if lo > 1.0 else "lower"


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def paired_ratio_ci(
    metric: str,
    paged: Sequence[np.ndarray],
    tagma: Sequence[np.ndarray],
    stat: Statistic,
    lower_is_better: bool = True,
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """Per-request samples: paged[i] and tagma[i] hold request i's values over all repeats (ragged)."""
    if len(paged) != len(tagma):
        raise ValueError("paired samples need the same requests on both sides")
    keep = [i for i in range(len(paged)) if len(paged[i]) and len(tagma[i])]
    n_a = sum(len(paged[i]) for i in keep)
    n_b = sum(len(tagma[i]) for i in keep)
    if not keep:
        return RatioCI(metric, None, None, None, None, None, "n/a", 0, 0)
    a_groups = [np.asarray(paged[i], dtype=float) for i in keep]
    b_groups = [np.asarray(tagma[i], dtype=float) for i in keep]
    a_all, b_all = np.concatenate(a_groups), np.concatenate(b_groups)
    a_stat, b_stat = stat(a_all), stat(b_all)
    if a_stat == 0:
        return RatioCI(metric, _finite(a_stat), _finite(b_stat), None, None, None, "n/a", n_a, n_b)
    rng = np.random.default_rng(seed)
    ratios = np.empty(n_boot)
    for k in range(n_boot):
        idx = rng.integers(0, len(keep), len(keep))
        a = np.concatenate([a_groups[i] for i in idx])
        b = np.concatenate([b_groups[i] for i in idx])
        sa = stat(a)
        ratios[k] = stat(b) / sa if sa != 0 else np.nan
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return RatioCI(
        metric, _finite(a_stat), _finite(b_stat), b_stat / a_stat, float(lo), float(hi),
        _verdict(lo, hi, lower_is_better), n_a, n_b,
    )  # fmt: skip


def run_ratio_ci(
    metric: str,
    paged: Sequence[float],
    tagma: Sequence[float],
    lower_is_better: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """Per-run values (one per repeat): ratio of means, both sides resampled independently."""
    a = np.asarray([x for x in paged if x is not None and np.isfinite(x)], dtype=float)
    b = np.asarray([x for x in tagma if x is not None and np.isfinite(x)], dtype=float)
    if len(a) == 0 or len(b) == 0 or a.mean() == 0:
        mean_a = _finite(a.mean()) if len(a) else None
        mean_b = _finite(b.mean()) if len(b) else None
        return RatioCI(metric, mean_a, mean_b, None, None, None, "n/a", len(a), len(b))
    if len(a) < 2 or len(b) < 2:  # one run per side has no spread: a ratio, but no interval or verdict
        return RatioCI(
            metric, float(a.mean()), float(b.mean()), float(b.mean() / a.mean()), None, None,
            "n/a (needs >= 2 repeats)", len(a), len(b),
        )  # fmt: skip
    rng = np.random.default_rng(seed)
    ra = rng.choice(a, size=(n_boot, len(a))).mean(axis=1)
    rb = rng.choice(b, size=(n_boot, len(b))).mean(axis=1)
    lo, hi = np.percentile(rb / ra, [2.5, 97.5])
    return RatioCI(
        metric, float(a.mean()), float(b.mean()), float(b.mean() / a.mean()), float(lo), float(hi),
        _verdict(lo, hi, lower_is_better), len(a), len(b),
    )  # fmt: skip
