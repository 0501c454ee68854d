"""KV cache manager CPU time per scheduler step inside the servers (``make bench-inserver``).

The statistic behind the in-server headline: from each server run's host-time records
(:mod:`harness.analysis.host_time`), the steps that are **decode-only** (every scheduled request gets one
token: ``num_tokens == num_reqs``, so no prefill shares the step) with at least ``min_running`` requests
scheduled, after the run's warm-up, **leaving out the steps that wrote a placement-telemetry line**. Per step
the value is ``kv_manager_total_ns_net``: every KV cache manager call the scheduler made for that step (inside
``schedule()``, inside ``update_from_output()`` and between steps), with the clock's own cost taken out.
Per run: the mean over those steps.

Why telemetry steps are left out: the runner has every server append its placement state to
``TAGMA_TELEMETRY_FILE`` once per telemetry interval, from inside the manager's ``new_step_starts`` (so it is
timed as KV cache manager time). That snapshot is the harness's instrumentation, not serving work, and it
is different code on the two arms (paged's counts runs of block ids over every request's block list);
measured here it costs ~0.5-1 ms, more than a whole decode step of either manager. A step wrote a line when
the line's time ``t`` falls in it: the first step whose record (``end_ns``, made at the end of
``update_from_output``) is at or after ``t``. The steps are chosen by the clock, not by their cost; their
count and their mean are reported next to the headline.

The ratio is tagma / paged (candidate / baseline, as everywhere in the harness); the speedup is its inverse.
Intervals (95%):

* **across runs** (each arm has >= 2 server runs): :func:`harness.analysis.statistics.compare_by_run`, a
  Welch t on the log per-run means. The run is the unit of replication, so run-to-run variance is in the
interval.
* **per step** (always computed; the headline only when an arm has a single run): each run's steps are cut
  into consecutive batches of at least ``MIN_BATCH_STEPS`` steps; an arm's mean is the mean of its steps, its
  standard error the spread of its batch means over the number of batches; the log ratio's standard error
  by the delta method, a Welch t with Welch-Satterthwaite degrees of freedom. Batches keep short-range
  autocorrelation of consecutive steps together; with one run per arm nothing bounds run-to-run variance,
  and the report says so.

Reads files only (the run directory's config.json and runs/*), so it can be recomputed at any time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.runs import arm_of, load_runs, ok_runs
from harness.analysis.statistics import compare_by_run, t_quantile
from harness.config import ARM_NAMES, SavedConfig
from harness.files import read_json
from tagma.contract import PLACEMENT_TELEMETRY_FILE

__all__ = [
    "COMPONENT", "MIN_BATCH_STEPS", "WORKLOAD_NAME", "ArmSteps", "InServerResult", "RunningBin",
    "arm_steps", "batch_means_interval", "find_run", "from_run_dir", "kv_manager_per_step", "markdown",
    "prefix_caching", "run_steps", "telemetry_steps", "telemetry_times_ns",
]  # fmt: skip

COMPONENT = "kv_manager_total_ns_net"
WORKLOAD_NAME = "inserver_64x16k"  # the shipped config's workload (configs/inserver_64x16k.yaml)
MIN_BATCH_STEPS = 10  # consecutive steps per batch at least (per-step interval)
MAX_BATCHES_PER_RUN = 10
# Decode-only steps by requests scheduled, for the descriptive split (lower bounds of the bins).
RUNNING_BINS = (1, 16, 32, 48, 64)
_CACHING = re.compile(r"enable_prefix_caching=(True|False)")


@dataclass
class RunSteps:
    """One server run's busy steps after its warm-up (per-step arrays, in step order)."""

    kv_us: np.ndarray  # KV cache manager CPU per step, us (clock cost subtracted)
    num_reqs: np.ndarray
    num_tokens: np.ndarray
    kv_calls: np.ndarray  # timed KV cache manager calls behind the step's value
    telemetry: np.ndarray  # the step wrote a placement-telemetry line (left out of the headline)

    @property
    def decode_only(self) -> np.ndarray:
        return self.num_tokens == self.num_reqs


