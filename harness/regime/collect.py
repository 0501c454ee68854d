"""`python -m harness.regime.collect <map dir> [--out PATH]`: one map's groups joined into one JSON file.

The file is what FINDINGS.md is written from (:mod:`harness.regime.findings`): every cell's verdicts,
intervals, MDEs, step composition and prediction, with the run directories they came from, the commits
and the machine. It is small and is committed under ``findings/maps/`` so that the findings regenerate on
a fresh clone, where the raw runs (``results/``, not in git) are absent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.files import read_json, write_json

__all__ = ["collect", "structure_problems"]

REPO = Path(__file__).resolve().parents[2]
FINDINGS_MAPS = REPO / "findings" / "maps"
CELL_KEYS = (
    "cell",
    "group",
    "prefix_caching",
    "backends",
    "aa",
    "runs",
    "metrics",
    "host",
    "composition",
    "prediction",
)
METRIC_KEYS = ("ratio", "ci", "verdict", "mde", "runs")


def _machine(env: dict[str, Any]) -> dict[str, Any]:
    keep = ("hostname", "cpu", "cpu_isa", "cpu_count", "memory_bytes", "platform", "python", "packages",
            "gpus", "enforce_eager")  # fmt: skip
    return {k: env[k] for k in keep if k in env}


def _load(job_dir: Path) -> dict[str, float] | None:
    """The 1-minute load average at the start of the job's segments (mean, max): what ran beside them."""
    loads = [read_json(p).get("loadavg_before") for p in job_dir.glob("cells/*/runs/*/status.json")]
    loads = [float(x) for x in loads if x is not None]
    return {"mean": round(sum(loads) / len(loads), 2), "max": max(loads)} if loads else None


def _warmup_lifetimes(job_dir: Path) -> int:
    """How many unmeasured warm-up lifetimes the job served to the end (their status files), whatever its
    config said."""
    done = [read_json(p) for p in job_dir.glob("lifetimes/warmup-*/*/status.json")]
    return sum(1 for s in done if s.get("status") == "warmup" and not s.get("reason"))


def collect(map_dir: Path) -> dict[str, Any]:
    """The map at ``map_dir`` as one record (jobs in the order their folders sort)."""
    jobs = []
    machines, commits = [], set()
    for summary in sorted(map_dir.glob("*/group_summary.json")):
        job_dir = summary.parent
        data = read_json(summary)
        env = read_json(job_dir / "environment.json") if (job_dir / "environment.json").exists() else {}
        wall = read_json(job_dir / "wall.json") if (job_dir / "wall.json").exists() else {}
        commit = (env.get("git") or {}).get("commit")
        commits.add(commit)
        machines.append(_machine(env))
        jobs.append(
            {
                **data,
                "run_id": f"{map_dir.name}/{job_dir.name}",
                "commit": commit,
                "dirty": (env.get("git") or {}).get("dirty"),
                "wall_s": wall.get("wall_s"),
                "load": _load(job_dir),
                "warmup_lifetimes": _warmup_lifetimes(job_dir),
            }
        )
    if not jobs:
        raise FileNotFoundError(f"{map_dir}: no */group_summary.json (run the map's jobs first)")
    return {
        "map_id": map_dir.name,
        "profile": jobs[0]["profile"],
        "machine": machines[0],
        "machines_differ": any(m != machines[0] for m in machines),
        "commits": sorted(c for c in commits if c),
        "wall_s": sum(j["wall_s"] or 0.0 for j in jobs),
        "jobs": jobs,
    }


def structure_problems(record: dict[str, Any]) -> list[str]:
    """What a collected map lacks (an empty list: the structure the findings need is all there)."""
    problems = []
    for key in ("map_id", "profile", "machine", "commits", "jobs"):
        if key not in record:
            problems.append(f"map: no {key}")
    for job in record.get("jobs", []):
        if not job.get("run_id"):
            problems.append(f"job {job.get('job')}: no run id")
        for cell in job.get("cells", []):
            name = f"{job.get('job')}/{cell.get('cell', {}).get('name')}"
            problems += [f"{name}: no {k}" for k in CELL_KEYS if k not in cell]
            for metric, row in (cell.get("metrics") or {}).items():
                problems += [f"{name} {metric}: no {k}" for k in METRIC_KEYS if k not in row]
                if row.get("verdict") == "inconclusive" and row.get("mde") is None and min(row["runs"]) >= 2:
                    problems.append(f"{name} {metric}: inconclusive without a minimum detectable effect")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("map_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="default: findings/maps/<map id>.json")
    args = p.parse_args(argv)
    record = collect(args.map_dir)
    if problems := structure_problems(record):
        print("\n".join(problems), file=sys.stderr)
        return 1
    out = args.out or FINDINGS_MAPS / f"{record['map_id']}.json"
    write_json(out, record)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
