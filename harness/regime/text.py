"""FINDINGS.md's text from the collected maps: the answer first, then the map, its calibration, where a step
goes, predicted against measured, then the GPU sections (:mod:`harness.regime.gpu_text`). Every number is read
from a map record or a GPU run; every row names its run (``<map id>/<job>``, a GPU run id) so it can be traced
to the raw results and the commit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.host_time import GROUP_PREFIX, group_index
from harness.analysis.statistics import DIRECTION_VERDICTS as SUPPORTED
from harness.analysis.statistics import PARITY_MARGIN
from harness.regime.figures import ab_cells
from harness.regime.gpu_text import fmt as _f
from harness.regime.gpu_text import gpu_answer, gpu_kernels, gpu_projection
from harness.regime.gpu_text import pct as _pct
from harness.regime.host_text import host_answer, host_section
from harness.regime.inserver_text import inserver_aa_answer, inserver_aa_section
from harness.regime.paired_text import paired_answer, paired_section
from harness.regime.pooled_text import order_section, pooled_answer, pooled_section

__all__ = ["document", "fmt_metric", "headline"]

METRICS = (
    ("output_throughput", "throughput"),
    ("p50_ttft_ms", "TTFT p50"),
    ("p99_ttft_ms", "TTFT p99"),
    ("p50_tpot_ms", "TPOT p50"),
    ("p99_tpot_ms", "TPOT p99"),
)
PARTS = ("kv_manager", "schedule_other", "update_other", "worker_prepare", "forward")


def fmt_metric(row: Mapping[str, Any] | None) -> str:
    """``0.981 [0.94, 1.02] inconclusive, MDE 6%``: ratio tagma/paged, 95% interval, verdict, minimum
    detectable effect."""
    if not row or row.get("ratio") is None:
        return "n/a" + (f" ({row.get('reason')})" if row and row.get("reason") else "")
    lo, hi = row.get("ci") or (None, None)
    ci = f" [{_f(lo)}, {_f(hi)}]" if lo is not None else ""
    mde = f", MDE {_pct(row.get('mde'))}" if row.get("mde") is not None else ""
    return f"{_f(row['ratio'])}{ci} **{row['verdict']}**{mde}"


def _cell_label(c: Mapping[str, Any]) -> str:
    cell = c["cell"]
    if cell["load"] == "closed":
        return f"closed c={cell['concurrency']}, {cell['prompt_tokens']} tok"
    if cell["load"] == "open":
        rate = f" = {c['rate']:.3g} req/s" if c.get("rate") else ""
        return f"open {cell['knee_fraction']:g}x knee{rate}, {cell['prompt_tokens']} tok"
    return f"trace {cell['name']}"


def headline(maps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts behind the answer: verdicts over the A/B cells' metrics, the A/A's false calls, the bounds."""
    verdicts: dict[str, int] = {}
    supported, mdes, parity = [], [], []
    for _, job, c in ab_cells(maps):
        at_parity = []
        for metric, row in c["metrics"].items():
            verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
            if row["verdict"] in SUPPORTED:
                supported.append((job, c, metric, row))
            if row["verdict"] == "parity":
                at_parity.append(metric)
            if row.get("mde") is not None:
                mdes.append((row["mde"], job, c, metric))
        if at_parity:
            parity.append((job, c, at_parity))
    aa_calls = [(job, c, m, r) for _, job, c in ab_cells(maps, aa=True) for m, r in c["metrics"].items()]
    false = [x for x in aa_calls if x[3]["verdict"] in SUPPORTED]
    return {
        "verdicts": verdicts,
        "supported": supported,
        "parity": parity,
        "mdes": sorted(mdes, key=lambda x: x[0]),
        "aa_metrics": len(aa_calls),
        "aa_false": false,
        "cells": sum(1 for _ in ab_cells(maps)),
    }


