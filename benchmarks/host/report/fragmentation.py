"""The fragmentation section (benchmarks.host.fragmentation): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import plt
from benchmarks.host.report.table import FRAGMENTATION_GOAL, TARGETS, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Per context and pool factor: the target policy's ranges per request against runs of vLLM block ids,
    and its trade-off against paged at equal KV capacity (admitted concurrency, throughput proxy)."""
    rows: list[dict[str, Any]] = []
    goal = FRAGMENTATION_GOAL
    for t in section["traces"]:
        if t["context_tokens"] not in contexts:
            continue
        pol = t["policies"]
        name = goal["policy"] if goal["policy"] in pol else "headroom"
        tagma = pol.get(name)
        paged = t.get("paged_vllm_blockpool")
        if tagma is None:
            continue
        where = f"pool x{t['pool_factor']}"
        if abs(float(t["pool_factor"]) - goal["pool_factor"]) < 1e-9:
            rows.append(_target_row(t, name, tagma, paged))
        others = "; ".join(
            f"{n} mean {v['ranges_at_completion']['mean']:.1f} p99 {v['ranges_at_completion']['p99']:.0f}, "
            f"{v['running_mean']:.1f} running, {v['blocks_per_tick']:.0f} tok/step"
            for n, v in pol.items()
            if n != name
        )
        done = tagma["ranges_at_completion"]
        rows.append(
            row(
                f"ranges/request at completion, {name} ({where})",
                t["context_tokens"],
                paged["ranges_at_completion"]["mean"] if paged else None,
                done["mean"],
                "ranges",
                note=f"p99 {done['p99']:.0f}, max {done['max']}, decode in place "
                f"{100 * (tagma['decode_in_place_share'] or 0):.1f}%; paged = runs of vLLM ids; {others}",
            )
        )
        pre = f"preemptions paged {paged['preemptions']}" if paged else "paged not run"
        rows.append(
            row(
                f"admitted concurrency (mean running), {name} ({where})",
                t["context_tokens"],
                paged["running_mean"] if paged else None,
                tagma["running_mean"],
                "requests",
                note=f"{pre}, {name} {tagma['preemptions']} (+ {tagma['refusals']} declined allocations); "
                f"{t['requests']} slots",
            )
        )
        rows.append(
            row(
                f"throughput proxy, {name} ({where})",
                t["context_tokens"],
                paged["blocks_per_tick"] if paged else None,
                tagma["blocks_per_tick"],
                "tok/step",
                note=f"the trace's tokens / simulated steps ({tagma['ticks']} vs "
                f"{paged['ticks'] if paged else '-'} ticks); recomputation after preemption not charged",
            )
        )
    return rows


def _target_row(
    t: dict[str, Any], name: str, tagma: dict[str, Any], paged: dict[str, Any] | None
) -> dict[str, Any]:
    """The target: mean and p99 ranges per request in a trace that saturates the pool, none rejected."""
    done = tagma["ranges_at_completion"]
    rejected = tagma.get("rejected", 0)
    goal = FRAGMENTATION_GOAL
    # saturation: vLLM's paged pool preempts in this trace (headroom makes the same decisions when paged
    # was not run)
    witness = paged or t["policies"].get("headroom") or tagma
    r = row(
        f"fragmentation target, {name} (pool x{t['pool_factor']})",
        t["context_tokens"],
        None,
        done["mean"],
        "ranges",
        TARGETS["fragmentation"],
        note=f"mean {done['mean']:.2f} (<= {goal['mean']:.0f}), p99 {done['p99']:.1f} "
        f"(<= {goal['p99']:.0f}), rejected {rejected}; preemptions: paged {witness['preemptions']}, "
        f"tagma {tagma['preemptions']}; running {tagma['running_mean']:.1f} vs "
        f"{witness['running_mean']:.1f}, tok/step {tagma['blocks_per_tick']:.0f} vs "
        f"{witness['blocks_per_tick']:.0f}",
    )
    within = done["mean"] <= goal["mean"] and done["p99"] <= goal["p99"]
    r["met"] = bool(within and rejected == 0)
    if not r["met"] and "missed" not in r["note"]:
        r["note"] += "; missed"
    if witness["preemptions"] == 0:
        r["met"] = None
        r["note"] += "; the pool does not saturate at this factor (paged never preempts): not a test of it"
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
        ax.set_xticks(list(xs), labels, fontsize=7, rotation=30, ha="right")
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
