"""FINDINGS.md's paired runs: `make bench-cpu` runs of the paired design (both servers up, each prompt sent to
both, one request or one wave of prompts in flight), A/B and A/A at the same cell, each with its verdicts and
its check of the order within a pair.

``python -m harness.regime.paired_text results/serve/<run id>`` writes the run's record (its primary rows,
its in-server rows per request, the slot check, the cell, the commit and the machine) to
``findings/serve/<run id>.json``; ``paired_runs`` in findings/sources.yaml names the records the document
shows. Only a paired run is accepted."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis.compare import HOST_COMPONENTS, STEP_PARTS
from harness.analysis.runs import load_runs
from harness.analysis.statistics import DIRECTION_VERDICTS
from harness.config import SavedConfig
from harness.designs.paired import openers, slot_lines
from harness.files import read_json, write_json
from harness.regime.collect import REPO
from harness.regime.gpu_text import fmt

__all__ = [
    "PAIRED_SCHEMA", "opening_bias", "paired_answer", "paired_problems", "paired_section", "record",
    "step_table",
]  # fmt: skip

PAIRED_SCHEMA = "tagma-paired-run/1"
BIASED = " (biased opening)"  # the table's mark on a run taken before the opening pause (opening_bias)
HOST_ROWS = ("kv_manager_us_per_request", "worker_prepare_us_per_request")
# A busy step whole, per step (mean): the scheduler's parts, the worker's preparation, execute_model's parts.
STEP_ROWS = tuple(f"{name}_us_per_step_mean" for name in (*HOST_COMPONENTS, *STEP_PARTS))


def paired_problems(rec: Mapping[str, Any]) -> list[str]:
    """Why a record cannot be shown: not one, or not a paired run with its primary rows."""
    name = rec.get("run_id", "?")
    if rec.get("schema") != PAIRED_SCHEMA:
        return [f"paired run {name}: schema {rec.get('schema')!r}, expected {PAIRED_SCHEMA!r}"]
    if rec.get("design") != "paired" or not rec.get("primary"):
        return [f"paired run {name}: design {rec.get('design')!r} with {len(rec.get('primary') or [])} rows"]
    return []


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("metric", "ratio", "ci_low", "ci_high", "p_adjusted", "verdict", "samples")
    return {k: r.get(k) for k in keep}


def _step_rows(host_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The whole step's rows (each arm's mean per busy step in us, and their ratio), or none where a part is
    missing (a run before the worker's parts were timed)."""
    by_metric = {r.get("metric"): r for r in host_rows}
    if not all(m in by_metric for m in STEP_ROWS):
        return []
    means = ("baseline", "candidate")
    return [{**_row(by_metric[m]), **{k: by_metric[m][k] for k in means}} for m in STEP_ROWS]


def record(run_dir: Path) -> dict[str, Any]:
    """The record of a paired run directory, its problems checked first."""
    config = SavedConfig.load(run_dir)
    summary = read_json(run_dir / "summary.json")
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").exists() else {}
    workload = config.section("workload")
    run = config.section("run")
    extra = config.section("server").get("extra_args") or []
    runs = load_runs(run_dir)
    rec = {
        "schema": PAIRED_SCHEMA,
        "run_id": run_dir.name,
        "design": summary.get("design"),
        "kind": summary.get("kind"),
        "backends": list(config.backends),
        "model": config.section("model").get("name"),
        "cell": {
            "prompt_tokens": [(workload.get("input_len") or {}).get(k) for k in ("low", "high")],
            "output_tokens": (workload.get("output_len") or {}).get("value"),
            "prefix_caching": "--no-enable-prefix-caching" not in extra,
            "requests": workload.get("num_requests"),
            "concurrency": config.section("load").get("max_concurrency") or 1,  # a wave's prompts
            "rounds": run.get("repeats"),
            "pair_gap_s": run.get("pair_gap_s", 0.0),  # runs before the pause existed had none
        },
        "environment": {k: env.get(k) for k in ("cpu", "cpu_isa", "cpu_count", "git", "packages")},
        "primary": [_row(r) for r in summary["ab"] if r.get("primary")],
        "host": [_row(r) for r in summary.get("host_time") or () if r.get("metric") in HOST_ROWS],
        "step": _step_rows(summary.get("host_time") or ()),
        "slots": slot_lines(runs, config.backends),
        "openers": openers(runs, config.backends),
    }
    if problems := paired_problems(rec):
        raise ValueError("; ".join(problems))
    return rec


