"""The map pooled: what all its A/B cells say together about the average measured regime, beside the A/A
pooled the same way.

One cell's ratio estimates tagma's effect in one regime, and most cells resolve only large effects (their
MDE). Averaged over cells, the noise shrinks. Cells measured in the same server lifetimes (one job of one map)
share those lifetimes' noise, so the unit is the job: a job's cells are averaged on the log scale, and the
jobs' means are the sample, every job weighing the same (cells of very different sizes and noise: no weights
taken from their own few-run variances). Three families, each Holm-corrected over the five metrics:

* ``ab``: the A/B jobs' means, a one-sample t interval: tagma's effect averaged over the measured regimes;
* ``aa``: the A/A jobs' means the same way: what the instrument reports between identical servers, where the
  true answer is 1 (its calibration at the pooled level: the cells' own A/A checks cannot see a bias of a
  few percent that their intervals are wider than);
* ``ab_over_aa``: Welch's t over the two sets of job means: the A/B with the A/A's lean taken out, right if
  the A/A's lean comes from the design (both arms of the A/A sit where the A/B's arms sit), not from chance.

Each is also computed over the cells where host work is at least ``HOST_SHARE_FLOOR`` of paged's step, where
the in-server parts predict the largest change, and over the jobs measured at the current instrument
(``warm``: an unmeasured server lifetime before the measured ones, which takes out the first lifetime's
penalty the ``aa_order`` profile found; maps collected before it have no ``warmup_lifetimes``, so count 0).
An A/B mean can hide opposite effects in different regimes: the per-cell table stays the answer per regime;
this is the answer for the average one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from harness.analysis.statistics import Comparison, compare_run_values, holm
from harness.regime.analysis import MAP_PRIMARY
from harness.regime.figures import ab_cells

__all__ = ["HOST_SHARE_FLOOR", "SUBSETS", "job_means", "pooled", "pooled_family"]

HOST_SHARE_FLOOR = 0.10
SUBSETS = ("all", "host_heavy", "warm")
OPTIONAL_SUBSETS = ("warm",)  # left out of the result where no A/B job is in them
LOWER_IS_BETTER = {m: m != "output_throughput" for m in MAP_PRIMARY}


def _in_subset(job: dict[str, Any], cell: dict[str, Any], subset: str) -> bool:
    if subset == "all":
        return True
    if subset == "warm":  # the current instrument: an unmeasured lifetime before the measured ones
        return (job.get("warmup_lifetimes") or 0) >= 1
    share = ((cell.get("composition") or {}).get("baseline") or {}).get("host_share")
    return share is not None and share >= HOST_SHARE_FLOOR


def job_means(
    maps: Sequence[dict[str, Any]], metric: str, aa: bool, subset: str = "all", key: str = "metric"
) -> dict[str, tuple[float, int]]:
    """A job's run id (``<map id>/<job>``) -> (geometric mean of its cells' ratios, cells), over the cells of
    ``subset`` that have a ratio for ``metric``. ``key="prediction"``: the cells' predicted step ratios."""
    logs: dict[str, list[float]] = {}
    for _, job, cell in ab_cells(maps, aa=aa):
        if not _in_subset(job, cell, subset):
            continue
        if key == "prediction":
            value = (cell.get("prediction") or {}).get("step_ratio")
        else:
            value = ((cell.get("metrics") or {}).get(metric) or {}).get("ratio")
        if value is not None and value > 0 and math.isfinite(value):
            logs.setdefault(job["run_id"], []).append(math.log(value))
    return {k: (math.exp(float(np.mean(v))), len(v)) for k, v in logs.items()}


def _one_sample(metric: str, means: Sequence[float], alpha: float) -> Comparison:
    """A one-sample t interval on the log means against 1: Welch against a constant baseline of 1, which has
    no spread and so contributes no term."""
    c = compare_run_values(
        metric, [1.0] * len(means), means, lower_is_better=LOWER_IS_BETTER[metric], primary=True, alpha=alpha
    )
    return replace(c, method="one-sample t over jobs (log)", runs_baseline=0)


def pooled_family(
    maps: Sequence[dict[str, Any]], kind: str, subset: str = "all", alpha: float = 0.05
) -> list[dict[str, Any]]:
    """One family (``ab``, ``aa`` or ``ab_over_aa``) over ``subset``: a row per primary metric, Holm-corrected
    over the five."""
    rows: list[Comparison] = []
    sizes: list[tuple[int, int]] = []
    for metric in MAP_PRIMARY:
        ab = job_means(maps, metric, aa=False, subset=subset)
        aa = job_means(maps, metric, aa=True, subset=subset)
        if kind == "ab":
            rows.append(_one_sample(metric, [v for v, _ in ab.values()], alpha))
            sizes.append((len(ab), sum(n for _, n in ab.values())))
        elif kind == "aa":
            rows.append(_one_sample(metric, [v for v, _ in aa.values()], alpha))
            sizes.append((len(aa), sum(n for _, n in aa.values())))
        elif kind == "ab_over_aa":
            c = compare_run_values(
                metric, [v for v, _ in aa.values()], [v for v, _ in ab.values()],
                lower_is_better=LOWER_IS_BETTER[metric], primary=True, alpha=alpha,
            )  # fmt: skip
            rows.append(replace(c, method="Welch t over A/B and A/A job means (log)"))
            sizes.append((len(ab) + len(aa), sum(n for _, n in (*ab.values(), *aa.values()))))
        else:
            raise ValueError(f"unknown pooled family {kind!r} (ab, aa, ab_over_aa)")
    out = []
    for c, (jobs, cells) in zip(holm(rows, alpha=alpha), sizes, strict=True):
        out.append({
            "metric": c.metric, "ratio": c.ratio, "ci": [c.ci_low, c.ci_high], "verdict": c.verdict,
            "reason": c.reason, "p_value": c.p_value, "p_adjusted": c.p_adjusted, "jobs": jobs,
            "cells": cells, "method": c.method,
        })  # fmt: skip
    return out


def pooled(maps: Sequence[dict[str, Any]], alpha: float = 0.05) -> dict[str, Any]:
    """Every family over every subset, with the jobs behind them and the mean predicted step ratio."""
    out: dict[str, Any] = {}
    for subset in SUBSETS:
        if subset in OPTIONAL_SUBSETS and not job_means(maps, "p50_tpot_ms", aa=False, subset=subset):
            continue
        predicted = job_means(maps, "", aa=False, subset=subset, key="prediction")
        out[subset] = {
            "families": {k: pooled_family(maps, k, subset, alpha) for k in ("ab", "aa", "ab_over_aa")},
            "jobs": {
                "ab": sorted(job_means(maps, "p50_tpot_ms", aa=False, subset=subset)),
                "aa": sorted(job_means(maps, "p50_tpot_ms", aa=True, subset=subset)),
            },
            "predicted_step_ratio": (
                math.exp(float(np.mean([math.log(v) for v, _ in predicted.values()]))) if predicted else None
            ),
        }
    return out
