"""What one cell of the regime map measured: verdicts with their power, where a step's time goes, and the
e2e change the in-server components predict beside the one measured.

* Verdicts: the cell's runs are plain ABBA runs (one per server lifetime), so :func:`harness.compare`'s
  run-level comparisons apply; the cell's primary family (``MAP_PRIMARY``) is Holm-corrected within the cell.
* Minimum detectable effect (MDE): the relative change the cell would call with 80% probability at its
  size, from its own interval: a two-sided level-alpha interval of half-width ``h`` on the log scale has a
  standard error ``h / z(1 - alpha/2)``, and an effect of ``(z(1 - alpha/2) + z(0.8))`` standard errors is
  detected 80% of the time, so ``MDE = exp(h (1 + z(0.8) / z(1 - alpha/2))) - 1`` (1.43 h at alpha 0.05).
  The run-level t interval is wider than the normal one at few runs, so this is the MDE of a normal test
  with that interval's width: it states what the cell can resolve, not a power guarantee. A cell's A/A (the
  same cell and size with both arms paged, where the profile runs one) checks the rule: its verdicts count
  the false calls, and its MDE is reported beside the A/B's.
* Step composition (per busy step, mean over the arm's runs): KV manager, the rest of ``schedule()``, the rest
  of ``update_from_output()`` (scheduler thread CPU), the worker's input preparation (worker CPU), and the
  model forward = the worker's ``execute_model`` wall time minus its input preparation. Host work = all but
  the forward. On this CPU the step is serial (schedule, execute, update), so the predicted ratio of a
  step's time is the candidate's host work plus the baseline's forward over the baseline's whole step
  (the forward is the same code on both arms), and the predicted TPOT and throughput ratios follow it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from harness.analysis.compare import HOST_COMPONENTS, comparisons, host_steps, host_time_comparisons
from harness.analysis.runs import load_runs, ok_runs
from harness.analysis.statistics import Comparison, holm
from harness.config import ARM_NAMES as ARMS
from harness.files import read_json

__all__ = ["MAP_PRIMARY", "analyse_cell", "mde", "step_composition"]

MAP_PRIMARY = ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms")
Z_POWER = NormalDist().inv_cdf(0.8)
HOST_PARTS = tuple(HOST_COMPONENTS)  # kv_manager, schedule_other, update_other, worker_prepare


def mde(c: Comparison, alpha: float = 0.05) -> float | None:
    """The cell's minimum detectable effect for this comparison (0.1 = 10%), from its interval."""
    if c.ci_low is None or c.ci_high is None or c.ci_low <= 0:
        return None
    h = (math.log(c.ci_high) - math.log(c.ci_low)) / 2
    return math.exp(h * (1 + Z_POWER / NormalDist().inv_cdf(1 - alpha / 2))) - 1


def step_composition(
    runs: Sequence[dict], arm: str, backends: Sequence[str], steps: Mapping[str, Mapping | None]
) -> dict[str, Any] | None:
    """Mean us per busy step of each part, averaged over the arm's runs (each run weighs the same);
    ``steps``: each run's busy steps (``host_steps``) by run directory."""
    per_run = [s for r in ok_runs(runs, arm, backends) if (s := steps.get(r["dir"])) and len(s["num_reqs"])]
    if not per_run:
        return None
    parts = [p for p in (*HOST_PARTS, "forward") if all(p in s for s in per_run)]
    means = {p: float(np.mean([s[p].mean() for s in per_run])) for p in parts}
    host = sum(means[p] for p in HOST_PARTS if p in means)
    step = host + means.get("forward", 0.0)
    return {
        "us_per_step": means,
        "host_us_per_step": host,
        "step_us": step,
        "host_share": host / step if step > 0 and "forward" in means else None,
        "mean_running": float(np.mean([s["num_reqs"].mean() for s in per_run])),
        "steps": int(sum(len(s["num_reqs"]) for s in per_run)),
        "runs": len(per_run),
    }


