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


def _fast(e: dict[str, Any]) -> tuple[float | None, str | None]:
    """vLLM with the faster hash on this entry (its median, its algorithm), when that side ran."""
    fast = e.get("fast_hash")
    return (e[fast["side"]]["median"], fast["algo"]) if fast else (None, None)


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Both operations at the headline contexts; the targets at the largest one. Where vLLM's hashing is
    timed and vLLM with xxhash ran, the row carries it too, and one more row holds the same target against
    it (the sha256 row's target is unchanged)."""
    top = max(contexts)
    rows: list[dict[str, Any]] = []
    for key, label, target in _ROWS:
        for e in section[key]:
            c = e["context_tokens"]
            if c not in contexts:
                continue
            note = "" if section.get("outcomes_identical", True) else "outcomes differ between the sides"
            paged_fast, algo = _fast(e)
            rows.append(
                row(label, c, e["paged"]["median"], e["tagma"]["median"], "ms",
                    TARGETS[target] if c == top else None, note=note, paged_fast=paged_fast, fast_hash=algo)
            )  # fmt: skip
            fast_target = TARGETS.get(f"{target}_{algo}") if algo else None
            if c == top and fast_target is not None:
                same = section.get("fast_hash_outcomes_identical")
                rows.append(
                    row(
                        f"{label}, vs vLLM with {algo} (--prefix-caching-hash-algo {algo})",
                        c,
                        paged_fast,
                        e["tagma"]["median"],
                        "ms",
                        fast_target,
                        note=f"paged = vLLM with {algo}, interleaved with sha256 and tagma in one run; "
                        f"paired ratio tagma/{algo} {_fmt(e.get('ratio_paired_vs_fast_hash'))}, "
                        f"{algo}/sha256 {_fmt(e.get('fast_hash/paged'))}; outcomes as sha256's: "
                        f"{'yes' if same else 'NO' if same is not None else '-'}",
                    )
                )
    return rows


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (key, label, _) in zip(axes, _ROWS, strict=True):
        sel = section[key]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(xs, [e[side]["median"] for e in sel], "o-", color=COLOR[side], label=side)
        fast = [e["fast_hash"] for e in sel if e.get("fast_hash")]
        if fast and len(fast) == len(sel):  # vLLM with xxhash, where it ran
            name = fast[0]["side"]
            ax.plot(xs, [e[name]["median"] for e in sel], "s--", color=COLOR["paged"], alpha=0.6,
                    label=f"paged, {fast[0]['algo']}")  # fmt: skip
        loglog(ax, label, "prompt (tokens)", "ms")
        ax.legend(fontsize=7)
    return save_figure(fig, path)
