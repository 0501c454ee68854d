"""Read the host CPU time a server measured per scheduler step (``TAGMA_HOST_TIME_FILE``).

The server writes one file per process next to the path it was given (see :mod:`tagma.host_time`):
``host_time.scheduler.<pid>.jsonl`` from the engine core and ``host_time.worker.<pid>.jsonl`` from each
worker. :func:`load_run` joins them into per-step arrays; :func:`summarize` gives per-run statistics.

Per-step arrays (numpy int64/float64, one entry per engine step, in step order):
  raw columns        every column of both roles (``tagma.host_time.COLUMNS``); worker columns are present
                     only when the worker's steps line up with the scheduler's (same num_reqs and num_tokens
                     at every step index both have), else under :attr:`HostTimeRun.worker` only
  ``kv_manager_total_ns``  kv_manager_ns + update_kv_manager_ns + outside_kv_manager_ns
  ``<x>_net``        the same with the clock's own cost taken out: each timed interval contains about one
                     read of the thread-CPU clock (``timer_overhead_ns``, measured in that process), and an
                     enclosing interval also both reads of every timed call inside it
  worker parts       ``slot_mappings_ns``, ``attn_metadata_ns``, ``preprocess_ns``, ``forward_cpu_ns``
                     (each with ``_net``) and ``forward_wall_ns``, where the worker wrote worker_parts rows
  ``kv_group<g>_<kind>_ns`` / ``_net``  with ``TAGMA_HOST_TIME_GROUPS=1``: the KV manager's time in group g's
                     block work (kind ``full``, ``window<tokens>``, ``state``, ``other``); part of
                     kv_manager_total_ns, whose ``_net`` then also loses both clock reads of each group call
Idle steps (no token scheduled) are kept in the arrays; :func:`summarize` leaves them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tagma.contract import HOST_TIME_FILE
from tagma.probes.host_time import (
    COLUMNS,
    GROUP_KINDS,
    HostTimeChunk,
    host_time_files,
    process_file,
    read_chunks,
)

__all__ = [
    "BASE_NAME", "COMPONENTS", "GROUP_PREFIX", "PART_COLUMNS", "HostTimeRun", "group_columns", "group_index",
    "load_run", "summarize",
]  # fmt: skip

# The worker's parts of execute_model beside input preparation (tagma.probes.host_time, role worker_parts).
PART_COLUMNS = COLUMNS["worker_parts"][1:-1]  # between "step" and "end_ns"

BASE_NAME = HOST_TIME_FILE  # the runner sets TAGMA_HOST_TIME_FILE=<run dir>/host_time.jsonl

# What summarize reports by default: the overhead-corrected per-step components.
COMPONENTS = (
    "kv_manager_ns_net", "update_kv_manager_ns_net", "outside_kv_manager_ns_net", "kv_manager_total_ns_net",
    "schedule_other_ns_net", "update_other_ns_net", "worker_prepare_ns_net", "block_table_ns_net",
    "update_states_ns_net", "prepare_inputs_ns_net",
)  # fmt: skip


@dataclass
class HostTimeRun:
    backend: str
    steps: dict[str, np.ndarray]  # scheduler columns (+ worker columns when aligned) + derived
    worker: list[dict[str, np.ndarray]] = field(default_factory=list)  # per worker process
    aligned: bool = False
    timer_overhead_ns: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # per KV cache group: its component (kv_group<g>_...)

    @property
    def num_steps(self) -> int:
        return len(self.steps["step"])


def _columns(chunks: list[HostTimeChunk], role: str) -> dict[str, np.ndarray]:
    names = COLUMNS[role]
    rows = [row for c in chunks for row in c.rows]
    table = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(names))
    order = np.argsort(table[:, 0], kind="stable")  # by step (chunks are written in order anyway)
    table = table[order]
    if len(table) and not np.array_equal(table[:, 0], np.arange(table[0, 0], table[0, 0] + len(table))):
        raise ValueError(f"host time: the {role} steps are not consecutive (a lost or repeated chunk)")
    return {name: table[:, i] for i, name in enumerate(names)}


def _backend(chunks: list[HostTimeChunk], path: Path) -> str:
    backends = {c.backend for c in chunks}
    if len(backends) != 1:
        raise ValueError(f"host time: {path} names several backends: {sorted(backends)}")
    return backends.pop()


def _overhead(chunks: list[HostTimeChunk]) -> int:
    return int(np.median([c.timer_overhead_ns for c in chunks]))


def _aligned(sched: dict[str, np.ndarray], worker: dict[str, np.ndarray]) -> bool:
    n = min(len(sched["step"]), len(worker["step"]))
    if n == 0 or sched["step"][0] != worker["step"][0]:
        return False
    return bool(
        np.array_equal(sched["num_reqs"][:n], worker["num_reqs"][:n])
        and np.array_equal(sched["num_tokens"][:n], worker["num_tokens"][:n])
    )


GROUP_PREFIX = "kv_group"


def group_index(name: str) -> int:
    """The group index of a per-group component or row name (``kv_group1_window128...`` -> 1)."""
    return int(name[len(GROUP_PREFIX) :].split("_", 1)[0])


def group_name(group: int, kind: int, window: int) -> str:
    """A group's component name: ``kv_group1_window128``, ``kv_group0_full``."""
    label = GROUP_KINDS[kind] if 0 <= kind < len(GROUP_KINDS) else "other"
    return f"{GROUP_PREFIX}{group}_{label}{window if label == 'window' else ''}"


