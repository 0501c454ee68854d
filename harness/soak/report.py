"""The soak's verdicts and its summary.json / summary.md."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path

from harness.files import write_json
from harness.soak.config import SoakConfig
from harness.soak.invariants import drain_violations, rss_bounded, rss_trend
from harness.soak.plan import ABORT, ERROR, KINDS, OK, TrafficPlan

# violation classes (harness.soak.invariants.check_pair) -> the invariant they break
INVARIANT_OF = {
    "output_mismatch": "outputs_identical",
    "output_length_mismatch": "outputs_identical",
    "status_mismatch": "errors_match",
    "bad request not refused with a 4xx": "errors_match",
    "baseline 5xx": "no_crash",
    "candidate 5xx": "no_crash",
    "baseline broken stream": "no_crash",
    "candidate broken stream": "no_crash",
    "good request not served in full": "requests_served",
    "abort not cut mid-stream": "requests_served",
    "bad request not refused": "errors_match",
}
FATAL_LOG = ("EngineDeadError", "Engine core proc", "Fatal Python error", "Segmentation fault", "core dumped")


def _kinds_exercised(plan: TrafficPlan, tally, preemptions: Mapping[str, float], cfg: SoakConfig) -> dict:
    missing = []
    for kind in plan.kinds:
        statuses = tally.statuses.get(kind, {})
        want = {OK: "200/200", ABORT: "200/200"}.get(KINDS[kind])
        if not tally.sent.get(kind):
            missing.append(f"{kind}: never sent")
        elif want and not statuses.get(want):
            missing.append(f"{kind}: never answered 200 on both arms")
        elif KINDS[kind] == ERROR and not statuses.get("refused/refused"):
            missing.append(f"{kind}: never refused")
    if cfg.require_preemption == "each":
        missing += [f"{arm}: no preemption" for arm, n in preemptions.items() if not n]
    elif cfg.require_preemption == "any" and not any(preemptions.values()):
        missing.append("no preemption on either arm")
    return {
        "ok": not missing,
        "missing": missing,
        "sent": dict(tally.sent),
        "statuses": {k: dict(v) for k, v in tally.statuses.items()},
        "preemptions": dict(preemptions),
    }


def summarize(
    cfg: SoakConfig,
    plan: TrafficPlan,
    tally,
    *,
    idle: dict,
    drained: dict,
    alive: dict,
    rss: dict,
    logs: dict,
    labels: dict,
    traffic_s: float,
    startup_s: dict,
    started: float,
) -> dict:
    """Every invariant's verdict and the figures behind it."""
    by_inv: dict[str, dict[str, int]] = {}
    for cls, n in tally.violations.items():
        by_inv.setdefault(INVARIANT_OF.get(cls, "other"), {})[cls] = n
    inv: dict[str, dict] = {}
    inv["outputs_identical"] = {
        "ok": "outputs_identical" not in by_inv,
        "compared_tokens": tally.compared_tokens,
        "near_ties": tally.near_ties,
        "violations": by_inv.get("outputs_identical", {}),
    }
    inv["errors_match"] = {"ok": "errors_match" not in by_inv, "violations": by_inv.get("errors_match", {})}
    inv["requests_served"] = {
        "ok": "requests_served" not in by_inv,
        "violations": by_inv.get("requests_served", {}),
    }
    leaks = []
    for name in labels:
        if name not in drained:
            leaks.append(f"{labels[name]}: did not drain (dead or still busy)")
        else:
            leaks += drain_violations(labels[name], idle[name], drained[name])
    inv["no_leak_after_drain"] = {"ok": not leaks, "violations": leaks}
    trends = {}
    for name, samples in rss.items():
        pts = [(t, core) for t, core, _ in samples if core is not None]
        trends[name] = rss_trend(
            [t for t, _ in pts], [c for _, c in pts], cfg.rss_warmup_frac, cfg.rss_max_growth_mib
        )
    inv["rss_bounded"] = {**rss_bounded(trends, cfg.rss_max_growth_mib), "per_arm": trends}
    fatal = {labels[n]: [m for m in FATAL_LOG if m in text] for n, text in logs.items()}
    crash = [f"{labels[n]} not alive at the end" for n, ok in alive.items() if not ok]
    crash += [f"{arm}: log says {found}" for arm, found in fatal.items() if found]
    inv["no_crash"] = {
        "ok": not crash and "no_crash" not in by_inv,
        "violations": by_inv.get("no_crash", {}),
        "crashes": crash,
    }
    if "other" in by_inv:
        inv["other"] = {"ok": False, "violations": by_inv["other"]}
    preempt = {labels[n]: (drained.get(n) or {}).get("preemptions") for n in labels}
    inv["kinds_exercised"] = _kinds_exercised(plan, tally, preempt, cfg)
    return {
        "profile": cfg.profile,
        "ok": all(v["ok"] for v in inv.values()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "traffic_s": traffic_s,
        "requests": int(sum(tally.sent.values())),
        "startup_s": startup_s,
        "invariants": inv,
        "violation_examples": tally.examples,
        "arms": {labels[n]: {"idle": idle.get(n), "drained": drained.get(n)} for n in labels},
        "config": dataclasses.asdict(cfg),
    }


def _markdown(s: dict) -> str:
    inv = s["invariants"]
    lines = [
        f"# Soak `{s['profile']}`: {'all invariants held' if s['ok'] else 'INVARIANTS BROKEN'}",
        "",
        f"{s['requests']} requests to each arm in {s['traffic_s']:.0f} s of traffic, started {s['started']}.",
        "",
        "| invariant | held | detail |",
        "|---|---|---|",
    ]
    for name, v in inv.items():
        detail = {k: x for k, x in v.items() if k not in ("ok", "statuses", "sent", "per_arm")}
        lines.append(f"| {name} | {'yes' if v['ok'] else '**no**'} | `{detail}` |")
    lines += ["", "| kind | sent | statuses (baseline/candidate) |", "|---|---|---|"]
    ke = inv["kinds_exercised"]
    for kind, n in sorted(ke["sent"].items()):
        lines.append(f"| {kind} | {n} | {ke['statuses'].get(kind, {})} |")
    lines += [
        "",
        "| arm | engine-core RSS first / last / max MiB | fitted growth MiB (bound) | slope MiB/min |",
        "|---|---|---|---|",
    ]
    rb = inv["rss_bounded"]
    if "excess_mib" in rb:
        lines[-2:-2] = [
            f"tagma's growth over paged's: {rb['excess_mib']:.1f} MiB (bound {rb['max_excess_mib']:g})",
            "",
        ]
    for arm, t in inv["rss_bounded"]["per_arm"].items():
        if "slope_mib_per_min" in t:
            lines.append(
                f"| {arm} | {t['rss_mib_first']:.0f} / {t['rss_mib_last']:.0f} / {t['rss_mib_max']:.0f} "
                f"| {t['fitted_growth_mib']:.1f} ({t['max_growth_mib']:g}) | {t['slope_mib_per_min']:.2f} |"
            )
        else:
            lines.append(f"| {arm} | - | {t.get('reason')} | - |")
    lines += [
        "",
        "| arm | idle free / pool | drained free | usage idle / drained | preemptions | prefix hits |",
        "|---|---|---|---|---|---|",
    ]
    for arm, d in s["arms"].items():
        i, dr = d["idle"] or {}, d["drained"] or {}
        lines.append(
            f"| {arm} | {i.get('free_blocks')} / {i.get('num_blocks')} | {dr.get('free_blocks')} | "
            f"{i.get('kv_cache_usage')} / {dr.get('kv_cache_usage')} | {dr.get('preemptions')} | "
            f"{dr.get('prefix_cache_hits')} |"
        )
    if s["violation_examples"]:
        lines += ["", "First violations:", ""] + [
            f"- #{e['index']} {e['kind']}: {e['violation']}" for e in s["violation_examples"][:20]
        ]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, summary: dict) -> None:
    write_json(out_dir / "summary.json", summary)
    (out_dir / "summary.md").write_text(_markdown(summary))
