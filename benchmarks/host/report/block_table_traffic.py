"""The block-table traffic section (benchmarks.host.block_table_traffic): rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, loglog, plt
from benchmarks.host.report.table import TARGETS, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Block-table bytes per decode step, worker and scheduler side, at the headline contexts."""
    top = max(contexts)
    rows: list[dict[str, Any]] = []
    for s in section["scenarios"]:
        if s["context_tokens"] not in contexts:
            continue
        c = s["context_tokens"]
        b = s["per_step_bytes"]
        is_target = c == top
        rows.append(
            row(
                f"worker block-table bytes/step, MRV1 vs ranges ({s['requests']} reqs)",
                c,
                b["worker_mrv1"]["mean"],
                b["worker_ranges"]["mean"],
                "B",
                TARGETS["block_table_bytes"] if is_target else None,
            )
        )
        rows.append(
            row(
                f"worker block-table bytes/step, MRV2 vs ranges ({s['requests']} reqs)",
                c,
                b["worker_mrv2"]["mean"],
                b["worker_ranges"]["mean"],
                "B",
            )
        )
        rows.append(
            row(
                f"scheduler->worker block bytes/step ({s['requests']} reqs)",
                c,
                b["sched_paged"]["mean"],
                b["sched_ranges"]["mean"],
                "B",
            )
        )
        rows.append(
            row(
                f"tagma plugin today (dense + ranges) vs MRV1 ({s['requests']} reqs)",
                c,
                b["worker_mrv1"]["mean"],
                b["tagma_plugin_now"]["mean"],
                "B",
            )
        )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path:
    reqs = sorted({s["requests"] for s in section["scenarios"]})
    fig, axes = plt.subplots(1, len(reqs), figsize=(6 * len(reqs), 4), squeeze=False)
    for ax, r in zip(axes[0], reqs, strict=True):
        sel = [s for s in section["scenarios"] if s["requests"] == r]
        xs = [s["context_tokens"] for s in sel]
        for metric, color, style in (
            ("worker_mrv1", COLOR["paged"], "o-"),
            ("worker_mrv2", "#6baed6", "o--"),
            ("worker_ranges", COLOR["tagma"], "o-"),
            ("tagma_plugin_now", "#9467bd", "x:"),
            ("sched_paged", COLOR["paged"], "s:"),
            ("sched_ranges", COLOR["tagma"], "s:"),
        ):
            ax.plot(
                xs,
                [max(s["per_step_bytes"][metric]["mean"], 1e-1) for s in sel],
                style,
                color=color,
                label=metric,
            )
        loglog(ax, f"block-table bytes per decode step, {r} requests", "context (tokens)", "bytes per step")
        ax.legend(fontsize=7)
    return save_figure(fig, path)
