"""The prefix_ops section (benchmarks.host.prefix_ops): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, loglog, plt
from benchmarks.host.report.table import TARGETS, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]

_ROWS = (
    (
        "admission_free_hashed",
        "admission+free, prefix caching on, vLLM's request hashing counted",
        "admission_free_prefix_hashed",
    ),
    ("prefix_hit_lookup", "prefix-hit lookup (get_computed_blocks, prompt cached)", "prefix_hit_lookup"),
)


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Both operations at the headline contexts; the targets at the largest one."""
    top = max(contexts)
    rows: list[dict[str, Any]] = []
    for key, label, target in _ROWS:
        for e in section[key]:
            c = e["context_tokens"]
            if c not in contexts:
                continue
            note = "" if section.get("outcomes_identical", True) else "outcomes differ between the sides"
            rows.append(
                row(label, c, e["paged"]["median"], e["tagma"]["median"], "ms",
                    TARGETS[target] if c == top else None, note=note)
            )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (key, label, _) in zip(axes, _ROWS, strict=True):
        sel = section[key]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(xs, [e[side]["median"] for e in sel], "o-", color=COLOR[side], label=side)
        loglog(ax, label, "prompt (tokens)", "ms")
        ax.legend(fontsize=7)
    return save_figure(fig, path)