@dataclass(frozen=True)
class RunningBin:
    """Decode-only steps with ``low..high`` requests scheduled (one arm, all its runs)."""

    low: int
    high: int | None
    steps: int
    mean_us: float | None
    us_per_request: float | None
    kv_calls_per_step: float | None


@dataclass
class ArmSteps:
    """One arm's headline steps: per run, the selected steps' values."""

    backend: str
    runs: list[str] = field(default_factory=list)  # run directory names
    per_run: list[np.ndarray] = field(default_factory=list)  # selected steps' KV us, one array per run
    per_run_reqs: list[np.ndarray] = field(default_factory=list)
    per_run_calls: list[np.ndarray] = field(default_factory=list)
    telemetry_us: list[np.ndarray] = field(default_factory=list)  # the same selection's telemetry steps
    all_busy_us: list[np.ndarray] = field(default_factory=list)  # every busy step (descriptive)
    bins: list[RunningBin] = field(default_factory=list)
    prefill_steps: int = 0
    prefill_mean_us: float | None = None

    @property
    def steps(self) -> int:
        return int(sum(len(x) for x in self.per_run))

    def pooled(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.empty(0)

    def summary(self) -> dict[str, Any]:
        x, reqs = self.pooled(self.per_run), self.pooled(self.per_run_reqs)
        calls = self.pooled(self.per_run_calls)
        busy = self.pooled(self.all_busy_us)
        tel = self.pooled(self.telemetry_us)
        return {
            "backend": self.backend,
            "runs": list(self.runs),
            "steps": self.steps,
            "steps_per_run": [len(v) for v in self.per_run],
            "mean_us_per_step": float(x.mean()) if x.size else None,
            "median_us_per_step": float(np.median(x)) if x.size else None,
            "per_run_mean_us": [float(v.mean()) if v.size else None for v in self.per_run],
            "mean_running": float(reqs.mean()) if reqs.size else None,
            "min_running": int(reqs.min()) if reqs.size else None,
            "kv_calls_per_step": float(calls.mean()) if calls.size else None,
            "us_per_running_request": float(x.sum() / reqs.sum()) if reqs.size and reqs.sum() else None,
            "telemetry_steps_left_out": int(tel.size),
            "telemetry_steps_mean_us": float(tel.mean()) if tel.size else None,
            "all_busy_steps": int(busy.size),
            "all_busy_mean_us": float(busy.mean()) if busy.size else None,
            "prefill_steps": self.prefill_steps,
            "prefill_mean_us": self.prefill_mean_us,
            "decode_bins": [asdict(b) for b in self.bins],
        }


@dataclass
class InServerResult:
    """The headline comparison: tagma / paged KV cache manager CPU per decode-only step."""

    min_running: int
    backends: tuple[str, str]
    arms: dict[str, ArmSteps]
    baseline_us: float | None  # the headline's arm estimates (geometric mean of run means, or step mean)
    candidate_us: float | None
    ratio: float | None  # candidate / baseline
    ci_low: float | None
    ci_high: float | None
    method: str
    interval: str  # "across runs" | "per step" | "none"
    reason: str | None  # why there is no interval (or why it is per step only)
    per_step: dict[str, Any]  # the per-step interval, always reported
    prefix_caching: dict[str, bool | None]  # run directory name -> enable_prefix_caching from its log

    @property
    def speedup(self) -> float | None:
        return 1.0 / self.ratio if self.ratio else None

    @property
    def speedup_ci(self) -> tuple[float | None, float | None]:
        """The interval of baseline / candidate (the speedup)."""
        inv = lambda x: 1.0 / x if x else None  # noqa: E731
        return inv(self.ci_high), inv(self.ci_low)

    @property
    def caching_off_everywhere(self) -> bool:
        return bool(self.prefix_caching) and all(v is False for v in self.prefix_caching.values())

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.speedup_ci
        return {
            "component": COMPONENT,
            "selection": f"decode-only steps (num_tokens == num_reqs) with >= {self.min_running} requests "
            "scheduled, after warm-up, without the steps that wrote a placement-telemetry line",
            "min_running": self.min_running,
            "backends": list(self.backends),
            "baseline_us_per_step": self.baseline_us,
            "candidate_us_per_step": self.candidate_us,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "speedup": self.speedup,
            "speedup_ci_low": lo,
            "speedup_ci_high": hi,
            "interval": self.interval,
            "method": self.method,
            "reason": self.reason,
            "per_step": self.per_step,
            "prefix_caching": self.prefix_caching,
            "prefix_caching_off_everywhere": self.caching_off_everywhere,
            "arms": {a: s.summary() for a, s in self.arms.items()},
        }


def prefix_caching(run_dir: Path) -> bool | None:
    """``enable_prefix_caching`` as the server logged it at start (None: not found in the log)."""
    log = run_dir / "server.log"
    if not log.exists():
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _CACHING.search(line)
            if m:
                return m.group(1) == "True"
    return None


def telemetry_times_ns(run_dir: Path) -> np.ndarray:
    """When the server wrote its placement-telemetry lines (``t``, as ``time.time_ns()``), sorted."""
    path = run_dir / PLACEMENT_TELEMETRY_FILE
    if not path.exists():
        return np.empty(0, dtype=np.int64)
    times = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                times.append(int(float(json.loads(line)["t"]) * 1e9))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by the server's exit
    return np.sort(np.asarray(times, dtype=np.int64))


def telemetry_steps(end_ns: np.ndarray, times_ns: np.ndarray) -> np.ndarray:
    """Which steps (records made at ``end_ns``, in order) wrote a line at one of ``times_ns``: for each
    line, the first step whose record is at or after it."""
    mark = np.zeros(len(end_ns), dtype=bool)
    idx = np.searchsorted(end_ns, times_ns, side="left")
    mark[idx[idx < len(end_ns)]] = True
    return mark


def run_steps(run: Mapping[str, Any]) -> RunSteps | None:
    """A run's busy steps after its replay started (None: the run has no host-time records)."""
    from harness.analysis.host_time import load_run

    try:
        host = load_run(run["dir"])
    except (FileNotFoundError, ValueError):
        return None
    s = host.steps
    tel = telemetry_steps(s["end_ns"], telemetry_times_ns(Path(run["dir"])))
    keep = (s["num_tokens"] > 0) & (s["end_ns"] >= int(run.get("replay_start_ns") or 0))
    calls = s["kv_calls"] + s["update_kv_calls"] + s["outside_kv_calls"]
    return RunSteps(kv_us=s[COMPONENT][keep] / 1000.0, num_reqs=s["num_reqs"][keep],
                    num_tokens=s["num_tokens"][keep], kv_calls=calls[keep], telemetry=tel[keep])  # fmt: skip


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def arm_steps(backend: str, runs: Sequence[tuple[str, RunSteps]], min_running: int) -> ArmSteps:
    """The headline selection of one arm's runs, plus the descriptive split by requests scheduled."""
    arm = ArmSteps(backend=backend)
    decode_all: list[RunSteps] = []
    prefill: list[np.ndarray] = []
    for name, r in runs:
        full = r.decode_only & (r.num_reqs >= min_running)
        sel = full & ~r.telemetry
        arm.runs.append(name)
        arm.per_run.append(r.kv_us[sel])
        arm.per_run_reqs.append(r.num_reqs[sel])
        arm.per_run_calls.append(r.kv_calls[sel])
        arm.telemetry_us.append(r.kv_us[full & r.telemetry])
        arm.all_busy_us.append(r.kv_us[~r.telemetry])
        decode_all.append(r)
        prefill.append(r.kv_us[~r.decode_only & ~r.telemetry])
    pre = arm.pooled(prefill)
    arm.prefill_steps, arm.prefill_mean_us = int(pre.size), _mean(pre)
    edges = [*RUNNING_BINS, None]
    for low, nxt in zip(edges[:-1], edges[1:], strict=True):
        high = None if nxt is None else nxt - 1
        xs, reqs, calls = [], [], []
        for r in decode_all:
            m = r.decode_only & ~r.telemetry & (r.num_reqs >= low)
            if high is not None:
                m &= r.num_reqs <= high
            xs.append(r.kv_us[m])
            reqs.append(r.num_reqs[m])
            calls.append(r.kv_calls[m])
        x, q, c = arm.pooled(xs), arm.pooled(reqs), arm.pooled(calls)
        arm.bins.append(RunningBin(low=low, high=high, steps=int(x.size), mean_us=_mean(x),
                                   us_per_request=float(x.sum() / q.sum()) if q.size and q.sum() else None,
                                   kv_calls_per_step=_mean(c)))  # fmt: skip
    return arm


def _batches(x: np.ndarray) -> list[np.ndarray]:
    k = min(MAX_BATCHES_PER_RUN, len(x) // MIN_BATCH_STEPS)
    return np.array_split(x, k) if k >= 1 else []


def batch_means_interval(
    baseline: Sequence[np.ndarray], candidate: Sequence[np.ndarray], alpha: float = 0.05
) -> dict[str, Any]:
    """The per-step interval of mean(candidate) / mean(baseline) (see the module docstring).

    Each argument holds one array of per-step values per run, in step order. Returns the ratio, its
    interval (None when an arm has fewer than 2 batches or no spread), the batches and the degrees of
    freedom."""
    out: dict[str, Any] = {"ratio": None, "ci_low": None, "ci_high": None, "df": None, "batches": [0, 0],
                           "method": f"per step: batch means over >= {MIN_BATCH_STEPS} consecutive steps, "
                                     "delta-method Welch t on the log ratio", "reason": None}  # fmt: skip
    parts = []
    for k, groups in enumerate((baseline, candidate)):
        x = np.concatenate([np.asarray(g, dtype=float) for g in groups]) if groups else np.empty(0)
        means = np.asarray([b.mean() for g in groups for b in _batches(np.asarray(g, dtype=float))])
        out["batches"][k] = len(means)
        parts.append((x, means))
    (xa, ma), (xb, mb) = parts
    if not xa.size or not xb.size:
        out["reason"] = "an arm has no selected step"
        return out
    mean_a, mean_b = float(xa.mean()), float(xb.mean())
    if mean_a <= 0 or mean_b <= 0:
        out["reason"] = "an arm's mean is 0 or negative: no ratio"
        return out
    out["ratio"] = mean_b / mean_a
    if len(ma) < 2 or len(mb) < 2:
        out["reason"] = f"an arm has fewer than 2 batches of {MIN_BATCH_STEPS} steps: no interval"
        return out
    # var of each arm's log mean (delta method): var(batch means) / k / mean^2
    va = float(ma.var(ddof=1)) / len(ma) / mean_a**2
    vb = float(mb.var(ddof=1)) / len(mb) / mean_b**2
    se = math.sqrt(va + vb)
    if se == 0:
        out["reason"] = "no spread between batches: noise unknown"
        return out
    df = (va + vb) ** 2 / sum(v * v / (len(m) - 1) for v, m in ((va, ma), (vb, mb)) if v > 0)
    half = t_quantile(1 - alpha / 2, df) * se
    d = math.log(out["ratio"])
    out.update(ci_low=math.exp(d - half), ci_high=math.exp(d + half), df=df)
    return out


def kv_manager_per_step(runs: Sequence[dict], config: SavedConfig | Mapping[str, Any],
                        min_running: int | None = None, alpha: float = 0.05) -> InServerResult:  # fmt: skip
    """The headline of a run directory's runs (``harness.analysis.runs.load_runs``) under its config."""
    cfg = SavedConfig.of(config)
    backends = cfg.backends
    if min_running is None:
        ins = cfg.section("inserver")
        min_running = int(ins.get("min_running") or cfg.section("load").get("max_concurrency") or 1)
    if min_running < 1:
        raise ValueError(f"min_running must be >= 1, got {min_running}")
    arms: dict[str, ArmSteps] = {}
    caching: dict[str, bool | None] = {}
    for arm, backend in zip(ARM_NAMES, backends, strict=True):
        with_steps = []
        for r in ok_runs(runs, arm, backends):
            caching[Path(r["dir"]).name] = prefix_caching(Path(r["dir"]))
            if (s := run_steps(r)) is not None:
                with_steps.append((Path(r["dir"]).name, s))
        arms[arm] = arm_steps(backend, with_steps, min_running)
    base, cand = (arms[a] for a in ARM_NAMES)
    per_step = batch_means_interval(base.per_run, cand.per_run, alpha)
    by_run = compare_by_run("kv_manager_us_per_decode_step", [x for x in base.per_run if x.size],
                            [x for x in cand.per_run if x.size], "mean", alpha=alpha)  # fmt: skip
    result = InServerResult(
        min_running=min_running, backends=(backends[0], backends[1]), arms=arms, baseline_us=None,
        candidate_us=None, ratio=None, ci_low=None, ci_high=None, method="", interval="none", reason=None,
        per_step=per_step, prefix_caching=caching,
    )  # fmt: skip
    if not base.steps or not cand.steps:
        empty = [a for a, s in arms.items() if not s.steps]
        result.reason = (f"no decode-only step with >= {min_running} requests running in the "
                         f"{' and '.join(empty)} arm")  # fmt: skip
        return result
    if by_run.ci_low is not None:
        result.baseline_us, result.candidate_us = by_run.baseline, by_run.candidate
        result.ratio, result.ci_low, result.ci_high = by_run.ratio, by_run.ci_low, by_run.ci_high
        result.method, result.interval = f"across runs: {by_run.method}", "across runs"
        return result
    xa, xb = base.pooled(base.per_run), cand.pooled(cand.per_run)
    result.baseline_us, result.candidate_us = float(xa.mean()), float(xb.mean())
    result.ratio = per_step["ratio"]
    result.method = per_step["method"]
    why = by_run.reason or "no across-run interval"
    if per_step["ci_low"] is not None:
        result.ci_low, result.ci_high = per_step["ci_low"], per_step["ci_high"]
        result.interval = "per step"
        result.reason = f"{why}; the interval is within-run only (no run-to-run variance)"
    else:
        result.reason = f"{why}; {per_step['reason']}"
    return result


def from_run_dir(root: str | Path, min_running: int | None = None) -> InServerResult:
    """The headline of one serve run directory."""
    root = Path(root)
    return kv_manager_per_step(load_runs(root), SavedConfig.load(root), min_running)


def find_run(results_dir: str | Path, workload_name: str = WORKLOAD_NAME, aa: bool = False) -> Path | None:
    """The newest run directory under ``results_dir`` made with that workload in which both arms have an ok
    run (newest by its config.json's modification time); None when there is none. ``aa``: an A/A run (the
    same backend on both arms, the calibration), else an A/B run only: an A/A is never taken for tagma's."""
    found: list[tuple[float, Path]] = []
    for cfg_path in Path(results_dir).glob("*/config.json"):
        root = cfg_path.parent
        if root.is_symlink():  # "latest"
            continue
        try:
            config = SavedConfig.from_dict(read_json(cfg_path))
        except (OSError, ValueError, TypeError):
            continue
        if config.section("workload").get("name") != workload_name or config.is_aa != aa:
            continue
        backends = config.backends
        runs = [{"dir": d, **read_json(d / "status.json")} for d in sorted((root / "runs").glob("*-*"))
                if (d / "status.json").exists()]  # fmt: skip
        if all(any(r["status"] == "ok" and arm_of(r, backends) == a for r in runs) for a in ARM_NAMES):
            found.append((cfg_path.stat().st_mtime, root))
    return max(found)[1] if found else None


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def markdown(res: InServerResult) -> list[str]:
    """The serve report's section."""
    b, c = (res.arms[a] for a in ARM_NAMES)
    lo, hi = res.speedup_ci
    caching = sorted({str(v) for v in res.prefix_caching.values()})
    lines = [
        "",
        f"## KV cache manager CPU per scheduler step (decode-only steps, >= {res.min_running} running)",
        "",
        "Every KV cache manager call of a step (schedule(), update_from_output(), between steps), thread CPU "
        f"time with the clock's cost subtracted, on decode-only steps (num_tokens == num_reqs) with >= "
        f"{res.min_running} requests scheduled, after warm-up, leaving out the steps that wrote a "
        "placement-telemetry line (the harness's snapshot runs inside the manager's new_step_starts; "
        "every table below leaves them out too, their count and mean are in the last column). Prefix "
        "caching per run (from each server's "
        f"log): {', '.join(caching) or 'unknown'}"
        + (" (off on both arms)." if res.caching_off_everywhere else " (**not off everywhere**)."),
        "",
        f"- {b.backend}: {_f(res.baseline_us)} us/step; {c.backend}: {_f(res.candidate_us)} us/step; "
        f"ratio {c.backend}/{b.backend} {_f(res.ratio)} "
        + (f"[{_f(res.ci_low)}, {_f(res.ci_high)}]" if res.ci_low is not None else "(no interval)")
        + f"; {b.backend}/{c.backend} {_f(res.speedup)} "
        + (f"[{_f(lo)}, {_f(hi)}]" if lo is not None else "")
        + f" (95%, {res.method or 'no interval'})",
    ]
    if res.reason:
        lines.append(f"- {res.reason}")
    ps = res.per_step
    if ps.get("ci_low") is not None and res.interval != "per step":
        lines.append(f"- per-step interval for comparison: ratio {_f(ps['ratio'])} [{_f(ps['ci_low'])}, "
                     f"{_f(ps['ci_high'])}] ({ps['batches'][0]}/{ps['batches'][1]} batches)")  # fmt: skip
    lines += ["", "| arm | runs | steps counted | mean running | KV calls/step | us/step (per run) | "
              "us per running request | all busy steps: n, us/step | steps with prefill: n, us/step | "
              "left out (telemetry): n, us/step |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in (b, c):
        s = arm.summary()
        per_run = ", ".join(_f(v) for v in s["per_run_mean_us"])
        lines.append(
            f"| {arm.backend} | {len(arm.runs)} | {s['steps']} | {_f(s['mean_running'])} | "
            f"{_f(s['kv_calls_per_step'])} | {per_run} | {_f(s['us_per_running_request'])} | "
            f"{s['all_busy_steps']}, {_f(s['all_busy_mean_us'])} | {s['prefill_steps']}, "
            f"{_f(s['prefill_mean_us'])} | {s['telemetry_steps_left_out']}, "
            f"{_f(s['telemetry_steps_mean_us'])} |"
        )
    lines += ["", "Decode-only steps by requests scheduled (descriptive):", "",
              "| requests | " + " | ".join(f"{a.backend}: steps, us/step, us/request" for a in (b, c)) + " |",
              "|---|---|---|"]  # fmt: skip
    for bb, cb in zip(b.bins, c.bins, strict=True):
        label = f"{bb.low}-{bb.high}" if bb.high is not None else f">= {bb.low}"
        cells = [f"{x.steps}, {_f(x.mean_us)}, {_f(x.us_per_request)}" for x in (bb, cb)]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return lines
