"""FINDINGS.md's GPU sections: this CPU's host time projected onto GPU decode steps (from datasheet floors and
from a decode step measured on a GPU), and tagma's Triton kernels against the block-table ones, measured on a
GPU. Every row names its runs: a map job for the host time, a GPU run id for what the GPU measured."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.regime.figures import ab_cells

__all__ = ["GPU_RUN_KINDS", "fmt", "gpu_answer", "gpu_kernels", "gpu_projection", "gpu_run_problems", "pct"]

GPU_RUN_KINDS = {"decode_step": "gpu_decode_step", "kernels": "gpu_kernels"}


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def gpu_run_problems(name: str, run: Mapping[str, Any]) -> list[str]:
    """Why a GPU run file cannot be a source: the wrong kind, or a dry run (no GPU measured it)."""
    want = GPU_RUN_KINDS.get(name)
    if want is None:
        return [f"gpu_runs.{name}: unknown (one of {sorted(GPU_RUN_KINDS)})"]
    problems = []
    if run.get("kind") != want:
        problems.append(f"gpu_runs.{name}: kind {run.get('kind')!r}, expected {want!r}")
    if run.get("measurement") != "GPU":
        problems.append(f"gpu_runs.{name}: {run.get('measurement')!r} is not a GPU measurement")
    if not run.get("run_id"):
        problems.append(f"gpu_runs.{name}: no run_id")
    return problems


def forward_floor_ms(model: Mapping[str, Any], gpu: Mapping[str, Any], point: Mapping[str, Any]) -> float:
    """A decode step's memory-bandwidth floor: the weights and the batch's KV cache read once at peak HBM
    bandwidth (ms)."""
    kv_gb = point["batch"] * point["context"] * model["kv_bytes_per_token"] / 1e9
    return (model["weights_gb"] + kv_gb) / gpu["hbm_tb_s"]  # GB / (TB/s) = ms


def _host_cells(g: Mapping[str, Any], maps: Sequence[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """The projection group's closed cells with host time on both arms: (job, cell)."""
    return [
        (job, c)
        for _, job, c in ab_cells(maps)
        if c["cell"]["load"] == "closed"
        and job["group"] == g.get("group")
        and all((c.get("composition") or {}).values())
    ]


def _nearest(cells: list[tuple[dict, dict]], batch: int) -> tuple[dict, dict]:
    """The cell whose concurrency is nearest the batch (by ratio), then the longest prompt."""
    return min(
        cells,
        key=lambda jc: (abs(math.log(jc[1]["cell"]["concurrency"] / batch)), -jc[1]["cell"]["prompt_tokens"]),
    )


def _forwards(g: Mapping[str, Any], step: Mapping[str, Any] | None) -> list[tuple[str, Mapping, float, str]]:
    """(GPU, point, forward ms, source) for every GPU and point: the datasheet floor, and the measured step
    where a measured run's device is that GPU."""
    measured = {(p["context"], p["batch"]): p for p in (step or {}).get("points", [])}
    device = str((step or {}).get("machine", {}).get("device", ""))
    out = []
    for gpu in g.get("gpus", []):
        for point in g.get("points", []):
            source = f"floor: {gpu['source']}, {gpu['hbm_tb_s']} TB/s"
            out.append((gpu["name"], point, forward_floor_ms(g["model"], gpu, point), source))
            m = measured.get((point["context"], point["batch"]))
            if step and m and gpu["name"] in device:
                source = (
                    f"measured, {m['attention']} attention (p10-p90 {fmt(m['p10_ms'])}-{fmt(m['p90_ms'])})"
                )
                out.append((gpu["name"], point, m["median_ms"], f"{source} | {step['run_id']}"))
    return out