def opening_bias(rec: Mapping[str, Any]) -> bool:
    """Whether the run was taken with the biased opening: before the paired design paused after the warm-ups
    and let rounds take turns at opening, every round's first wave went to the baseline right after the
    candidate's warm-up, with the candidate's readers still spinning. Records from before the fix carry no
    ``openers``; a run of several rounds all opened by one arm is one of them."""
    opened = rec.get("openers")
    return opened is None or (len(opened) > 1 and len(set(opened)) == 1)


def _metric(r: Mapping[str, Any]) -> str:
    ci = f" [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]" if r.get("ci_low") is not None else ""
    return f"{fmt(r['ratio'])}{ci} **{r['verdict']}**"


def _label(rec: Mapping[str, Any]) -> str:
    cell = rec["cell"]
    low, high = cell["prompt_tokens"]
    tokens = f"{low}" if low == high else f"{low}-{high}"
    caching = "caching on" if cell["prefix_caching"] else "caching off"
    waves = cell.get("concurrency") or 1  # records before waves sent one request at a time
    sent = f" in waves of {waves}" if waves > 1 else ""
    return (f"{rec['model']}, {tokens} x {cell['output_tokens']} tok, {caching}, {cell['requests']} prompts"
            f"{sent} x {cell['rounds']} rounds, pause {fmt(cell['pair_gap_s'] or 0)} s")  # fmt: skip


def _aa(rec: Mapping[str, Any]) -> bool:
    return len(set(rec["backends"])) == 1


def paired_answer(sources: Mapping[str, Any]) -> list[str]:
    """The answer's bullets on the paired runs: their supported verdicts, and their A/As' false ones."""
    runs: Sequence[Mapping[str, Any]] = sources.get("paired_runs") or []
    if not runs:
        return []
    lines = []
    biased = [rec for rec in runs if opening_bias(rec)]
    clean = [rec for rec in runs if not opening_bias(rec)]
    for rec in clean:
        calls = [r for r in rec["primary"] if r["verdict"] in DIRECTION_VERDICTS]
        if not calls:
            continue
        what = "false verdicts between identical servers" if _aa(rec) else "supported differences"
        listed = "; ".join(f"{r['metric']} {_metric(r)}" for r in calls)
        lines.append(f"- Paired run {rec['run_id']} ({_label(rec)}), {what}: {listed}.")
    aa_tests = [r for rec in clean if _aa(rec) for r in rec["primary"]]
    false = [r for r in aa_tests if r["verdict"] in DIRECTION_VERDICTS]
    lines.append(
        f"- Paired runs: {len(clean)} with the opening pause (section 'Paired runs'); their A/As made "
        f"{len(false)} false verdicts in {len(aa_tests)} metric tests."
    )
    if biased:
        called = sum(any(r["verdict"] in DIRECTION_VERDICTS for r in rec["primary"]) for rec in biased)
        lines.append(
            f"- {len(biased)} paired runs were taken with the biased opening (every round's first wave "
            "went to the baseline while the candidate's server, warmed up last, still spun), "
            f"{called} of them with verdicts: they are kept in section 'Paired runs', marked, and none of "
            "their verdicts is counted here."
        )
    return lines


