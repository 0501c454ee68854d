"""The engine section (benchmarks.host.engine_ops): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, loglog, plt
from benchmarks.host.report.table import TARGETS, at, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """vLLM BlockPool vs the engine through ctypes, per operation, at the headline contexts."""
    rows: list[dict[str, Any]] = []
    for op, label in (
        ("alloc_release", "engine alloc+release n blocks (vLLM BlockPool vs ctypes)"),
        ("grow_in_place", "engine one decode block (vLLM get_new_blocks(1) vs ctypes)"),
        ("prefix_hit_release", "engine prefix hit+release n blocks (touch/free vs attach)"),
    ):
        for c in contexts:
            e = at(section["rows"], op=op, context_tokens=c)
            if e and e.get("paged"):
                native = e["native"]["median"] if e.get("native") else None
                note = f"native {native:.0f} ns" if native is not None else ""
                rows.append(row(label, c, e["paged"]["median"], e["ctypes"]["median"], "ns", note=note))
    top = max(contexts)
    e = at(section["rows"], op="grow_in_place_batch", context_tokens=top)
    if e and e.get("native"):
        rows.append(
            row(
                "binding fixed cost per crossing (the manager's batched append, 1 entry of 1 block: "
                "ctypes - native)",
                top,
                None,
                e["binding_overhead_ns"],
                "ns",
                TARGETS["binding_fixed"],
                note=f"ctypes {e['ctypes']['median']:.0f} ns, native {e['native']['median']:.0f} ns",
            )
        )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path:
    rows = section["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(
        2, (len(ops) + 1) // 2, figsize=(3.6 * ((len(ops) + 1) // 2), 6.4), squeeze=False
    )
    for ax, op in zip(axes.flat, ops, strict=False):
        sel = [r for r in rows if r["op"] == op]
        xs = [r["context_tokens"] for r in sel]
        for key, label in (
            ("native", "tagma native"),
            ("ctypes", "tagma ctypes"),
            ("paged", "vLLM BlockPool"),
        ):
            ys = [r[key]["median"] if r.get(key) else None for r in sel]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    "o-",
                    label=label,
                    color=COLOR["native" if key == "native" else "tagma" if key == "ctypes" else "paged"],
                )
        loglog(ax, op, "context (tokens)", "ns per operation")
    for ax in list(axes.flat)[len(ops) :]:
        ax.axis("off")
    labels: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(label, handle)
    spare = list(axes.flat)[len(ops)] if len(ops) < axes.size else axes.flat[0]
    spare.legend(list(labels.values()), list(labels), fontsize=8, loc="center")
    return save_figure(fig, path)
