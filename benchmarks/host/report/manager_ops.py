"""The manager section (benchmarks.host.manager_ops): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, loglog, plt
from benchmarks.host.report.table import TARGETS, at, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Admission+free, decode step and prefix-hit rows at the headline contexts."""
    top = max(contexts)
    rows: list[dict[str, Any]] = []
    for caching, key in ((False, "admission_free_caching_off"), (True, "admission_free_caching_on")):
        for c in contexts:
            e = at(section["admission_free"], context_tokens=c, prefix_caching=caching)
            if e:
                rows.append(
                    row(
                        f"admission+free, prefix caching {'on' if caching else 'off'}",
                        c,
                        e["paged"]["median"],
                        e["tagma"]["median"],
                        "ms",
                        TARGETS[key] if c == top else None,
                    )
                )
    decode = section["decode_step"]
    for e in decode:
        if e["context_tokens"] not in contexts:
            continue
        largest = max(d["context_tokens"] for d in decode if d["requests"] == e["requests"])
        is_target = e["context_tokens"] == largest
        note = (
            ""
            if e["context_tokens"] == top or not is_target
            else f"largest context run for {e['requests']} reqs"
        )
        rows.append(
            row(
                f"decode step per request ({e['requests']} reqs, caching "
                f"{'on' if e['prefix_caching'] else 'off'})",
                e["context_tokens"],
                e["paged"]["median"],
                e["tagma"]["median"],
                "us",
                TARGETS["decode_step"] if is_target else None,
                note=note,
            )
        )
    for e in section.get("resident_bytes", []):
        if e["context_tokens"] not in contexts:
            continue
        is_target = e["context_tokens"] == top and not e["prefix_caching"]
        rows.append(
            row(
                f"Python bytes per resident request (tracemalloc, caching "
                f"{'on' if e['prefix_caching'] else 'off'})",
                e["context_tokens"],
                e["bytes_per_request"]["paged"],
                e["bytes_per_request"]["tagma"],
                "B",
                TARGETS["resident_bytes"] if is_target else None,
                note=f"tagma side: {e['manager_class']['tagma']}",
            )
        )
    for e in section["prefix_hit"]:
        if e["context_tokens"] in contexts:
            rows.append(
                row(
                    e["op"].replace("_", " "),
                    e["context_tokens"],
                    e["paged"]["median"],
                    e["tagma"]["median"],
                    "us",
                )
            )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    for caching, style in ((False, "--"), (True, "-")):
        sel = [e for e in section["admission_free"] if e["prefix_caching"] == caching]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs,
                [e[side]["median"] for e in sel],
                "o" + style,
                color=COLOR[side],
                label=f"{side}, caching {'on' if caching else 'off'}",
            )
    loglog(ax, "admission + free of one request", "prompt (tokens)", "ms")
    ax.legend(fontsize=7)
    ax = axes[1]
    keys = sorted({(e["requests"], e["prefix_caching"]) for e in section["decode_step"]})
    for reqs, caching in keys:
        sel = [e for e in section["decode_step"] if e["requests"] == reqs and e["prefix_caching"] == caching]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs,
                [e[side]["median"] for e in sel],
                "o-" if caching else "s--",
                color=COLOR[side],
                alpha=1.0 if reqs == keys[0][0] else 0.55,
                label=f"{side}, {reqs} reqs, caching {'on' if caching else 'off'}",
            )
    loglog(ax, "decode step, per request-step", "context (tokens)", "us")
    ax.legend(fontsize=6)
    ax = axes[2]
    for op, style in (("prefix_hit_lookup", "--"), ("prefix_hit_admission", "-")):
        sel = [e for e in section["prefix_hit"] if e["op"] == op]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs, [e[side]["median"] for e in sel], "o" + style, color=COLOR[side], label=f"{side}, {op}"
            )
    loglog(ax, "prefix-cache hit", "cached prompt (tokens)", "us")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
