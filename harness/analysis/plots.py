"""Figures of a serve run. The report and the notebooks call these same functions (one implementation).

Every function takes plain data (lists and dicts as stored in a run's JSON files) and writes one PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"paged": "#1f77b4", "tagma": "#d62728"}
VERDICT_COLORS = {"faster": "#2ca02c", "higher": "#2ca02c", "slower": "#d62728", "lower": "#d62728"}
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))


def save_figure(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_cdfs(samples: Mapping[str, Mapping[str, Sequence[float]]], path: Path) -> Path:
    """samples[backend][metric] = values in ms (pooled over repeats): one CDF panel per latency."""
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(4.2 * len(LATENCIES), 3.4))
    for ax, (key, title) in zip(axes, LATENCIES, strict=True):
        for backend, metrics in samples.items():
            v = np.sort(np.asarray(metrics.get(key, []), dtype=float))
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=backend, color=COLORS.get(backend))
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend()
    return save_figure(fig, path)


def ratio_intervals(ab: Sequence[Mapping], path: Path, title: str = "tagma / paged (95% CI)") -> Path:
    """One row per metric: the ratio and its bootstrap interval; the line at 1 is parity."""
    rows = [r for r in ab if r.get("ratio") is not None]
    fig, ax = plt.subplots(figsize=(7, 0.38 * max(len(rows), 1) + 1.2))
    for i, r in enumerate(rows):
        lo, hi = r["ci_low"], r["ci_high"]
        color = VERDICT_COLORS.get(r["verdict"], "0.4")
        err = None if lo is None else [[r["ratio"] - lo], [hi - r["ratio"]]]  # no interval: a point
        ax.errorbar(r["ratio"], i, xerr=err, fmt="o", color=color, capsize=3)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [r["metric"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ratio")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def per_run_values(values: Mapping[str, Mapping[str, Sequence[float]]], path: Path) -> Path:
    """values[metric][backend] = one value per repeat: mean bar with every repeat as a dot."""
    metrics = list(values)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * max(len(metrics), 1), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for j, (backend, vals) in enumerate(values[metric].items()):
            v = np.asarray([x for x in vals if x is not None], dtype=float)
            if len(v):
                ax.bar(j, v.mean(), color=COLORS.get(backend), alpha=0.5)
                ax.plot(np.full(len(v), j), v, "o", color=COLORS.get(backend))
        ax.set_xticks(range(len(values[metric])), list(values[metric]))
        ax.set_title(metric, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def kv_usage_over_time(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: Path) -> Path:
    """series[run label] = (t_s, kv usage fraction)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, (t, u) in series.items():
        backend = label.split("-")[-1]
        ax.plot(t, np.asarray(u, dtype=float) * 100, label=label, color=COLORS.get(backend), alpha=0.8)
    ax.set_xlabel("s since run start")
    ax.set_ylabel("KV cache usage (%)")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def prompt_lengths(lengths: Sequence[int], path: Path, title: str = "prompt length (tokens)") -> Path:
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(np.asarray(lengths), bins=min(40, max(5, len(lengths) // 2)), color="0.5")
    ax.set_xlabel("tokens")
    ax.set_ylabel("requests")
    ax.set_title(title)
    return save_figure(fig, path)