def _answer(maps: Sequence[dict[str, Any]], sources: Mapping[str, Any]) -> list[str]:
    h = headline(maps)
    lines = ["## The answer", ""]
    counts = ", ".join(f"{n} {v}" for v, n in sorted(h["verdicts"].items()))
    lines.append(
        f"- {h['cells']} A/B cells, 5 primary metrics each (Holm within the cell): {counts or 'none'}."
    )
    if h["supported"]:
        lines.append("- Supported differences (tagma / paged, 95% interval):")
        for job, c, metric, row in h["supported"]:
            lines.append(
                f"  - {job['group']} {_cell_label(c)}, {metric}: {fmt_metric(row)} (run {job['run_id']})"
            )
    else:
        lines.append("- No map cell shows a supported difference in what a user sees.")
    if h["parity"]:
        n = sum(len(m) for _, _, m in h["parity"])
        lines.append(
            f"- Parity shown (the whole 95% interval within +-{_pct(PARITY_MARGIN)} of paged's value: an "
            f"equivalence claim) for {n} metrics in {len(h['parity'])} cells:"
        )
        for job, c, metrics in h["parity"]:
            lines.append(f"  - {job['group']} {_cell_label(c)}: {', '.join(metrics)} (run {job['run_id']})")
    lines += pooled_answer(maps)
    if h["mdes"]:
        best, worst = h["mdes"][0], h["mdes"][-1]
        lines.append(
            f"- Resolution: the smallest minimum detectable effect is {_pct(best[0])} ({best[1]['group']} "
            f"{_cell_label(best[2])}, {best[3]}); the largest {_pct(worst[0])} ({worst[1]['group']} "
            f"{_cell_label(worst[2])}, {worst[3]}). An inconclusive cell cannot hide an effect above its "
            "MDE with more than 20% probability; below it, the cell says nothing."
        )
    if h["aa_metrics"]:
        lines.append(
            f"- Calibration: {len(h['aa_false'])} false verdicts in {h['aa_metrics']} A/A metric tests "
            f"(paged vs paged, same cells and sizes; 5% per cell family expected at most)."
        )
    else:
        lines.append(
            "- Calibration: these maps ran no A/A; the MDEs rest on the A/B cells' own run-to-run spread."
        )
    lines += paired_answer(sources)
    return [*lines, *gpu_answer(sources), *host_answer(sources), *inserver_aa_answer(sources), ""]


