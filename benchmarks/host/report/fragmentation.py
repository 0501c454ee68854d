"""The fragmentation section (benchmarks.host.fragmentation): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import plt
from benchmarks.host.report.table import FRAGMENTATION_GOAL, TARGETS, row
from harness.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Ranges per request at completion under headroom, against runs of vLLM block ids."""
    rows: list[dict[str, Any]] = []
    for t in section["traces"]:
        if t["context_tokens"] not in contexts:
            continue
        pol = t["policies"]
        head = pol.get("headroom")
        paged = t.get("paged_vllm_blockpool")
        if head is None:
            continue
        others = ", ".join(
            f"{name} mean {v['ranges_at_completion']['mean']:.0f} "
            f"({v['requests_over_256_ranges']} reqs > 256)"
            for name, v in pol.items()
            if name != "headroom"
        )
        if abs(float(t["pool_factor"]) - FRAGMENTATION_GOAL["pool_factor"]) < 1e-9:
            rows.append(_target_row(t, head))
        rows.append(
            row(
                f"ranges/request at completion, headroom (pool x{t['pool_factor']}, "
                f"{head['preemptions']} preemptions)",
                t["context_tokens"],
                paged["ranges_at_completion"]["mean"] if paged else None,
                head["ranges_at_completion"]["mean"],
                "ranges",
                note=f"p99 {head['ranges_at_completion']['p99']:.0f}, "
                f"max {head['ranges_at_completion']['max']}, "
                f"{head['requests_over_256_ranges']} reqs > 256, decode in place "
                f"{100 * head['decode_in_place_share']:.1f}%; paged = runs of vLLM ids; {others}",
            )
        )
    return rows


def _target_row(t: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """The target: mean and p99 of the manager's default placement, with preemptions, none rejected."""
    done = head["ranges_at_completion"]
    rejected = head.get("rejected", 0)
    goal = FRAGMENTATION_GOAL
    r = row(
        f"fragmentation target, headroom (pool x{t['pool_factor']}, {head['preemptions']} preemptions)",
        t["context_tokens"],
        None,
        done["mean"],
        "ranges",
        TARGETS["fragmentation"],
        note=f"mean {done['mean']:.1f} (<= {goal['mean']:.0f}), p99 {done['p99']:.1f} "
        f"(<= {goal['p99']:.0f}), rejected {rejected}",
    )
    within = done["mean"] <= goal["mean"] and done["p99"] <= goal["p99"]
    r["met"] = bool(within and rejected == 0 and head["preemptions"] > 0)
    if head["preemptions"] == 0:
        r["note"] += "; no preemption happened in this trace (the target asks for some)"
    return r


def plot(section: dict[str, Any], path: Path) -> Path:
    traces = section["traces"]
    cols = min(2, len(traces))
    nrows = -(-len(traces) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4 * nrows), squeeze=False)
    for ax in list(axes.flat)[len(traces) :]:
        ax.axis("off")
    for ax, t in zip(axes.flat, traces, strict=False):
        names = list(t["policies"])
        labels = names + (["vLLM paged"] if t.get("paged_vllm_blockpool") else [])
        data = [t["policies"][p] for p in names] + (
            [t["paged_vllm_blockpool"]] if t.get("paged_vllm_blockpool") else []
        )
        xs = range(len(labels))
        ax.bar(
            [x - 0.2 for x in xs],
            [d["ranges_at_completion"]["mean"] for d in data],
            0.4,
            label="mean",
            color="#1f77b4",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [d["ranges_at_completion"]["p99"] for d in data],
            0.4,
            label="p99",
            color="#ff7f0e",
        )
        ax.set_yscale("log")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("ranges per request at completion")
        for x, d in zip(xs, data, strict=True):
            share = d.get("decode_in_place_share")
            if share is not None:
                ax.text(
                    x, 0.02, f"in place {100 * share:.0f}%", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7,
                )  # fmt: skip
        ax.set_title(
            f"{t['context_tokens']} tokens, {t['requests']} concurrent, pool x{t['pool_factor']}, "
            f"{t['policies'][names[0]]['preemptions']} preemptions",
            fontsize=9,
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)
