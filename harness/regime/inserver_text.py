"""FINDINGS.md's calibration of the in-server KV manager row: an A/A (paged vs paged) of
``make bench-inserver`` at the row's own size (64 concurrent 16K requests, caching off), whose interval
shows what the statistic calls a difference between identical servers.

``python -m harness.regime.inserver_text results/serve/<A/A run id>`` copies the run's result (the statistic
of :mod:`harness.analysis.inserver`, not its samples) to ``findings/inserver/<run id>.json``, the path
``inserver_aa`` in findings/sources.yaml names. Only an A/A run of that workload with an interval across runs
is accepted: an A/B run, another workload or a one-run-per-arm A/A is refused."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.analysis.inserver import WORKLOAD_NAME, from_run_dir
from harness.config import SavedConfig
from harness.files import read_json, write_json
from harness.regime.collect import REPO
from harness.regime.gpu_text import fmt

__all__ = ["INSERVER_SCHEMA", "inserver_aa_answer", "inserver_aa_problems", "inserver_aa_section", "record"]

INSERVER_SCHEMA = "tagma-inserver-aa/1"


def inserver_aa_problems(rec: Mapping[str, Any]) -> list[str]:
    """Why a record cannot be the calibration: not one, not an A/A, another workload, or no interval."""
    if rec.get("schema") != INSERVER_SCHEMA:
        return [f"inserver_aa: schema {rec.get('schema')!r}, expected {INSERVER_SCHEMA!r}"]
    problems = []
    backends = rec.get("backends") or []
    if len(set(backends)) != 1:
        problems.append(f"inserver_aa: backends {backends} are not an A/A")
    if rec.get("workload") != WORKLOAD_NAME:
        problems.append(f"inserver_aa: workload {rec.get('workload')!r}, expected {WORKLOAD_NAME!r}")
    result = rec.get("result") or {}
    if result.get("interval") != "across runs" or result.get("ci_low") is None:
        problems.append(f"inserver_aa: no interval across runs ({result.get('reason')})")
    return problems


def record(run_dir: Path) -> dict[str, Any]:
    """The calibration record of an A/A run directory, its problems checked first."""
    config = SavedConfig.load(run_dir)
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").exists() else {}
    result = from_run_dir(run_dir).to_dict()
    result.pop("per_step", None)
    rec = {
        "schema": INSERVER_SCHEMA,
        "run_id": run_dir.name,
        "backends": list(config.backends),
        "workload": config.section("workload").get("name"),
        "concurrency": config.section("load").get("max_concurrency"),
        "environment": {k: env.get(k) for k in ("cpu", "cpu_count", "git", "packages", "loadavg")},
        "runs": [read_json(d / "status.json") for d in sorted((run_dir / "runs").glob("*-*"))
                 if (d / "status.json").exists()],  # fmt: skip
        "result": result,
    }
    if problems := inserver_aa_problems(rec):
        raise ValueError("; ".join(problems))
    return rec


def inserver_aa_answer(sources: Mapping[str, Any]) -> list[str]:
    """The answer's bullet on the in-server row's calibration (empty without an A/A record)."""
    rec = sources.get("inserver_aa")
    if not rec:
        return []
    res = rec["result"]
    lo, hi = res["ci_low"], res["ci_high"]
    holds = "no false difference" if lo <= 1.0 <= hi else "a false difference"
    return [
        f"- In-server calibration (run {rec['run_id']}): between identical paged servers at 64 x 16K the KV "
        f"manager's CPU per decode step came out {fmt(res['ratio'])} [{fmt(lo)}, {fmt(hi)}] with "
        f"{len(res['arms']['baseline']['runs'])} lifetimes per arm ({holds}); an A/B ratio inside that band "
        "is not resolved at this size."
    ]


def inserver_aa_section(sources: Mapping[str, Any]) -> list[str]:
    """The calibration lines under the host section (empty without an A/A record)."""
    rec = sources.get("inserver_aa")
    if not rec:
        return []
    res = rec["result"]
    git = (rec.get("environment") or {}).get("git") or {}
    b, c = res["arms"]["baseline"], res["arms"]["candidate"]
    lo, hi = res["ci_low"], res["ci_high"]
    holds = lo <= 1.0 <= hi
    half = max(1.0 - lo, hi - 1.0) * 100
    return [
        "### Calibration of the in-server row: an A/A at its own size",
        "",
        f"`make bench-inserver ARGS=\"backends=[paged,paged]\"` (run {rec['run_id']}, commit "
        f"{str(git.get('commit'))[:10]}{' (dirty)' if git.get('dirty') else ''}): the same statistic between "
        f"two identical paged servers, {len(b['runs'])} lifetimes per arm in ABBA order, 64 concurrent "
        "15.9-16.4K-token prompts, caching off. Its interval is what the statistic calls a difference where "
        "there is none.",
        "",
        "| row | baseline us/step | candidate us/step | candidate / baseline | 95% interval "
        "| no false difference | steps | run |",
        "|---|---|---|---|---|---|---|---|",
        f"| A/A: KV manager CPU per decode-only step (paged vs paged) | {fmt(res['baseline_us_per_step'])} | "
        f"{fmt(res['candidate_us_per_step'])} | {fmt(res['ratio'])} | [{fmt(lo)}, {fmt(hi)}] | "
        f"{'yes' if holds else '**no**'} | {b['steps']}/{c['steps']} | {rec['run_id']} |",
        "",
        f"Between identical servers the interval reaches {half:.0f}% from 1.00"
        + (": the A/B row's interval is read against that spread." if holds else
           ": it excludes 1, so the statistic calls identical servers different at this size and the A/B "
           "row's interval cannot be leaned on.")
        + " " + " ".join(sources.get("inserver_aa_notes") or ()),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Copy an in-server A/A run's result into findings/inserver/.")
    p.add_argument("run_dir", type=Path, help="results/serve/<A/A run id>")
    p.add_argument("--findings", type=Path, default=REPO / "findings")
    args = p.parse_args(argv)
    rec = record(args.run_dir)
    out = args.findings / "inserver" / f"{rec['run_id']}.json"
    write_json(out, rec)
    print(f"{out}\nin findings/sources.yaml: inserver_aa: inserver/{rec['run_id']}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
