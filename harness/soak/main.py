"""`python -m harness.soak.main [--profile short|long|<file.yaml>] [--out DIR] [key=value ...]`: one soak.

Writes results/soak/<id>/ (requests.jsonl, summary.json, summary.md, each arm's server log and telemetry)
and exits 1 when an invariant broke.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from harness.serve import tiny_model
from harness.soak.config import REPO, SoakConfig
from harness.soak.driver import run_soak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="short", help="configs/soak/<name>.yaml, or a YAML file")
    ap.add_argument("--model", type=Path, default=tiny_model.DEFAULT_DIR)
    ap.add_argument("--out", type=Path, default=None, help="default: results/soak/<time>-<profile>")
    ap.add_argument("overrides", nargs="*", help="key=value (YAML values), e.g. duration_s=30")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    cfg = SoakConfig.load(args.profile, **overrides)
    out = args.out or REPO / "results" / "soak" / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.profile}"
    summary = run_soak(cfg, args.model.resolve(), out)
    print((out / "summary.md").read_text())
    print(f"soak {cfg.profile}: {'ok' if summary['ok'] else 'INVARIANTS BROKEN'} ({out})")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
