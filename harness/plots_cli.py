"""Regenerate every figure of a results directory without Jupyter: `python -m harness.plots_cli RUN_DIR`.

RUN_DIR is a serve run (config.json + runs/), a host-bench run (host_bench.json) or a sweep directory (one
serve run per subdirectory, e.g. a Hydra multirun dir). The figures come from the same functions the reports
and the notebooks call (harness.plots, harness.report.make_figures, benchmarks.host.report.plots).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness import plots, report
from harness.files import read_json
from tagma.contract import BACKENDS


def is_serve_run(run_dir: Path) -> bool:
    return (run_dir / "config.json").exists() and (run_dir / "runs").is_dir()


def is_host_run(run_dir: Path) -> bool:
    return (run_dir / "host_bench.json").exists()


def serve_meta(run_dir: Path) -> dict:
    meta = {
        "config": read_json(run_dir / "config.json"),
        "workload": read_json(run_dir / "workload.json"),
    }
    meta["backends"] = tuple(meta["config"].get("backends", BACKENDS))
    return meta


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
            out[f"{r['index']:02d}-{r['backend']}"] = (
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
    return plots._save(fig, path)


def serve_figures(run_dir: Path, n_boot: int | None = None, out_root: Path | None = None) -> list[Path]:
    """The report's figures (report.make_figures) plus ranges per request over time, into out_root/plots
    (default: run_dir/plots, where the report puts them)."""
    out_root = Path(out_root) if out_root is not None else run_dir
    meta = serve_meta(run_dir)
    if n_boot is None:
        n_boot = int(meta["config"].get("run", {}).get("n_boot", 2000))
    runs = report.load_runs(run_dir)
    ab = report.ab_table(runs, meta["backends"], n_boot)
    figures = report.make_figures(out_root, runs, ab, meta)
    series = ranges_series(runs)
    if series:
        figures.append(ranges_over_time(series, out_root / "plots" / "ranges_per_request.png"))
    return figures


def host_figures(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """benchmarks.host.report's figures, into out_dir (default: run_dir, where the host bench puts them)."""
    from benchmarks.host import report as host_report

    out_dir = Path(out_dir) if out_dir is not None else run_dir
    result = read_json(run_dir / "host_bench.json")
    return [out_dir / name for name in host_report.plots(result, out_dir)]


def regenerate(run_dir: Path, n_boot: int | None = None) -> list[Path]:
    run_dir = Path(run_dir).resolve()
    if is_host_run(run_dir):
        return host_figures(run_dir)
    if is_serve_run(run_dir):
        return serve_figures(run_dir, n_boot)
    from harness import sweep_report

    cells = sweep_report.find_runs(run_dir)
    if not cells:
        raise SystemExit(f"{run_dir}: not a serve run, a host-bench run or a sweep of serve runs")
    figures = [f for cell in cells for f in serve_figures(cell, n_boot)]
    return figures + [sweep_report.write_sweep_report(run_dir, n_boot=n_boot)[1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="serve, host-bench or sweep results directories")
    ap.add_argument("--n-boot", type=int, default=None, help="bootstrap resamples (default: the run's)")
    args = ap.parse_args(argv)
    for d in args.run_dirs:
        for f in regenerate(d, args.n_boot):
            print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
