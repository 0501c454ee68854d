"""Which samples of a run directory enter which statistical comparison, for each design.

- ``abba``: every latency statistic (mean, p50, p90, p99 of TTFT, TPOT, ITL, E2EL) is computed per server
  run, then compared between the arms' runs (run-to-run variance is in the interval); throughputs are one
  value per run.
- ``paired``: requests are paired (the same prompt to both arms, seconds apart); latency statistics
  compare the paired arrays in measurement order. ITL enters as each request's mean gap. Output
  throughput is tokens over latency; with identical output lengths on both arms (ignore_eos) its ratio is
  the inverse of the mean-E2EL ratio, which is how it is computed.

The primary metrics (``run.primary_metrics``) get verdicts under Holm's correction; every other row is
descriptive. :func:`comparisons` is the one entry point; the report, the plots and the sweep report call it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from harness.analysis.statistics import Comparison, compare_by_run, compare_pairs, compare_run_values, holm
from harness.files import read_json, read_jsonl

LATENCY_STATS = ("mean", "p50", "p90", "p99")  # names of harness.analysis.statistics.STATS
LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
RUN_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
ARMS = ("baseline", "candidate")
_FLIP = {"faster": "higher", "slower": "lower"}


def arm_of(run: Mapping, backends: Sequence[str]) -> str:
    """A run's arm; runs recorded before arms were named are placed by their backend."""
    if run.get("arm"):
        return str(run["arm"])
    return ARMS[0] if run["backend"] == backends[0] else ARMS[1]


def load_runs(run_root: Path) -> list[dict]:
    """Every run directory's status, and for ok runs its summary, requests and telemetry."""
    runs = []
    for d in sorted((run_root / "runs").glob("*-*")):
        if not (d / "status.json").exists():
            continue
        run = {"dir": d, **read_json(d / "status.json")}
        if run["status"] == "ok":
            run["summary"] = read_json(d / "summary.json")
            run["requests"] = read_jsonl(d / "requests.jsonl")
            run["telemetry"] = read_jsonl(d / "telemetry.jsonl") if (d / "telemetry.jsonl").exists() else []
        runs.append(run)
    return runs


def ok_runs(runs: Sequence[dict], arm: str, backends: Sequence[str]) -> list[dict]:
    return [r for r in runs if r["status"] == "ok" and arm_of(r, backends) == arm]


def request_values(run: Mapping, key: str) -> np.ndarray:
    """The run's values of ``key`` over its successful requests (ITL: every gap of every request)."""
    out: list[float] = []
    for row in run["requests"]:
        if not row["success"]:
            continue
        v = row.get(key)
        if isinstance(v, list):
            out.extend(v)
        elif v is not None:
            out.append(v)
    return np.asarray(out, dtype=float)


def paired_values(runs: Sequence[dict], backends: Sequence[str], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) values of ``key`` for the pairs both arms served, in measurement order."""
    by_arm: dict[str, dict[int, float]] = {a: {} for a in ARMS}
    for run in runs:
        if run["status"] != "ok":
            continue
        for row in run["requests"]:
            v = row.get(key)
            if isinstance(v, list):
                v = float(np.mean(v)) if v else None
            if row["success"] and v is not None and row.get("pair") is not None:
                by_arm[arm_of(run, backends)][int(row["pair"])] = float(v)
    pairs = sorted(set(by_arm[ARMS[0]]) & set(by_arm[ARMS[1]]))
    return (np.asarray([by_arm[ARMS[0]][p] for p in pairs]), np.asarray([by_arm[ARMS[1]][p] for p in pairs]))


def invert(c: Comparison, metric: str) -> Comparison:
    """The comparison of 1/x from that of x (a latency ratio turned into a throughput ratio)."""
    inv = lambda x: None if x is None or x == 0 else 1.0 / x  # noqa: E731
    return dataclasses.replace(
        c, metric=metric, baseline=None, candidate=None, ratio=inv(c.ratio),
        ci_low=inv(c.ci_high), ci_high=inv(c.ci_low), verdict=_FLIP.get(c.verdict, c.verdict),
        method=f"{c.method}, 1 / mean E2EL",
    )  # fmt: skip


def _abba(runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int) -> list[Comparison]:
    base, cand = ok_runs(runs, ARMS[0], backends), ok_runs(runs, ARMS[1], backends)
    rows: list[Comparison] = []
    for key in LATENCY_KEYS:
        a = [request_values(r, key) for r in base]
        b = [request_values(r, key) for r in cand]
        for stat_name in LATENCY_STATS:
            name = f"{stat_name}_{key}"
            rows.append(compare_by_run(name, a, b, stat_name, lower_is_better=True, primary=name in primary,
                                       n_boot=n_boot))  # fmt: skip
    for key in RUN_KEYS:
        a = [r["summary"].get(key) for r in base]
        b = [r["summary"].get(key) for r in cand]
        if all(v is None for v in a + b):
            continue
        rows.append(compare_run_values(key, a, b, lower_is_better=False, primary=key in primary))
    return rows


def _paired(
    runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int
) -> list[Comparison]:
    rounds = [len(ok_runs(runs, a, backends)) for a in ARMS]  # the server lifetimes the pairs came from
    rows = [dataclasses.replace(c, runs_baseline=rounds[0], runs_candidate=rounds[1])
            for c in _paired_rows(runs, backends, primary, n_boot)]  # fmt: skip
    return rows


def _paired_rows(
    runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int
) -> list[Comparison]:
    rows: list[Comparison] = []
    for key in LATENCY_KEYS:
        a, b = paired_values(runs, backends, key)
        for stat_name in LATENCY_STATS:
            name = f"{stat_name}_{key}"
            rows.append(compare_pairs(name, a, b, stat_name, lower_is_better=True, primary=name in primary,
                                      n_boot=n_boot))  # fmt: skip
    a, b = paired_values(runs, backends, "e2el_ms")
    for key in ("output_throughput", "request_throughput"):
        c = compare_pairs(key, a, b, "mean", lower_is_better=True, primary=key in primary,
                          n_boot=n_boot)  # fmt: skip
        rows.append(invert(c, key))
    return rows


def comparisons(runs: Sequence[dict], config: Mapping, n_boot: int | None = None) -> list[Comparison]:
    """Every comparison of a run directory's runs under its config (config.json), Holm-corrected."""
    run_cfg = config.get("run", {})
    backends = tuple(config.get("backends", ("paged", "tagma")))
    primary = set(run_cfg.get("primary_metrics") or ())
    n_boot = int(n_boot or run_cfg.get("n_boot", 2000))
    design = run_cfg.get("design", "abba")
    rows = (_paired if design == "paired" else _abba)(runs, backends, primary, n_boot)
    return holm(rows, alpha=float(run_cfg.get("alpha", 0.05)))


