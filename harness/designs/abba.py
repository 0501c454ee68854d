"""The ABBA design: one server at a time; each arm gets ``run.repeats`` server lifetimes in ABBA order (drift
over time hits both arms alike); each lifetime replays the whole workload with the configured load.

Comparison: every latency statistic (mean, p50, p90, p99 of TTFT, TPOT, ITL, E2EL) is computed per server
run, then compared between the arms' runs (run-to-run variance is in the interval); throughputs are one value
per run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness.analysis.runs import LATENCY_KEYS, LATENCY_STATS, RUN_KEYS, ok_runs, request_values
from harness.analysis.statistics import Comparison, compare_by_run, compare_run_values
from harness.client import run_requests
from harness.config import ARM_NAMES, Arm, BenchConfig
from harness.designs.base import Design, HostSteps
from harness.designs.server_run import RunFailed, ServerRun, failure_reason, run_dir_name, run_is_done
from harness.files import read_json, write_json
from harness.serve.launcher import ServerError
from harness.serve.noise import pinned
from harness.workload.arrivals import arrival_offsets
from harness.workload.spec import Workload


def abba_order(repeats: int, a: Arm, b: Arm) -> list[Arm]:
    """A B B A A B B A ...: each arm `repeats` times, so drift over time hits both arms alike."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    order: list[Arm] = []
    for i in range(repeats):
        order += [a, b] if i % 2 == 0 else [b, a]
    return order


async def replay_workload(
    cfg: BenchConfig, base_url: str, workload: Workload, bar: tqdm
) -> tuple[list, float]:
    """The workload sent to one server under the configured load; (results, duration in s)."""
    if cfg.load.mode == "trace":
        if workload.arrivals is None:
            raise RunFailed(
                f"load=trace needs a trace workload (kind mooncake); {workload.spec.name} has no "
                f"arrival times"
            )
        offsets = workload.arrivals
    else:
        offsets = arrival_offsets(len(workload.requests), cfg.load)
    return await asyncio.wait_for(
        run_requests(
            base_url,
            cfg.model.path,
            workload.requests,
            offsets,
            max_concurrency=cfg.load.max_concurrency if cfg.load.mode == "closed" else None,
            timeout_s=cfg.run.request_timeout_s,
            progress=lambda _r: bar.update(1),
        ),
        timeout=cfg.run.run_timeout_s,
    )


def unmeasured_lifetime(
    cfg: BenchConfig,
    arm: Arm,
    warmup: Workload,
    workload: Workload | None,
    replay_cfg: BenchConfig,
    run_dir: Path,
    **record: Any,
) -> dict:
    """A server lifetime nobody measures (``run.warmup_lifetimes``, the regime map's ``warmup_lifetimes``):
    started, warmed up with ``warmup``'s requests, given ``workload`` once under ``replay_cfg``'s load, and
    stopped. In an A/A of 8 lifetimes per arm the first lifetime of the series was the slowest of all 16 on
    every metric (FINDINGS.md, the A/A order check), and ABBA gives that slot to the baseline: this lifetime
    takes it. Only its status.json (status ``warmup``, plus ``record``) and server log are kept; a failure is
    recorded there, not raised, and the measured lifetimes go on. Returns the status."""
    run = ServerRun(cfg, arm, -1, run_dir)
    reason: str | None = None
    try:
        with run:
            run.warm_up(warmup)
            if workload is not None:
                bar = tqdm(total=len(workload.requests), leave=False, unit="req", desc=f"warm-up {arm.label}")
                with pinned(run.client_cores()), bar:
                    asyncio.run(replay_workload(replay_cfg, run.base_url, workload, bar))
    except Exception as e:  # noqa: BLE001 - unmeasured: recorded, the measured lifetimes go on
        reason = f"{type(e).__name__}: {e}"
    status = {**run.status, "status": "warmup", "reason": reason, **record}
    write_json(run_dir / "status.json", status)
    return status


def run_one(cfg: BenchConfig, arm: Arm, index: int, workload: Workload, run_dir: Path) -> dict:
    """One server lifetime of the ABBA design. Returns its status dict (also written to status.json, last)."""
    run = ServerRun(cfg, arm, index, run_dir)
    try:
        with run:
            run.warm_up(workload)
            run.begin_replay()
            desc = f"run {index:02d} {arm.label}"
            with pinned(run.client_cores()), tqdm(total=len(workload.requests), desc=desc, unit="req",
                                                  leave=False) as bar:  # fmt: skip
                results, duration = asyncio.run(replay_workload(cfg, run.base_url, workload, bar))
            run.finish(results, duration)
    except (ServerError, TimeoutError, RunFailed) as e:
        return run.write_status(failure_reason(cfg, e))
    return run.write_status()


def run_abba(cfg: BenchConfig, workload: Workload) -> list[dict]:
    """Every repeat of both arms in ABBA order; skips runs already done in cfg.out_dir. Before the first run
    still to do, ``run.warmup_lifetimes`` unmeasured lifetimes of its arm (cfg.out_dir/warmup/)."""
    statuses = []
    order = list(enumerate(abba_order(cfg.run.repeats, *cfg.arms)))
    done = {i for i, arm in order if run_is_done(cfg.out_dir / "runs" / run_dir_name(i, arm))}
    todo = [(i, arm) for i, arm in order if i not in done]
    for k in range(cfg.run.warmup_lifetimes if todo else 0):
        arm = todo[0][1]
        warm_dir = cfg.out_dir / "warmup" / f"{k:02d}-{arm.name}-{arm.backend}"
        unmeasured_lifetime(cfg, arm, workload, workload, cfg, warm_dir)
    for index, arm in tqdm(order, desc="A/B runs", unit="run"):
        run_dir = cfg.out_dir / "runs" / run_dir_name(index, arm)
        if index in done:
            statuses.append(read_json(run_dir / "status.json"))
            continue
        status = run_one(cfg, arm, index, workload, run_dir)
        if status["status"] != "ok":
            tqdm.write(f"run {index:02d} {arm.label} FAILED: {status['reason'].splitlines()[0]}")
        statuses.append(status)
    return statuses


def rows(runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int) -> list[Comparison]:
    base, cand = ok_runs(runs, ARM_NAMES[0], backends), ok_runs(runs, ARM_NAMES[1], backends)
    out: list[Comparison] = []
    for key in LATENCY_KEYS:
        a = [request_values(r, key) for r in base]
        b = [request_values(r, key) for r in cand]
        for stat_name in LATENCY_STATS:
            name = f"{stat_name}_{key}"
            out.append(compare_by_run(name, a, b, stat_name, lower_is_better=True, primary=name in primary,
                                      n_boot=n_boot))  # fmt: skip
    for key in RUN_KEYS:
        a = [r["summary"].get(key) for r in base]
        b = [r["summary"].get(key) for r in cand]
        if all(v is None for v in a + b):
            continue
        out.append(compare_run_values(key, a, b, lower_is_better=False, primary=key in primary))
    return out


def host_rows(component: str, steps: HostSteps, n_boot: int) -> list[Comparison]:
    """Nothing beyond the per-step rows: requests of different arms ran minutes apart, unpaired."""
    return []


DESIGN = Design(
    name="abba",
    run=run_abba,
    rows=rows,
    host_rows=host_rows,
    samples_note=lambda n: f"up to {n} requests per arm",
    runs_heading="ABBA order",
)