def paired_section(sources: Mapping[str, Any]) -> list[str]:
    """The paired runs' table and notes (empty without records)."""
    runs: Sequence[Mapping[str, Any]] = sources.get("paired_runs") or []
    if not runs:
        return []
    names = [r["metric"] for r in runs[0]["primary"]]
    lines = [
        "## Paired runs: both servers up, each prompt to both",
        "",
        "`make bench-cpu` with `run.design=paired`: each prompt goes to one server and then the other (the "
        "first alternating pair by pair), one request in flight (or one wave of prompts sent at once, the "
        "first arm alternating wave by wave), fresh servers each round; intervals are per request pair "
        "(batch jackknife, waves kept whole), verdicts Holm-corrected over the run's five primary metrics.",
        "",
        "| run | kind | cell | " + " | ".join(names) + " | KV manager / request | worker prepare / request "
        "| commit, machine |",
        "|" + "---|" * (len(names) + 6),
    ]
    for rec in runs:
        host = {r["metric"]: r for r in rec["host"]}
        cells = [_metric(r) for r in rec["primary"]]
        parts = [_metric(host[m]).replace(" **descriptive**", "") if m in host else "-" for m in HOST_ROWS]
        env = rec["environment"]
        isa = ", ".join((env.get("cpu_isa") or {}).get("flags") or [])
        git = env.get("git") or {}
        commit = str(git.get("commit"))[:7] + (" (dirty)" if git.get("dirty") else "")
        lines.append(
            f"| {rec['run_id']} | {'A/A' if _aa(rec) else 'A/B'}{BIASED if opening_bias(rec) else ''} "
            f"| {_label(rec)} | " + " | ".join(cells)
            + f" | {parts[0]} | {parts[1]} | {commit}, {env.get('cpu')} {isa} |"
        )
    lines += ["", "The order within each run's pairs (each arm's TTFT when it went first and second):", ""]
    lines += [f"- {rec['run_id']}: {'; '.join(rec['slots']) or 'no order recorded'}" for rec in runs]
    for rec in runs:
        lines += step_table(rec)
    return [*lines, "", *sources.get("paired_notes", []), ""]


def step_table(rec: Mapping[str, Any]) -> list[str]:
    """Where a busy step's time goes in one paired run, per arm, and the whole step's ratio beside the
    measured per-token one (empty for a run without the worker's parts)."""
    rows = rec.get("step") or []
    if not rows:
        return []
    base, cand = rec["backends"]
    lines = [
        "",
        f"Where a busy step goes in {rec['run_id']} (us, mean per busy step; interval over request pairs' "
        "rounds and steps):",
        "",
        f"| run | part | {base} | {cand} | {cand} / {base} |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        name = r["metric"].removesuffix("_us_per_step_mean")
        ci = f" [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]" if r.get("ci_low") is not None else ""
        lines.append(f"| {rec['run_id']} | {name} | {_us(r['baseline'])} | {_us(r['candidate'])} "
                     f"| {fmt(r['ratio'])}{ci} |")  # fmt: skip
    b, c = sum(r["baseline"] for r in rows), sum(r["candidate"] for r in rows)
    tpot = {r["metric"]: r for r in rec["primary"]}.get("mean_tpot_ms")
    measured = f"; mean TPOT measured {_metric(tpot)}" if tpot else ""
    lines += ["", f"Whole step: {_us(b)} vs {_us(c)} us, {fmt(c / b)}{measured}."]
    return lines


def _us(x: float) -> str:
    """Microseconds as read in a step table: whole ones with separators from 100 up, one decimal below."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a paired run's record for FINDINGS.md.")
    p.add_argument("run_dir", type=Path, help="results/serve/<paired run id>")
    p.add_argument("--out", type=Path, default=None, help="default: findings/serve/<run id>.json")
    args = p.parse_args(argv)
    rec = record(args.run_dir)
    out = args.out or REPO / "findings" / "serve" / f"{rec['run_id']}.json"
    write_json(out, rec)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
