"""Shared look of the host benchmark's figures: one colour per variant, log-log axes."""

from __future__ import annotations

from typing import Any

from harness.analysis.plots import COLORS, plt

__all__ = ["COLOR", "loglog", "plt"]

COLOR = {
    **COLORS,
    "vllm_op": COLORS["paged"],
    "vllm_worker": "#6baed6",
    "tagma_binding": COLORS["tagma"],
    "tagma_raw": "#ff9896",
    "tagma_worker": "#9467bd",
    "memcpy": "0.3",
    "native": "#2ca02c",
    "ctypes": COLORS["tagma"],
}


def loglog(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
