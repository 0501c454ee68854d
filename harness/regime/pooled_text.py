"""FINDINGS.md's pooled section (:mod:`harness.regime.pooled`): the A/B over all jobs, the A/A the same way,
the A/B over the A/A, for all cells and the host-heavy ones; then the per-job means they are computed from,
each row naming its job's run so every pooled number can be traced to the cells behind it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.statistics import DIRECTION_VERDICTS as SUPPORTED
from harness.regime.analysis import MAP_PRIMARY
from harness.regime.figures import ab_cells
from harness.regime.gpu_text import fmt as _f
from harness.regime.gpu_text import pct as _pct
from harness.regime.pooled import HOST_SHARE_FLOOR, job_means, pooled

__all__ = ["POOLED_ROW", "order_section", "pooled_answer", "pooled_section"]

POOLED_ROW = "| pooled "  # rows computed from the per-job rows below them (they name the runs)
FAMILIES = (
    ("ab", "A/B (tagma / paged)"),
    ("aa", "A/A (paged / paged)"),
    ("ab_over_aa", "A/B over A/A"),
)
SUBSET_TITLES = {
    "all": "all cells",
    "host_heavy": f"cells with host work >= {HOST_SHARE_FLOOR:.0%} of the step",
    "warm": "jobs with a warm-up lifetime",
}


def _cell(row: Mapping[str, Any]) -> str:
    if row.get("ratio") is None:
        return "n/a"
    lo, hi = row["ci"]
    p = f", p_Holm {row['p_adjusted']:.2g}" if row.get("p_adjusted") is not None else ""
    return f"{_f(row['ratio'])} [{_f(lo)}, {_f(hi)}] **{row['verdict']}**{p}"


def _false_calls(result: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(s, r) for s, v in result.items() for r in v["families"]["aa"] if r["verdict"] in SUPPORTED]


def pooled_answer(maps: Sequence[dict[str, Any]]) -> list[str]:
    """The answer's bullets: the pooled A/B verdicts and whether the pooled A/A held."""
    result = pooled(maps)
    ab = result["all"]["families"]["ab"]
    if not ab or any(r["ratio"] is None or None in r["ci"] for r in ab):
        return []
    verdicts = ", ".join(f"{r['metric']} {r['verdict']}" for r in ab)
    bound = max(max(abs(r["ci"][0] - 1), abs(r["ci"][1] - 1)) for r in ab)
    false = _false_calls(result)
    calls = "; ".join(f"{r['metric']} {_cell(r)} over {SUBSET_TITLES[s]}" for s, r in false)
    calib = (
        f"its A/A, pooled the same way, made {len(false)} false call(s) ({calls})"
        if false
        else "its A/A, pooled the same way, made no false call"
    )
    jobs = result["all"]["families"]["ab"][0]
    corrected = "; ".join(f"{r['metric']} {_cell(r)}" for r in result["all"]["families"]["ab_over_aa"])
    return [
        f"- Pooled over the map ({jobs['jobs']} A/B jobs, {jobs['cells']} cells; the average measured "
        f"regime, below): {verdicts}; no metric's interval reaches past {_pct(bound)} of paged's value; "
        f"{calib}. With the A/A's lean taken out (A/B over A/A): {corrected}."
    ]


def pooled_section(maps: Sequence[dict[str, Any]], notes: Sequence[str] = ()) -> list[str]:
    result = pooled(maps)
    if not result["all"]["jobs"]["ab"]:
        return []
    head = "| estimate | cells | jobs (cells) | " + " | ".join(MAP_PRIMARY) + " |"
    lines = [
        "## The map pooled: the average measured regime",
        "",
        "Each job's cells are averaged (geometric mean of their ratios), and the jobs' means are the "
        "sample (harness/regime/pooled.py): the A/B's mean over jobs with a one-sample t interval, the A/A's "
        "the same way, and the A/B over the A/A (Welch over the two sets). Holm over the five metrics within "
        "each row. Cells of one job share its server lifetimes, so the job, not the cell, is the unit.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for subset, v in result.items():
        for kind, title in FAMILIES:
            rows = v["families"][kind]
            size = f"{rows[0]['jobs']} ({rows[0]['cells']})" if rows else "0"
            lines.append(
                f"{POOLED_ROW}{title} | {SUBSET_TITLES[subset]} | {size} | "
                + " | ".join(_cell(r) for r in rows)
                + " |"
            )
    predicted = result["all"]["predicted_step_ratio"]
    heavy = result["host_heavy"]["predicted_step_ratio"]
    lines += [
        "",
        f"The in-server components predict a step ratio of {_f(predicted, 4)} averaged over the same A/B "
        f"jobs (all cells) and {_f(heavy, 4)} over the host-heavy cells.",
        "",
        *notes,
        "",
        "Per job (geometric mean of its cells' ratios; the rows the pooled ones are computed from):",
        "",
        "| kind | cells | " + " | ".join(MAP_PRIMARY) + " | predicted step | run |",
        "|" + "---|" * (len(MAP_PRIMARY) + 4),
    ]
    for aa in (False, True):
        means = {m: job_means(maps, m, aa=aa) for m in MAP_PRIMARY}
        predicted_by_job = job_means(maps, "", aa=aa, key="prediction")
        for run in sorted(means["p50_tpot_ms"]):
            cells = means["p50_tpot_ms"][run][1]
            cols = " | ".join(_f(means[m][run][0]) if run in means[m] else "n/a" for m in MAP_PRIMARY)
            pred = _f(predicted_by_job[run][0], 4) if run in predicted_by_job else "n/a"
            lines.append(f"| {'A/A' if aa else 'A/B'} | {cells} | {cols} | {pred} | {run} |")
    return [*lines, ""]


# forward_us_per_step: the model forward per busy step, the same code on both arms (the machine's spread)
ORDER_METRICS = ("p50_ttft_ms", "p50_tpot_ms", "output_throughput", "forward_us_per_step")


def order_section(maps: Sequence[dict[str, Any]], metrics: Sequence[str] = ORDER_METRICS) -> list[str]:
    """Each A/A cell's lifetimes in run order (their ``per_run`` values, maps collected since they are kept):
    every lifetime's value over the cell's geometric mean, the first lifetime's over the median of the other
    lifetimes of its arm, and which arm ran in each slot (b: baseline, c: candidate)."""
    rows = []
    for _, job, cell in ab_cells(maps, aa=True):
        for metric in metrics:
            valued = (r for r in cell.get("per_run") or () if r.get(metric))
            per_run = sorted(valued, key=lambda r: r["index"])
            if len(per_run) < 4:
                continue
            values = np.array([r[metric] for r in per_run], dtype=float)
            gmean = float(np.exp(np.log(values).mean()))
            first = per_run[0]
            same_arm = [r[metric] for r in per_run[1:] if r["arm"] == first["arm"]]
            first_rel = first[metric] / float(np.median(same_arm)) if same_arm else None
            slots = "".join("b" if r["arm"] == "baseline" else "c" for r in per_run)
            rels = " ".join(_f(v / gmean) for v in values)
            name = cell["cell"]["name"]
            rows.append(f"| {name} | {metric} | {slots} | {rels} | {_f(first_rel)} | {job['run_id']} |")
    if not rows:
        return []
    return [
        "Lifetimes in run order, A/A cells (each lifetime's value over the cell's geometric mean):",
        "",
        "| cell | metric | arms in run order | value / geometric mean, in run order "
        "| first lifetime / its arm's median of the rest | run |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
