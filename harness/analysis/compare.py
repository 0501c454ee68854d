"""Which samples of a run directory enter which statistical comparison: the design's rows
(:mod:`harness.designs`, each design owns its rows), Holm-corrected, and the in-server host-time rows.

The primary metrics (``run.primary_metrics``) get verdicts under Holm's correction; every other row is
descriptive. :func:`comparisons` is the one entry point; the report, the plots and the sweep report call it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.host_time import GROUP_PREFIX, group_index, load_run
from harness.analysis.runs import LATENCY_KEYS, ok_runs, request_values
from harness.analysis.statistics import Comparison, compare_by_run, holm
from harness.config import ARM_NAMES, SavedConfig
from harness.designs.registry import design


def comparisons(
    runs: Sequence[dict], config: SavedConfig | Mapping[str, Any], n_boot: int | None = None
) -> list[Comparison]:
    """Every comparison of a run directory's runs under its config (config.json), Holm-corrected."""
    cfg = SavedConfig.of(config)
    primary = set(cfg.run.primary_metrics)
    rows = design(cfg.run.design).rows(runs, cfg.backends, primary, int(n_boot or cfg.run.n_boot))
    return holm(rows, alpha=cfg.run.alpha)


def per_arm_latencies(runs: Sequence[dict], backends: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """arm label -> latency key -> values pooled over the arm's ok runs (for CDF plots)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for arm, backend in zip(ARM_NAMES, backends, strict=True):
        for key in LATENCY_KEYS:
            vals = [request_values(r, key) for r in ok_runs(runs, arm, backends)]
            out[f"{arm} ({backend})"][key] = [float(x) for v in vals for x in v]
    return dict(out)


# In-server host CPU time (harness.analysis.host_time): the report's components, as per-step columns in ns.
HOST_COMPONENTS = {
    "kv_manager": "kv_manager_total_ns_net",
    "schedule_other": "schedule_other_ns_net",
    "update_other": "update_other_ns_net",
    "worker_prepare": "worker_prepare_ns_net",
}


# The worker's other parts of a step (where its worker_parts rows exist): descriptive, beside the components.
PART_COMPONENTS = {
    "slot_mappings": "slot_mappings_ns_net",
    "attn_metadata": "attn_metadata_ns_net",
    "preprocess": "preprocess_ns_net",
    "model_forward": "forward_wall_ns",
}


# A busy step, whole, where the worker wrote its parts: the scheduler's components, the worker's input
# preparation, its parts and the rest of execute_model (logits, postprocessing; sampling runs after it).
STEP_PARTS = (*PART_COMPONENTS, "execute_other")


def host_dir(run: Mapping) -> Path:
    """Where a run's host-time files are: its own directory, or (a regime-map segment, one cell's share of a
    server lifetime) the lifetime's directory its status names."""
    d = Path(run["dir"])
    return (d / run["host_time_dir"]).resolve() if run.get("host_time_dir") else d


def host_steps(run: Mapping) -> dict[str, np.ndarray] | None:
    """The run's busy scheduler steps inside its replay window (from ``replay_start_ns``, up to
    ``replay_end_ns`` where the run shares its server), in us per component, plus ``forward`` (the worker's
    execute_model wall time less its input preparation, where the worker's steps line up), the worker's
    parts (:data:`PART_COMPONENTS`) and ``execute_other`` (``forward`` less the parts) where it wrote them,
    ``num_reqs``, ``num_tokens`` and ``end_ns``; None without host time."""
    try:
        host = load_run(host_dir(run))
    except (FileNotFoundError, ValueError):
        return None
    s = host.steps
    keep = (s["num_tokens"] > 0) & (s["end_ns"] >= int(run.get("replay_start_ns") or 0))
    if run.get("replay_end_ns"):
        keep &= s["end_ns"] <= int(run["replay_end_ns"])
    columns = HOST_COMPONENTS | PART_COMPONENTS
    out = {name: s[col][keep] / 1000.0 for name, col in columns.items() if col in s}
    for name in host.groups:  # per KV cache group (TAGMA_HOST_TIME_GROUPS=1): parts of kv_manager
        out[name] = s[f"{name}_ns_net"][keep] / 1000.0
    if "execute_wall_ns" in s and "worker_prepare" in out:
        out["forward"] = np.maximum(s["execute_wall_ns"][keep] / 1000.0 - out["worker_prepare"], 0.0)
        if all(name in out for name in PART_COMPONENTS):  # what execute_model does beside its timed parts
            timed = sum(out[name] for name in PART_COMPONENTS)
            out["execute_other"] = np.maximum(out["forward"] - timed, 0.0)
    out["num_reqs"] = s["num_reqs"][keep].astype(float)
    out["num_tokens"] = s["num_tokens"][keep].astype(float)
    out["end_ns"] = s["end_ns"][keep]
    return out


def group_components(steps: Mapping[str, Sequence[tuple[Any, Mapping[str, Any]]]]) -> list[str]:
    """The per-group components (``kv_group<g>_<kind>``) every run of both arms has, in group order."""
    names: set[str] | None = None
    for runs in steps.values():
        for _, s in runs:
            mine = {k for k in s if k.startswith(GROUP_PREFIX)}
            names = mine if names is None else names & mine
    return sorted(names or (), key=group_index)


def host_time_comparisons(
    runs: Sequence[dict], config: SavedConfig | Mapping[str, Any], n_boot: int | None = None
) -> list[Comparison]:
    """CPU time inside the servers, candidate vs baseline, per component: per busy step (mean and p99,
    runs then steps resampled), plus the design's own rows (paired: per request, paired by prompt)."""
    cfg = SavedConfig.of(config)
    n_boot = int(n_boot or cfg.run.n_boot)
    steps = {a: [(r, s) for r in ok_runs(runs, a, cfg.backends) if (s := host_steps(r)) is not None]
             for a in ARM_NAMES}  # fmt: skip
    rows: list[Comparison] = []
    if not all(steps.values()):
        return rows
    base, cand = ARM_NAMES
    for name in (*HOST_COMPONENTS, *group_components(steps), *STEP_PARTS):
        a = [s[name] for _, s in steps[base] if name in s]
        b = [s[name] for _, s in steps[cand] if name in s]
        if not a or not b:
            continue
        for stat_name in ("mean", "p99"):
            rows.append(compare_by_run(f"{name}_us_per_step_{stat_name}", a, b, stat_name,
                                       n_boot=n_boot))  # fmt: skip
        rows += design(cfg.run.design).host_rows(name, steps, n_boot)
    return rows
