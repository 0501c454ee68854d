"""Redraw every figure of host-bench runs without Jupyter: ``python -m benchmarks.host.report RUN_DIR...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.host.report import figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="host-bench result directories (host_bench.json)")
    args = ap.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "host_bench.json").exists():
            ap.error(f"{run_dir}: no host_bench.json (not a host-bench run)")
        for path in figures(run_dir):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
