"""Regenerate every figure of a serve run or a sweep without Jupyter:
`python -m harness.analysis.plots_cli RUN_DIR`.

RUN_DIR is a serve run (config.json + runs/) or a sweep directory (serve runs below it, e.g. a Hydra
multirun dir). The figures come from the same functions the reports and the notebooks call
(harness.analysis.plots, harness.report.make_figures). Benchmark results have their own entry points
(`python -m benchmarks.host.report RUN_DIR`); `make plots` picks the one that fits a directory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness import report
from harness.analysis import plots
from harness.analysis.compare import comparisons
from harness.analysis.run_dirs import find_serve_runs, is_serve_run
from harness.config import SavedConfig
from harness.files import read_json


def serve_meta(run_dir: Path) -> dict:
    config = SavedConfig.load(run_dir)
    return {"config": config, "backends": config.backends, "workload": read_json(run_dir / "workload.json")}


def ranges_series(runs: list[dict]) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """run label -> (t_s, mean, p99 ranges per live request) from tagma's telemetry snapshots."""
    out = {}
    for r in runs:
        if r["status"] != "ok":
            continue
        pts = [
            (s["t_s"], s["tagma"]["ranges_per_request"])
            for s in r.get("telemetry") or []
            if s.get("tagma", {}).get("live_requests") and s["tagma"].get("ranges_per_request")
        ]
        if pts:
            out[r["dir"].name] = (
                [t for t, _ in pts],
                [float(x["mean"]) for _, x in pts],
                [float(x["p99"]) for _, x in pts],
            )
    return out


def ranges_over_time(series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                     path: Path) -> Path:  # fmt: skip
    """series[run label] = (t_s, mean ranges per request, p99 ranges per request)."""
    fig, ax = plots.plt.subplots(figsize=(7, 3.2))
    for label, (t, mean, p99) in series.items():
        line = ax.plot(t, mean, label=f"{label} mean", alpha=0.85)[0]
        ax.plot(t, p99, linestyle="--", color=line.get_color(), alpha=0.6, label=f"{label} p99")
    ax.set_xlabel("s since run start")
    ax.set_ylabel("ranges per live request")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    return plots.save_figure(fig, path)


def serve_figures(run_dir: Path, n_boot: int | None = None, out_root: Path | None = None) -> list[Path]:
    """The report's figures (report.make_figures) plus ranges per request over time, into out_root/plots
    (default: run_dir/plots, where the report puts them)."""
    out_root = Path(out_root) if out_root is not None else run_dir
    meta = serve_meta(run_dir)
    if n_boot is None:
        n_boot = meta["config"].run.n_boot
    runs = report.load_runs(run_dir)
    ab = comparisons(runs, meta["config"], n_boot)
    figures = report.make_figures(out_root, runs, ab, meta)
    series = ranges_series(runs)
    if series:
        figures.append(ranges_over_time(series, out_root / "plots" / "ranges_per_request.png"))
    return figures


def regenerate(run_dir: Path, n_boot: int | None = None) -> list[Path]:
    run_dir = Path(run_dir).resolve()
    if is_serve_run(run_dir):
        return serve_figures(run_dir, n_boot)
    from harness.analysis import sweep_report

    cells = find_serve_runs(run_dir)
    if not cells:
        raise SystemExit(f"{run_dir}: neither a serve run nor a sweep of serve runs")
    figures = [f for cell in cells for f in serve_figures(cell, n_boot)]
    return figures + [sweep_report.write_sweep_report(run_dir, n_boot=n_boot)[1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="serve run or sweep directories")
    ap.add_argument("--n-boot", type=int, default=None, help="bootstrap resamples (default: the run's)")
    args = ap.parse_args(argv)
    for d in args.run_dirs:
        for f in regenerate(d, args.n_boot):
            print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