def group_columns(steps: dict[str, np.ndarray], c: int, path: Path) -> list[str]:
    """Add the per-group columns of ``path`` (a ``kv_groups`` file) to the scheduler's ``steps`` (same step
    numbers), and take the group calls' clock reads out of the manager's net total. Returns the names."""
    chunks = read_chunks(path)
    rows = [row for ch in chunks for row in ch.rows]
    if not rows:
        return []
    names = COLUMNS["kv_groups"]
    table = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(names))
    col = {name: table[:, i] for i, name in enumerate(names)}
    first = int(steps["step"][0]) if len(steps["step"]) else 0
    n = len(steps["step"])
    out: list[str] = []
    nested_calls = np.zeros(n, dtype=np.int64)
    for g in np.unique(col["group"]):
        mine = col["group"] == g
        kinds = np.unique(col["kind"][mine])
        windows = np.unique(col["window"][mine])
        if len(kinds) != 1 or len(windows) != 1:
            raise ValueError(f"host time: {path}: group {g} changes kind or window between steps")
        name = group_name(int(g), int(kinds[0]), int(windows[0]))
        idx = col["step"][mine] - first
        ok = (idx >= 0) & (idx < n)
        if len(np.unique(idx[ok])) != int(ok.sum()):
            raise ValueError(f"host time: {path}: group {g} has a step twice (a repeated chunk)")
        ns = np.zeros(n, dtype=np.int64)
        calls = np.zeros(n, dtype=np.int64)
        ns[idx[ok]] = col["group_ns"][mine][ok]
        calls[idx[ok]] = col["group_calls"][mine][ok]
        steps[f"{name}_ns"] = ns
        steps[f"{name}_ns_net"] = ns - c * calls
        nested_calls += calls
        out.append(name)
    steps["kv_manager_total_ns_net"] = steps["kv_manager_total_ns_net"] - 2 * c * nested_calls
    return out


def _add_worker_parts(w: dict[str, np.ndarray], cw: int, path: Path) -> list[str]:
    """Add one worker's ``worker_parts`` columns (same process, same step numbers) to its columns ``w``, both
    cut to the steps both have, with each part's ``_net`` (one timed interval: one clock read). Returns the
    file when there is one."""
    if not path.exists():
        return []
    chunks = read_chunks(path)
    if not chunks:
        return []
    parts = _columns(chunks, "worker_parts")
    n = min(len(w["step"]), len(parts["step"]))
    if n and parts["step"][0] != w["step"][0]:
        raise ValueError(f"host time: {path} starts at step {parts['step'][0]}, its worker at {w['step'][0]}")
    for key in list(w):
        w[key] = w[key][:n]
    for key in PART_COLUMNS:
        w[key] = parts[key][:n]
        if key != "forward_wall_ns":
            w[f"{key}_net"] = w[key] - cw
    return [str(path)]