def per_arm_latencies(runs: Sequence[dict], backends: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """arm label -> latency key -> values pooled over the arm's ok runs (for CDF plots)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for arm, backend in zip(ARMS, backends, strict=True):
        for key in LATENCY_KEYS:
            vals = [request_values(r, key) for r in ok_runs(runs, arm, backends)]
            out[f"{arm} ({backend})"][key] = [float(x) for v in vals for x in v]
    return dict(out)


# In-server host CPU time (harness.analysis.host_time): the report's components, as per-step columns in ns.
HOST_COMPONENTS = {
    "kv_manager": "kv_manager_total_ns_net",
    "schedule_other": "schedule_other_ns_net",
    "update_other": "update_other_ns_net",
    "worker_prepare": "worker_prepare_ns_net",
}


def host_steps(run: Mapping) -> dict[str, np.ndarray] | None:
    """The run's busy scheduler steps after its replay started, in us per component (None: no host time)."""
    from harness.analysis.host_time import load_run

    try:
        host = load_run(run["dir"])
    except (FileNotFoundError, ValueError):
        return None
    s = host.steps
    keep = (s["num_tokens"] > 0) & (s["end_ns"] >= int(run.get("replay_start_ns") or 0))
    out = {name: s[col][keep] / 1000.0 for name, col in HOST_COMPONENTS.items() if col in s}
    out["end_ns"] = s["end_ns"][keep]
    return out


def per_request_host(
    steps: Mapping[str, np.ndarray], requests: Sequence[Mapping], name: str
) -> dict[int, float]:
    """pair -> CPU us of component ``name`` over the steps that ended while that request was in flight."""
    end = steps["end_ns"]
    out: dict[int, float] = {}
    for row in requests:
        if row.get("pair") is None or not row["success"] or row.get("wall_start_ns") is None:
            continue
        inside = (end >= row["wall_start_ns"]) & (end <= row["wall_end_ns"])
        out[int(row["pair"])] = float(steps[name][inside].sum())
    return out


def host_time_comparisons(
    runs: Sequence[dict], config: Mapping, n_boot: int | None = None
) -> list[Comparison]:
    """CPU time inside the servers, candidate vs baseline, per component: per busy step (mean and p99,
    runs then steps resampled) and, in the paired design, per request (paired by prompt)."""
    backends = tuple(config.get("backends", ("paged", "tagma")))
    n_boot = int(n_boot or config.get("run", {}).get("n_boot", 2000))
    steps = {a: [(r, s) for r in ok_runs(runs, a, backends) if (s := host_steps(r)) is not None]
             for a in ARMS}
    rows: list[Comparison] = []
    if not steps[ARMS[0]] or not steps[ARMS[1]]:
        return rows
    for name in HOST_COMPONENTS:
        a = [s[name] for _, s in steps[ARMS[0]] if name in s]
        b = [s[name] for _, s in steps[ARMS[1]] if name in s]
        if not a or not b:
            continue
        for stat_name in ("mean", "p99"):
            rows.append(compare_by_run(f"{name}_us_per_step_{stat_name}", a, b, stat_name,
                                       n_boot=n_boot))  # fmt: skip
        if config.get("run", {}).get("design") == "paired":
            per = [{}, {}]
            for k, arm in enumerate(ARMS):
                for run, s in steps[arm]:
                    per[k].update(per_request_host(s, run["requests"], name))
            pairs = sorted(set(per[0]) & set(per[1]))
            if pairs:
                c = compare_pairs(f"{name}_us_per_request", np.asarray([per[0][p] for p in pairs]),
                                  np.asarray([per[1][p] for p in pairs]), "mean", n_boot=n_boot)  # fmt: skip
                rows.append(dataclasses.replace(c, runs_baseline=len(steps[ARMS[0]]),
                                                runs_candidate=len(steps[ARMS[1]])))  # fmt: skip
    return rows
