"""The groups section (benchmarks.host.group_ops): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, plt
from benchmarks.host.report.table import TARGETS, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def _label(e: dict[str, Any]) -> str:
    caching = ", caching on" if e.get("caching") else ""
    return f"{e['layout']}, block {e['block_size']}{caching}"


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Per layout and block size at its context: admission+free, decode step, window blocks, bytes."""
    rows: list[dict[str, Any]] = []
    for e in section["admission_free"]:
        rows.append(
            row(
                f"hybrid admission+free ({_label(e)})",
                e["context_tokens"],
                e["paged"]["median"],
                e["tagma"]["median"],
                "ms",
                TARGETS["group_admission_free"],
            )
        )
    for e in section["decode_step"]:
        churn = e["churn_per_request_step"]
        note = (
            f"window churn per request-step: vLLM {churn['paged']['blocks_freed']:.3f} blocks freed in "
            f"{churn['paged']['free_calls']:.3f} free_blocks calls, tagma the same blocks in "
            f"{churn['tagma']['free_calls']:.3f} engine calls"
        )
        rows.append(
            row(
                f"hybrid decode step per request ({_label(e)}, {e['requests']} reqs)",
                e["context_tokens"],
                e["paged"]["median"],
                e["tagma"]["median"],
                "us",
                TARGETS["group_decode_step"],
                note=note,
            )
        )
        held = e["window_blocks_held"]
        rows.append(
            row(
                f"window-group blocks held per request ({_label(e)})",
                e["context_tokens"],
                float(held["paged"]),
                float(held["tagma"]),
                "blocks",
                TARGETS["group_window_blocks"],
            )
        )
    for e in section["resident_bytes"]:
        b = e["bytes_per_request"]
        rows.append(
            row(
                f"hybrid Python bytes per resident request ({_label(e)})",
                e["context_tokens"],
                b["paged"],
                b["tagma"],
                "B",
                TARGETS["group_resident_bytes"],
            )
        )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path | None:
    """Speedup (paged / tagma) of each timed row, per layout and block size."""
    bars: list[tuple[str, float]] = []
    for key, what in (("admission_free", "admission+free"), ("decode_step", "decode step")):
        for e in section[key]:
            if e.get("ratio"):
                bars.append((f"{what}\n{_label(e)}", 1.0 / e["ratio"]))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(bars)), 4.0))
    ax.bar(range(len(bars)), [v for _, v in bars], color=COLOR["tagma"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(bars)), [k for k, _ in bars], fontsize=7)
    ax.set_ylabel("paged / tagma (higher: tagma cheaper)")
    ax.set_title("hybrid KV cache layouts, prefix caching off and on")
    return save_figure(fig, path)
