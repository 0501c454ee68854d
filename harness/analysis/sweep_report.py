"""One table and one figure over the cells of a sweep (backend pair x workload x request rate).

`python -m harness.analysis.sweep_report SWEEP_DIR [RUN_DIR ...]`: SWEEP_DIR is searched (a few levels deep)
for serve run directories (config.json + runs/); RUN_DIR arguments add cells found elsewhere. Each cell's A/B
ratios come from its summary.json (what harness.report wrote), or are recomputed from its run files when it
has none. Writes SWEEP_DIR/sweep_report.md, SWEEP_DIR/sweep_summary.json and SWEEP_DIR/plots/sweep_ratios.png.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from harness import report
from harness.analysis import plots
from harness.analysis.compare import comparisons
from harness.analysis.run_dirs import find_serve_runs
from harness.config import SavedConfig
from harness.files import read_json, write_json, write_text_atomic

METRICS = (
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "mean_e2el_ms",
    "output_throughput", "request_throughput",
)  # fmt: skip


def cell(run_dir: Path, n_boot: int | None = None) -> dict:
    """One sweep cell: what it ran (workload, load, backends) and its A/B rows by metric."""
    cfg = SavedConfig.load(run_dir)
    backends = cfg.backends
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    ab = summary.get("ab")
    if ab is None:
        runs = report.load_runs(run_dir)
        ab = [r.to_dict() for r in comparisons(runs, cfg, n_boot)]
    load = cfg.section("load")
    return {
        "dir": str(run_dir),
        "backends": list(backends),
        "workload": cfg.section("workload").get("name", "?"),
        "mode": load.get("mode"),
        "request_rate": load.get("request_rate"),
        "max_concurrency": load.get("max_concurrency"),
        "repeats_ok": {a: s.get("repeats_ok") for a, s in summary.get("arms", {}).items()},
        "ab": {r["metric"]: r for r in ab},
    }


def _sort_key(c: Mapping) -> tuple:
    rate = c["request_rate"]
    return (c["workload"], "/".join(c["backends"]), c["mode"] or "", rate is None, rate or 0.0)


def _fmt_ratio(r: Mapping | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    ci = "" if r.get("ci_low") is None else f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
    return f"{r['ratio']:.3f}{ci} {r['verdict']}"


def markdown(cells: Sequence[Mapping], metrics: Sequence[str] = METRICS) -> str:
    head = ["workload", "backends", "load", *metrics]
    lines = [
        "# Sweep: B / A ratios (95% CI) and verdicts per cell",
        "",
        "Ratio = candidate / baseline (backends = [baseline, candidate]); < 1 is faster for latencies, "
        "> 1 is higher for throughputs.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for c in cells:
        load = c["mode"] or "?"
        if c["request_rate"] is not None:
            load += f" {c['request_rate']:g} req/s"
        if c["max_concurrency"]:
            load += f" conc {c['max_concurrency']}"
        row = [c["workload"], "/".join(c["backends"]), load, *(_fmt_ratio(c["ab"].get(m)) for m in metrics)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cells:", ""] + [f"- `{c['dir']}`" for c in cells]
    return "\n".join(lines) + "\n"


def ratios_vs_rate(cells: Sequence[Mapping], path: Path, metrics: Sequence[str] = METRICS) -> Path:
    """One panel per metric: ratio with its CI against request rate, one line per workload x backend pair."""
    metrics = [m for m in metrics if any(m in c["ab"] for c in cells)]
    ncol = min(4, max(len(metrics), 1))
    nrow = -(-max(len(metrics), 1) // ncol)
    fig, axes = plots.plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False)
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for c in cells:
        groups[f"{c['workload']} {'/'.join(c['backends'])}"].append(c)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for label, members in groups.items():
            pts = sorted(
                (c["request_rate"], c["ab"][metric]) for c in members
                if c["request_rate"] is not None and c["ab"].get(metric, {}).get("ratio") is not None
            )  # fmt: skip
            if not pts:
                continue
            x = [rate for rate, _ in pts]
            y = [r["ratio"] for _, r in pts]
            lo = [r["ratio"] - (r["ratio"] if r["ci_low"] is None else r["ci_low"]) for _, r in pts]
            hi = [(r["ratio"] if r["ci_high"] is None else r["ci_high"]) - r["ratio"] for _, r in pts]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("ratio")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    if groups and metrics:
        axes.flat[0].legend(fontsize=7)
    return plots.save_figure(fig, path)


def collect(sweep_dir: Path, extra: Iterable[Path] = (), n_boot: int | None = None) -> list[dict]:
    dirs = {d.resolve() for d in find_serve_runs(sweep_dir)} | {Path(d).resolve() for d in extra}
    return sorted((cell(d, n_boot) for d in dirs), key=_sort_key)


def write_sweep_report(
    sweep_dir: Path, extra: Iterable[Path] = (), n_boot: int | None = None
) -> tuple[Path, Path]:
    """Writes sweep_report.md, sweep_summary.json and plots/sweep_ratios.png; returns (markdown, figure)."""
    sweep_dir = Path(sweep_dir)
    cells = collect(sweep_dir, extra, n_boot)
    if not cells:
        raise ValueError(f"no serve runs (config.json + runs/) under {sweep_dir}")
    fig = ratios_vs_rate(cells, sweep_dir / "plots" / "sweep_ratios.png")
    write_json(sweep_dir / "sweep_summary.json", {"cells": cells})
    body = markdown(cells) + f"\n![ratios vs rate]({fig.relative_to(sweep_dir)})\n"
    md = write_text_atomic(sweep_dir / "sweep_report.md", body)
    return md, fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("run_dirs", nargs="*", type=Path, help="more cells outside sweep_dir")
    ap.add_argument("--n-boot", type=int, default=None)
    args = ap.parse_args(argv)
    md, _ = write_sweep_report(args.sweep_dir, args.run_dirs, args.n_boot)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