def load_run(path: str | Path) -> HostTimeRun:
    """The host time of one server lifetime: ``path`` is a run directory (holding the files written for
    ``<dir>/host_time.jsonl``) or the ``TAGMA_HOST_TIME_FILE`` path itself."""
    path = Path(path)
    base = path / BASE_NAME if path.is_dir() else path
    sched_files = host_time_files(base, "scheduler")
    if not sched_files:
        raise FileNotFoundError(f"host time: no {base.stem}.scheduler.*{base.suffix} in {base.parent}")
    if len(sched_files) > 1:
        raise ValueError(
            f"host time: {len(sched_files)} scheduler files in {base.parent} (one server per run directory)"
        )
    sched_chunks = read_chunks(sched_files[0])
    if not sched_chunks:
        raise ValueError(f"host time: {sched_files[0]} holds no step")
    backend = _backend(sched_chunks, sched_files[0])
    c = _overhead(sched_chunks)
    steps = _columns(sched_chunks, "scheduler")
    steps["kv_manager_total_ns"] = steps["kv_manager_ns"] + steps["update_kv_manager_ns"] + steps[
        "outside_kv_manager_ns"
    ]
    for share, calls in (("kv_manager_ns", "kv_calls"), ("update_kv_manager_ns", "update_kv_calls"),
                         ("outside_kv_manager_ns", "outside_kv_calls")):  # fmt: skip
        steps[f"{share}_net"] = steps[share] - c * steps[calls]
    steps["kv_manager_total_ns_net"] = steps["kv_manager_total_ns"] - c * (
        steps["kv_calls"] + steps["update_kv_calls"] + steps["outside_kv_calls"]
    )
    steps["schedule_other_ns_net"] = steps["schedule_other_ns"] - c * (steps["kv_calls"] + 1)
    steps["update_other_ns_net"] = steps["update_other_ns"] - c * (steps["update_kv_calls"] + 1)

    run = HostTimeRun(backend=backend, steps=steps, timer_overhead_ns={"scheduler": c},
                      files=[str(sched_files[0])])  # fmt: skip
    group_files = host_time_files(base, "kv_groups")
    if len(group_files) > 1:
        raise ValueError(f"host time: {len(group_files)} kv_groups files in {base.parent}")
    for gf in group_files:
        run.groups = group_columns(steps, c, gf)
        run.files.append(str(gf))
    for wf in host_time_files(base, "worker"):
        chunks = read_chunks(wf)
        if not chunks:
            continue
        wb = _backend(chunks, wf)
        if wb != backend:
            raise ValueError(f"host time: worker {wf} says {wb!r}, the scheduler {backend!r}")
        cw = _overhead(chunks)
        w = _columns(chunks, "worker")
        # worker_prepare = two timed intervals; block-table calls inside them add both clock reads.
        w["worker_prepare_ns_net"] = w["worker_prepare_ns"] - cw * (2 + 2 * w["block_table_calls"])
        w["block_table_ns_net"] = w["block_table_ns"] - cw * w["block_table_calls"]
        w["update_states_ns_net"] = w["update_states_ns"] - cw
        w["prepare_inputs_ns_net"] = w["prepare_inputs_ns"] - cw
        run.files += _add_worker_parts(w, cw, process_file(base, "worker_parts", chunks[0].pid))
        run.worker.append(w)
        run.files.append(str(wf))
        run.timer_overhead_ns.setdefault("worker", cw)

    if run.worker and all(_aligned(steps, w) for w in run.worker):
        run.aligned = True
        n = min(len(steps["step"]), *(len(w["step"]) for w in run.worker))
        for key in list(steps):
            steps[key] = steps[key][:n]
        for key in set(run.worker[0]).intersection(*run.worker[1:]):
            if key in ("step", "num_reqs", "num_tokens", "end_ns"):
                continue
            # Several workers (tensor parallel): the step waits for the slowest one.
            steps[key] = np.max(np.stack([w[key][:n] for w in run.worker]), axis=0)
    return run


def _stats(x: np.ndarray, reqs: np.ndarray) -> dict[str, float]:
    x = x.astype(np.float64)
    total_reqs = float(reqs.sum())
    return {
        "mean_ns": float(x.mean()),
        "p50_ns": float(np.percentile(x, 50)),
        "p99_ns": float(np.percentile(x, 99)),
        # Per scheduled request: the component's total over the scheduled requests' total (ratio of sums).
        "per_request_ns": float(x.sum() / total_reqs) if total_reqs else float("nan"),
    }


def summarize(
    run: HostTimeRun,
    components: tuple[str, ...] = COMPONENTS,
    since_ns: int | None = None,
) -> dict[str, Any]:
    """Per-run statistics of the busy steps (num_tokens > 0; with ``since_ns``, only steps that ended at
    or after that ``time.time_ns()``): per component mean, p50, p99 per step and per scheduled request.
    Components the run lacks (worker ones when the steps did not align) are left out."""
    s = run.steps
    keep = s["num_tokens"] > 0
    if since_ns is not None:
        keep &= s["end_ns"] >= since_ns
    reqs = s["num_reqs"][keep]
    out: dict[str, Any] = {
        "backend": run.backend,
        "steps": int(keep.sum()),
        "steps_total": run.num_steps,
        "worker_aligned": run.aligned,
        "timer_overhead_ns": dict(run.timer_overhead_ns),
        "mean_num_reqs": float(reqs.mean()) if reqs.size else float("nan"),
        "mean_num_tokens": float(s["num_tokens"][keep].mean()) if reqs.size else float("nan"),
        "steps_with_new_blocks": int((s["new_block_ids"][keep] > 0).sum()),
        "components": {},
    }
    if not reqs.size:
        return out
    for name in (*components, *(f"{g}_ns_net" for g in run.groups)):
        if name in s:
            out["components"][name] = _stats(s[name][keep], reqs)
    return out
