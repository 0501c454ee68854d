"""Figures of a GPU kernel run; ``python -m benchmarks.gpu.plots RUN_DIR...`` redraws them (kernels.json)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu.bench import WRITE_KERNELS


def plot(result: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return []
    s = result["config"]
    placements = s["placements"]
    rows = [("decode_attention", "decode")] + [(k, ph) for k in WRITE_KERNELS for ph in ("decode", "prefill")]
    fig, axes = plt.subplots(
        len(rows),
        len(placements),
        figsize=(4.2 * len(placements), 2.6 * len(rows)),
        squeeze=False,
        sharex=True,
    )
    for i, (kernel, phase) in enumerate(rows):
        for j, pl in enumerate(placements):
            ax = axes[i][j]
            for batch in s["batches"]:
                pts = [
                    (r["context"], r["tagma_over_paged"])
                    for r in result["ratios"]
                    if r["kernel"] == kernel
                    and r["phase"] == phase
                    and r["placement"] == pl
                    and r["batch"] == batch
                ]
                if not pts:
                    continue
                x = [p[0] for p in pts]
                y = [p[1]["ratio"] for p in pts]
                err = [
                    [p[1]["ratio"] - p[1]["ci95_lo"] for p in pts],
                    [p[1]["ci95_hi"] - p[1]["ratio"] for p in pts],
                ]
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"batch {batch}")
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kernel} ({phase})\n{pl}", fontsize=9)
            if j == 0:
                ax.set_ylabel("tagma / paged time")
            if i == len(rows) - 1:
                ax.set_xlabel("context (tokens)")
            ax.legend(fontsize=7)
    fig.suptitle(f"{result['machine'].get('device')}: tagma/paged (below 1: tagma faster)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out_dir / "ratios.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(placements), figsize=(4.8 * len(placements), 3.8), squeeze=False)
    key = "frac_peak" if result["machine"].get("peak_gbps") else "median_ms"
    for j, pl in enumerate(placements):
        ax = axes[0][j]
        for variant, style in (("paged", "-"), ("tagma", "--"), ("sdpa_contiguous", ":")):
            for color, batch in enumerate(s["batches"]):
                pts = [
                    (t["context"], t[key])
                    for t in result["timings"]
                    if t["kernel"] == "decode_attention"
                    and t["variant"] == variant
                    and t["batch"] == batch
                    and t["placement"] in (pl, "contiguous_tensor")
                ]
                if pts and all(p[1] is not None for p in pts):
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        style,
                        color=f"C{color}",
                        marker="o",
                        label=f"{variant} b{batch}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_title(f"decode attention, {pl}", fontsize=9)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("fraction of peak bandwidth" if key == "frac_peak" else "median ms")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "bandwidth.png", dpi=110)
    plt.close(fig)
    return ["ratios.png", "bandwidth.png"]



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="GPU kernel result directories (kernels.json)")
    args = ap.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "kernels.json").exists():
            ap.error(f"{run_dir}: no kernels.json (not a GPU kernel run)")
        for name in plot(json.loads((run_dir / "kernels.json").read_text()), run_dir):
            print(run_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
