"""The in-server section (benchmarks.host.inserver): its one headline row."""

from __future__ import annotations

from typing import Any

from benchmarks.host.report.table import TARGETS, row

__all__ = ["METRIC", "aa_calibration", "headline_rows", "interval_met"]

METRIC = "in-server KV manager CPU per step, 64 x 16K, caching off"
CONTEXT = 16384


def interval_met(result: dict[str, Any], goal: float) -> tuple[bool, str]:
    """Met when the 95% interval of paged / tagma lies at or above ``goal`` (its lower bound >= goal), the
    interval exists and prefix caching was off on every server run; otherwise not met, with the reason."""
    lo, hi, speedup = result.get("speedup_ci_low"), result.get("speedup_ci_high"), result.get("speedup")
    if not result.get("prefix_caching_off_everywhere"):
        return False, "prefix caching was not off on every server run: not this target's configuration"
    if speedup is None:
        return False, result.get("reason") or "no ratio"
    if lo is None:
        return False, f"paged/tagma {speedup:.2f}x without an interval ({result.get('reason')})"
    span = f"paged/tagma {speedup:.2f}x [{lo:.2f}, {hi:.2f}] (95%, {result['interval']})"
    if lo >= goal:
        return True, span
    return False, f"missed: {span}; the lower bound must be >= {goal:g}x"


def aa_calibration(section: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """The A/A of the same size (identical servers): (whether it leaves the A/B's interval trusted, the text,
    its fields). Trusted when no A/A was run (said so) or its 95% interval holds 1; an A/A interval that
    excludes 1 is a false difference at this size, and the A/B's interval cannot be leaned on."""
    aa = section.get("aa")
    res = (aa or {}).get("result") or {}
    if res.get("ratio") is None:
        return True, "no A/A at this size (the interval is not calibrated)", {}
    lo, hi, ratio = res.get("ci_low"), res.get("ci_high"), res["ratio"]
    fields = {"aa_ratio": ratio, "aa_ci_95": [lo, hi], "aa_source": aa["source"]}
    if lo is None:
        return True, f"A/A {ratio:.3f} without an interval ({res.get('reason')}), run {aa['run_id']}", fields
    holds = lo <= 1.0 <= hi
    verdict = "holds 1: no false difference" if holds else "excludes 1: a false difference (same servers)"
    text = f"A/A (paged vs paged) {ratio:.3f} [{lo:.3f}, {hi:.3f}], {verdict}; run {aa['run_id']}"
    return holds, text, fields


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """One row: paged and tagma us per decode-only step with all requests running, met from the interval."""
    del contexts  # the serve run fixes the context (16K prompts)
    target = TARGETS["inserver_kv_manager"]
    res = section.get("result")
    if res is None:
        r = row(METRIC, CONTEXT, None, None, "us/step",
                note=f"not measured: run make bench-inserver ({section.get('reason')})")  # fmt: skip
        return [r | {"target": target.text, "met": False}]
    met, why = interval_met(res, target.goal)
    calibrated, aa_text, aa_fields = aa_calibration(section)
    met = met and calibrated
    paged, tagma = res["arms"]["baseline"], res["arms"]["candidate"]
    detail = (
        f"{why}; {res['min_running']}+ running, decode-only steps counted {paged['steps']}/{tagma['steps']} "
        f"over {len(paged['runs'])}/{len(tagma['runs'])} server runs; run {section['source']}; {aa_text}"
    )
    r = row(METRIC, CONTEXT, res["baseline_us_per_step"], res["candidate_us_per_step"], "us/step",
            note=detail)  # fmt: skip
    return [r | {"target": target.text, "met": met,
                 "speedup_ci_95": [res["speedup_ci_low"], res["speedup_ci_high"]],
                 "interval": res["interval"], "source": section["source"], **aa_fields}]  # fmt: skip