def _map_table(maps: Sequence[dict[str, Any]], aa: bool) -> list[str]:
    head = (
        "| group | cell | requests x runs | "
        + " | ".join(n for _, n in METRICS)
        + " | host share baseline / candidate | run |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for _, job, c in ab_cells(maps, aa=aa):
        comp = c.get("composition") or {}
        shares = " / ".join(_pct((comp.get(a) or {}).get("host_share")) for a in ("baseline", "candidate"))
        runs = c["metrics"].get("output_throughput", {}).get("runs") or [len(v) for v in c["runs"].values()]
        metrics = " | ".join(fmt_metric(c["metrics"].get(m)) for m, _ in METRICS)
        lines.append(
            f"| {job['group']} | {_cell_label(c)} | {c['cell']['num_requests']} x {runs} | {metrics} | "
            f"{shares} | {job['run_id']} |"
        )
    return lines


def _composition(maps: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| group | cell | arm | " + " | ".join(PARTS) + " | host share | mean running | steps | run |",
        "|" + "---|" * (len(PARTS) + 7),
    ]
    for _, job, c in ab_cells(maps):
        for arm, comp in (c.get("composition") or {}).items():
            if not comp:
                continue
            backend = c["backends"][0 if arm == "baseline" else 1]
            parts = " | ".join(_f(comp["us_per_step"].get(p)) for p in PARTS)
            lines.append(
                f"| {job['group']} | {_cell_label(c)} | {backend} | {parts} | {_pct(comp['host_share'])} | "
                f"{_f(comp['mean_running'])} | {comp['steps']} | {job['run_id']} |"
            )
    return lines


def _attribution(maps: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| group | cell | KV manager / step | schedule_other / step | predicted step ratio "
        "| measured TPOT p50 | "
        "prediction inside the interval | run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, job, c in ab_cells(maps):
        pred = c["prediction"].get("step_ratio")
        tpot = c["metrics"].get("p50_tpot_ms") or {}
        lo, hi = tpot.get("ci") or (None, None)
        inside = "n/a" if pred is None or lo is None else ("yes" if lo <= pred <= hi else "**no**")
        kv = fmt_metric(c["host"].get("kv_manager_us_per_step_mean"))
        so = fmt_metric(c["host"].get("schedule_other_us_per_step_mean"))
        lines.append(
            f"| {job['group']} | {_cell_label(c)} | {kv} | {so} | {_f(pred, 4)} | {fmt_metric(tpot)} "
            f"| {inside} | {job['run_id']} |"
        )
    return lines


GROUP_ROW = GROUP_PREFIX  # host rows kv_group<g>_<kind>_us_per_step_mean (run.host_time_groups)
GROUP_SUFFIX = "_us_per_step_mean"


def _groups(maps: Sequence[dict[str, Any]]) -> list[str]:
    """The KV manager's CPU per step in each KV cache group, where a map timed it (several groups)."""
    lines = [
        "| group | cell | KV cache group | paged us / step | tagma us / step | tagma / paged | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, job, c in ab_cells(maps):
        keys = sorted((k for k in c["host"] if k.startswith(GROUP_ROW) and k.endswith(GROUP_SUFFIX)),
                      key=group_index)  # fmt: skip
        for k in keys:
            row = c["host"][k]
            index, kind = k[len(GROUP_ROW) : -len(GROUP_SUFFIX)].split("_", 1)
            name = f"{index} ({kind})"
            lines.append(
                f"| {job['group']} | {_cell_label(c)} | {name} | {_f(row.get('baseline'))} | "
                f"{_f(row.get('candidate'))} | {fmt_metric(row)} | {job['run_id']} |"
            )
    if len(lines) == 2:
        return ["No map in these sources timed the KV manager per KV cache group (`run.host_time_groups`)."]
    return lines


def _aa_host(maps: Sequence[dict[str, Any]]) -> list[str]:
    rows = [(job, c) for _, job, c in ab_cells(maps, aa=True)]
    if not rows:
        return ["No A/A ran in these maps: the in-server intervals are not calibrated here."]
    lines = [
        "| group | cell | KV manager / step | schedule_other / step | update_other / step "
        "| worker_prepare / step | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for job, c in rows:
        cols = " | ".join(
            fmt_metric(c["host"].get(f"{p}_us_per_step_mean"))
            for p in ("kv_manager", "schedule_other", "update_other", "worker_prepare")
        )
        lines.append(f"| {job['group']} | {_cell_label(c)} | {cols} | {job['run_id']} |")
    return lines


def _job_line(job: Mapping[str, Any]) -> str:
    load = job.get("load")
    beside = f", load average at its segments' start {load['mean']} (max {load['max']})" if load else ""
    wall = f"{job['wall_s'] / 60:.0f} min" if job.get("wall_s") else "wall time unknown"
    return f"{job['run_id']} ({wall}{beside})"


EAGER_NOTE = ", servers --enforce-eager (no torch.compile)"


def _isa(mach: Mapping[str, Any]) -> str:
    """`` (family/model 25/17, avx2 avx512f avx512_bf16)``; maps recorded before the field: nothing."""
    isa = mach.get("cpu_isa")
    if not isa:
        return ""
    return f" (family/model {isa.get('family_model')}, {' '.join(isa.get('flags') or []) or 'no AVX2'})"


def _provenance(sources: Mapping[str, Any]) -> list[str]:
    lines = ["## Provenance", ""]
    for name, m in zip(sources["map_files"], sources["maps"], strict=True):
        mach = m["machine"]
        lines.append(
            f"- `{name}`: map `{m['map_id']}`, profile `{m['profile']}`, commits "
            f"{', '.join(c[:10] for c in m['commits']) or 'unknown'}, machine {mach.get('cpu')} x"
            f"{mach.get('cpu_count')}{_isa(mach)}{EAGER_NOTE if mach.get('enforce_eager') else ''}, "
            f"wall time {m['wall_s'] / 60:.0f} min; jobs: "
            f"{', '.join(_job_line(j) for j in m['jobs'])}."
        )
    return [*lines, ""]


def document(sources: Mapping[str, Any], figures: Mapping[str, str]) -> str:
    maps = sources["maps"]
    profiles = ", ".join(sorted({m["profile"] for m in maps}))
    lines = [
        "# FINDINGS: where tagma changes what a user sees",
        "",
        f"Generated by `make findings` from `findings/sources.yaml` (maps of profile {profiles}) on "
        f"{dt.date.today().isoformat()}. Ratios are tagma / paged with 95% intervals from run-level variance "
        "(each run is one server lifetime); verdicts only on the five metrics below, Holm-corrected within "
        "each cell; MDE = the change the cell would call 80% of the time (harness/regime/analysis.py).",
        "",
        *sources.get("preamble", []),
        "",
    ]
    lines += _answer(maps, sources)
    lines += ["## The map (A/B: paged vs tagma)", "", *_map_table(maps, aa=False), ""]
    for key, title in (
        ("heat_throughput", "output throughput"),
        ("heat_tpot_p50", "TPOT p50"),
        ("heat_ttft_p50", "TTFT p50"),
    ):
        if key in figures:
            lines += [f"![{title}]({figures[key]})", ""]
    lines += paired_section(sources)
    lines += pooled_section(maps, sources.get("pooled_notes", []))
    lines += order_section(maps)
    lines += [
        "## Calibration: A/A (paged vs paged) at the same sizes",
        "",
        *_map_table(maps, aa=True),
        "",
        "In-server components between identical servers (each should be 1.00):",
        "",
        *_aa_host(maps),
        "",
    ]
    lines += ["## Where a step goes (us per busy step, mean over runs)", "", *_composition(maps), ""]
    if "step_stacks" in figures:
        lines += [f"![step composition]({figures['step_stacks']})", ""]
    lines += [
        "## Attribution: the e2e change the components predict, beside the one measured",
        "",
        *_attribution(maps),
        "",
        *sources.get("attribution_notes", []),
        "",
    ]
    if "predicted_vs_measured" in figures:
        lines += [f"![predicted vs measured]({figures['predicted_vs_measured']})", ""]
    lines += [
        "## The KV manager per KV cache group (models with several groups)",
        "",
        "Part of the KV manager row above: vLLM's time in each group's single-type manager, tagma's in its "
        "per-group loop bodies (the hit search, joint over groups, is in neither).",
        "",
        *_groups(maps),
        "",
        *sources.get("group_notes", []),
        "",
    ]
    lines += gpu_projection(sources, maps)
    lines += gpu_kernels(sources)
    lines += host_section(sources)
    lines += inserver_aa_section(sources)
    lines += _provenance(sources)
    return "\n".join(lines).rstrip() + "\n"
