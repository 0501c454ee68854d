"""The findings' figures (matplotlib, PNG): verdict heat maps over the closed-loop grid, predicted vs measured
step ratios, and where a step's time goes per cell and arm."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["ab_cells", "write_figures"]

VERDICT_MARK = {"faster": "+", "higher": "+", "slower": "-", "lower": "-", "parity": "=", "inconclusive": "?"}
PARTS = ("kv_manager", "schedule_other", "update_other", "worker_prepare", "forward")


def ab_cells(maps: Sequence[dict[str, Any]], aa: bool = False) -> Iterator[tuple[dict, dict, dict]]:
    """(map, job, cell) for every A/B cell (A/A cells with ``aa``)."""
    for m in maps:
        for job in m["jobs"]:
            if bool(job["aa"]) == aa:
                for cell in job["cells"]:
                    yield m, job, cell


def _heat_map(maps: Sequence[dict], metric: str, path: Path) -> Path | None:
    closed = [(job, c) for _, job, c in ab_cells(maps) if c["cell"]["load"] == "closed"]
    groups = sorted({job["group"] for job, _ in closed})
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        cells = [c for job, c in closed if job["group"] == group]
        prompts = sorted({c["cell"]["prompt_tokens"] for c in cells})
        concs = sorted({c["cell"]["concurrency"] for c in cells})
        grid = [[float("nan")] * len(concs) for _ in prompts]
        for c in cells:
            row = c["metrics"].get(metric) or {}
            i, j = prompts.index(c["cell"]["prompt_tokens"]), concs.index(c["cell"]["concurrency"])
            if row.get("ratio") is not None:
                grid[i][j] = row["ratio"]
            mark = VERDICT_MARK.get(row.get("verdict", ""), "")
            mde = row.get("mde")
            label = f"{row['ratio']:.3f}{mark}" if row.get("ratio") is not None else "n/a"
            label += f"\nMDE {mde:.0%}" if mde is not None else ""
            ax.text(j, i, label, ha="center", va="center", fontsize=7)
        im = ax.imshow(grid, cmap="RdBu", vmin=0.8, vmax=1.25, aspect="auto")
        ax.set_xticks(range(len(concs)), [str(c) for c in concs])
        ax.set_yticks(range(len(prompts)), [str(p) for p in prompts])
        ax.set_xlabel("concurrency (closed loop)")
        ax.set_ylabel("prompt tokens")
        ax.set_title(f"{group}: {metric}\ntagma / paged", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("+ better, - worse, = parity, ? inconclusive (calibrated, Holm per cell)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _predicted_vs_measured(maps: Sequence[dict], path: Path) -> Path | None:
    rows = [
        (f"{job['group']}/{c['cell']['name']}", c)
        for _, job, c in ab_cells(maps)
        if c["prediction"].get("step_ratio") is not None
    ]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows)), 3.8))
    xs = range(len(rows))
    pred = [c["prediction"]["step_ratio"] for _, c in rows]
    meas = [(c["metrics"].get("p50_tpot_ms") or {}) for _, c in rows]
    ax.bar([x - 0.2 for x in xs], pred, width=0.4, label="predicted step ratio (host parts)")
    vals = [m.get("ratio") or float("nan") for m in meas]
    lo = [
        v - (m.get("ci") or [v, v])[0] if m.get("ci") and m["ci"][0] is not None else 0
        for v, m in zip(vals, meas, strict=True)
    ]
    hi = [
        (m.get("ci") or [v, v])[1] - v if m.get("ci") and m["ci"][1] is not None else 0
        for v, m in zip(vals, meas, strict=True)
    ]
    ax.bar(
        [x + 0.2 for x in xs],
        vals,
        width=0.4,
        yerr=[lo, hi],
        capsize=2,
        label="measured p50 TPOT ratio [95% CI]",
    )
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks(list(xs), [n for n, _ in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("tagma / paged")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _step_stacks(maps: Sequence[dict], path: Path) -> Path | None:
    bars = []
    for _, job, c in ab_cells(maps):
        for arm, comp in (c.get("composition") or {}).items():
            if comp and "forward" in comp["us_per_step"]:
                backend = c["backends"][0 if arm == "baseline" else 1]
                bars.append((f"{job['group']}/{c['cell']['name']} {backend}", comp))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(bars)), 4.0))
    bottom = [0.0] * len(bars)
    for part in PARTS:
        shares = [
            comp["us_per_step"].get(part, 0.0) / comp["step_us"] * 100 if comp["step_us"] else 0.0
            for _, comp in bars
        ]
        ax.bar(range(len(bars)), shares, bottom=bottom, label=part)
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    ax.set_xticks(range(len(bars)), [n for n, _ in bars], rotation=70, ha="right", fontsize=6)
    ax.set_ylabel("% of a busy step (mean)")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.12))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_figures(maps: Sequence[dict[str, Any]], out_dir: Path) -> dict[str, Path]:
    """Every figure the maps allow, by name; stale PNGs of these names are replaced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made = {
        "heat_throughput": _heat_map(maps, "output_throughput", out_dir / "heat_output_throughput.png"),
        "heat_tpot_p50": _heat_map(maps, "p50_tpot_ms", out_dir / "heat_p50_tpot.png"),
        "heat_ttft_p50": _heat_map(maps, "p50_ttft_ms", out_dir / "heat_p50_ttft.png"),
        "predicted_vs_measured": _predicted_vs_measured(maps, out_dir / "predicted_vs_measured.png"),
        "step_stacks": _step_stacks(maps, out_dir / "step_composition.png"),
    }
    return {k: v for k, v in made.items() if v is not None}