def predicted_step_ratio(base: Mapping[str, Any] | None, cand: Mapping[str, Any] | None) -> float | None:
    """Candidate step time over baseline's, from host parts alone (the forward taken as the baseline's)."""
    if not base or not cand or base.get("host_share") is None:
        return None
    fwd = base["us_per_step"]["forward"]
    return (cand["host_us_per_step"] + fwd) / (base["host_us_per_step"] + fwd)


def _row(c: Comparison, alpha: float) -> dict[str, Any]:
    return {
        "ratio": c.ratio,
        "ci": [c.ci_low, c.ci_high],
        "verdict": c.verdict,
        "reason": c.reason,
        "p_adjusted": c.p_adjusted,
        "mde": mde(c, alpha),
        "runs": [c.runs_baseline, c.runs_candidate],
        "baseline": c.baseline,
        "candidate": c.candidate,
        "samples": c.samples,
    }


def _forward_us(steps: Mapping[str, Any] | None) -> float | None:
    """The lifetime's model forward, us per busy step of the segment: the same model code on both arms, so
    its spread between lifetimes is the machine's (None without host time)."""
    if steps is None or "forward" not in steps or not len(steps["forward"]):
        return None
    return float(steps["forward"].mean())


def analyse_cell(cell_dir: Path, n_boot: int = 200) -> dict[str, Any]:
    """Everything the findings say about one cell, from its run directory."""
    config = read_json(cell_dir / "config.json")
    config = {**config, "run": {**config["run"], "primary_metrics": list(MAP_PRIMARY)}}
    alpha = float(config["run"].get("alpha", 0.05))
    backends = tuple(config["backends"])
    runs = load_runs(cell_dir)
    rows = [c for c in comparisons(runs, config, n_boot) if c.metric in MAP_PRIMARY]
    rows = holm(rows, alpha=alpha)  # the cell's own family: the five metrics above
    host_rows = host_time_comparisons(runs, config, n_boot)
    steps = {r["dir"]: host_steps(r) for r in runs if r["status"] == "ok"}  # read once: the files are large
    comp = {a: step_composition(runs, a, backends, steps) for a in ARMS}
    predicted = predicted_step_ratio(comp[ARMS[0]], comp[ARMS[1]])
    metrics = {c.metric: _row(c, alpha) for c in rows}
    measured_tpot = metrics.get("p50_tpot_ms", {}).get("ratio")
    return {
        "cell": config["regime"]["cell"],
        "group": config["regime"]["group"],
        "prefix_caching": config["regime"]["prefix_caching"],
        "backends": list(backends),
        "aa": backends[0] == backends[1],
        "runs": {a: [Path(r["dir"]).name for r in ok_runs(runs, a, backends)] for a in ARMS},
        "failed_runs": [
            {"run": Path(r["dir"]).name, "reason": (r.get("reason") or "").splitlines()[:1]}
            for r in runs
            if r["status"] != "ok"
        ],
        "metrics": metrics,
        # each lifetime's own values in run order (index = its place in the ABBA order): an order effect shows
        # here, where the arms' means hide it
        "per_run": [
            {"run": Path(r["dir"]).name, "index": r.get("index"), "arm": r.get("arm"),
             **{m: r["summary"].get(m) for m in MAP_PRIMARY},
             "forward_us_per_step": _forward_us(steps[r["dir"]])}
            for r in runs
            if r["status"] == "ok"
        ],  # fmt: skip
        "host": {c.metric: _row(c, alpha) for c in host_rows},
        "composition": comp,
        "prediction": {
            "step_ratio": predicted,
            "measured_p50_tpot_ratio": measured_tpot,
            "measured_throughput_ratio": metrics.get("output_throughput", {}).get("ratio"),
        },
        "rate": read_json(cell_dir / "runs" / _first_ok(runs) / "summary.json").get("request_rate")
        if _first_ok(runs)
        else None,
    }


def _first_ok(runs: Sequence[dict]) -> str | None:
    for r in runs:
        if r["status"] == "ok":
            return Path(r["dir"]).name
    return None