def gpu_projection(sources: Mapping[str, Any], maps: Sequence[dict[str, Any]]) -> list[str]:
    g = sources.get("gpu_projection")
    if not g:
        return []
    step = (sources.get("gpu_runs") or {}).get("decode_step")
    lines = [
        "## On a GPU: host time projected onto decode steps (a projection, not an e2e measurement)",
        "",
        *g.get("preamble", []),
        "",
    ]
    if step:
        lines += [*g.get("measured_preamble", []), ""]
    cells = _host_cells(g, maps)
    if not cells:
        return [*lines, "No closed cell of the projection's group has host-time data.", ""]
    lines += [
        "Host CPU per busy step is this machine's, measured in the closed cell of the group whose "
        "concurrency is nearest the batch (this CPU and this tiny model's requests; a GPU server's host CPU "
        "is faster, so the shares below are upper bounds).",
        "",
        "| GPU | context | batch | forward per step (ms) | source | GPU run | host us/step paged / tagma "
        "(cell) | host share paged | step ratio tagma/paged, async off | async on | host measured in |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, point, fwd_ms, source in _forwards(g, step):
        job, c = _nearest(cells, int(point["batch"]))
        paged = c["composition"]["baseline"]["host_us_per_step"]
        tagma = c["composition"]["candidate"]["host_us_per_step"]
        fwd_us = fwd_ms * 1000
        share = paged / (paged + fwd_us)
        off = (tagma + fwd_us) / (paged + fwd_us)
        on = max(tagma, fwd_us) / max(paged, fwd_us)
        source = source if " | " in source else f"{source} | none"
        lines.append(
            f"| {name} | {point['context']} | {point['batch']} | {fmt(fwd_ms)} | {source} | {fmt(paged)} / "
            f"{fmt(tagma)} ({c['cell']['name']}) | {pct(share)} | {fmt(off, 4)} | {fmt(on, 4)} "
            f"| {job['run_id']} |"
        )
    return [*lines, "", *g.get("notes", []), ""]


def _verdicts(rows: Sequence[dict]) -> tuple[int, int]:
    """(tagma faster, tagma slower): the rows whose 95% interval of tagma/paged lies below / above 1."""
    ratios = [r["tagma_over_paged"] for r in rows]
    return sum(t["ci95_hi"] < 1 for t in ratios), sum(t["ci95_lo"] > 1 for t in ratios)


def _kernel_groups(run: Mapping[str, Any]) -> dict[tuple[str, str, str], list[dict]]:
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in run.get("ratios", []):
        groups[(r["kernel"], r["phase"], r["placement"])].append(r)
    return groups


def gpu_kernels(sources: Mapping[str, Any]) -> list[str]:
    """tagma / paged per kernel, phase and placement over the run's contexts and batches."""
    run = (sources.get("gpu_runs") or {}).get("kernels")
    if not run:
        return []
    m, cfg = run["machine"], run["config"]
    failed = [c for c in run.get("checks", []) if not c.get("ok")]
    lines = [
        f"## tagma's Triton kernels on a GPU, measured ({m.get('device')})",
        "",
        f"Run `{run['run_id']}` (`python -m benchmarks.gpu`, {run['started'][:10]}): Llama-3.1-8B's "
        f"attention geometry ({cfg['num_q_heads']} query and {cfg['num_kv_heads']} KV heads of "
        f"{cfg['head_dim']}, block "
        f"{cfg['block_size']}, {cfg['dtype']}), contexts {', '.join(map(str, cfg['contexts']))} x batches "
        f"{', '.join(map(str, cfg['batches']))}, each pair timed in ABBA rounds; ratios of medians with "
        f"bootstrap 95% intervals. Correctness: {len(run.get('checks', [])) - len(failed)} of "
        f"{len(run.get('checks', []))} checks against PyTorch references passed. Measured copy bandwidth "
        f"{fmt(m.get('copy_gbps'), 4)} GB/s (datasheet {fmt(m.get('peak_gbps'), 4)}). Placements: "
        "`contiguous` is one range per request (tagma's best case); `fragmented:*` cuts each request into "
        "ranges whose lengths follow the engine's simulated range-length histogram under concurrent "
        "chunked prefill and preemption (benchmarks/gpu/README.md).",
        "",
        *sources.get("gpu_kernel_notes", []),
        "",
        "| kernel | phase | placement | configurations | tagma/paged, median (min-max) "
        "| tagma faster (CI < 1) | tagma slower (CI > 1) | GPU run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (kernel, phase, placement), rows in sorted(_kernel_groups(run).items()):
        vals = [r["tagma_over_paged"]["ratio"] for r in rows]
        faster, slower = _verdicts(rows)
        lines.append(
            f"| {kernel} | {phase} | {placement} | {len(rows)} | {fmt(float(np.median(vals)))} "
            f"({fmt(min(vals))}-{fmt(max(vals))}) | {faster} | {slower} | {run['run_id']} |"
        )
    for fig in sources.get("gpu_kernel_figures", []):
        lines += ["", f"![{fig['title']}]({fig['path']})"]
    return [*lines, ""]


def gpu_answer(sources: Mapping[str, Any]) -> list[str]:
    """The answer's GPU line: the measured kernels' verdicts counted by placement."""
    run = (sources.get("gpu_runs") or {}).get("kernels")
    if not run:
        return ["- On a GPU: nothing measured in these sources (the GPU section is a projection)."]
    by_placement: dict[str, list[dict]] = defaultdict(list)
    for r in run.get("ratios", []):
        by_placement["contiguous" if r["placement"] == "contiguous" else "fragmented"].append(r)
    parts = []
    for placement, rows in sorted(by_placement.items()):
        faster, slower = _verdicts(rows)
        overall = (
            "mostly slower"
            if 2 * slower > len(rows)
            else "mostly faster"
            if 2 * faster > len(rows)
            else "mixed"
        )
        attn = [r["tagma_over_paged"]["ratio"] for r in rows if r["kernel"] == "decode_attention"]
        median_attn = f", decode attention median {fmt(float(np.median(attn)))}" if attn else ""
        parts.append(f"{placement} placement {overall}: tagma faster in {faster}, slower in {slower} of "
                     f"{len(rows)}{median_attn}")  # fmt: skip
    return [
        f"- On a GPU ({run['machine'].get('device')}, measured, kernels only, run {run['run_id']}): tagma's "
        f"Triton kernels against block-table kernels of the same design, {'; '.join(parts)} (kernel x "
        "configuration pairs, 95% intervals; the kernel table below)."
    ]
