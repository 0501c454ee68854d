"""Run the GPU kernel benchmark: ``python -m benchmarks.gpu [--dry-run] [options]`` (see the package)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gpu.bench import BYTES_MODEL, Bench
from benchmarks.gpu.machine import check_device, machine
from benchmarks.gpu.plots import plot
from benchmarks.gpu.settings import ROOT, parse_args


def print_summary(result: dict[str, Any]) -> None:
    print(
        f"{'kernel':<17}{'phase':<9}{'placement':<22}{'ctx':>7}{'batch':>6}{'tagma/paged':>13}{'95% CI':>17}"
    )
    for r in result["ratios"]:
        t = r["tagma_over_paged"]
        ci = f"[{t['ci95_lo']:.3f}, {t['ci95_hi']:.3f}]"
        print(
            f"{r['kernel']:<17}{r['phase']:<9}{r['placement']:<22}{r['context']:>7}{r['batch']:>6}"
            f"{t['ratio']:>13.3f}{ci:>17}"
        )



def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    if s.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels' modules are imported (below)
    check_device(s)
    info = machine(s)
    started = datetime.now(UTC)
    run_id = s.run_id or ("kernels-" + ("dryrun-" if s.interpret else "") + started.strftime("%Y%m%dT%H%M%S"))
    out_dir = s.out_dir / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(s, info)
    results = bench.run()
    from benchmarks.fragmentation_sim import DEFAULT_TRACE_PATH, load_trace

    traces = {p: load_trace(p.split(":", 1)[1]) for p in s.placements if p.startswith("fragmented:")}
    result = {
        "kind": "gpu_kernels",
        "measurement": "interpreter smoke run, NOT a GPU measurement" if s.interpret else "GPU",
        "run_id": run_id,
        "started": started.isoformat(),
        "seconds": (datetime.now(UTC) - started).total_seconds(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
        "machine": info,
        "bytes_model": BYTES_MODEL,
        "fragmentation_source": {
            "file": str(DEFAULT_TRACE_PATH.relative_to(ROOT)),
            "traces": {
                p: {"source": t["source"], "config": t["config"], "summary": t["summary"]}
                for p, t in traces.items()
            },
        },
        **asdict(results),
    }
    (out_dir / "kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    pngs = plot(result, out_dir)
    print_summary(result)
    failed = [c for c in results.checks if not c["ok"]]
    print(f"wrote {out_dir / 'kernels.json'}" + "".join(f", {p}" for p in pngs))
    if failed:
        print(f"CORRECTNESS FAILED in {len(failed)} checks: {failed[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
