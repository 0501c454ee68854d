"""A run directory's server runs as the analysis reads them, and the samples each comparison draws from them.

Shared by the designs' comparison rows (harness.designs), the report, the in-server statistic and the plots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from harness.config import ARM_NAMES
from harness.files import read_json, read_jsonl

LATENCY_STATS = ("mean", "p50", "p90", "p99")  # names of harness.analysis.statistics.STATS
LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
RUN_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")


def arm_of(run: Mapping, backends: Sequence[str]) -> str:
    """A run's arm; runs recorded before arms were named are placed by their backend."""
    if run.get("arm"):
        return str(run["arm"])
    return ARM_NAMES[0] if run["backend"] == backends[0] else ARM_NAMES[1]


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
