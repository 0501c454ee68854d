"""The host benchmark's report: headline rows against the targets, the printed table and the figures.

Each section's rows and figure live in the module named after the section's producer
(``benchmarks.host.<section>``): :mod:`.engine_ops`, :mod:`.manager_ops`, :mod:`.write_path`,
:mod:`.block_table_traffic`, :mod:`.fragmentation`. The targets are one table, :data:`.table.TARGETS`.
``python -m benchmarks.host.report RUN_DIR`` redraws a run's figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report import (
    block_table_traffic,
    engine_ops,
    fragmentation,
    group_ops,
    inserver,
    manager_ops,
    prefix_index,
    prefix_ops,
    scheduler_steps,
    trace_replay,
    write_path,
)
from benchmarks.host.report.table import GUIDE, TARGETS, at, summary_table

__all__ = [
    "GUIDE", "TARGETS", "baseline_vs_guide", "figures", "headline", "plots", "profile_lines", "summary_table",
    "target_texts",
]  # fmt: skip

# Section name in host_bench.json -> (its report module, its figure's file name); the order of the headline.
SECTIONS: dict[str, tuple[Any, str | None]] = {
    "manager": (manager_ops, "manager.png"),
    "prefix_ops": (prefix_ops, "prefix_ops.png"),
    "write_path": (write_path, "write_path.png"),
    "engine_ops": (engine_ops, "engine_ops.png"),
    "block_table_traffic": (block_table_traffic, "block_table_traffic.png"),
    "fragmentation": (fragmentation, "fragmentation.png"),
    "inserver": (inserver, None),  # no figure: the serve run's report has its own
    "prefix_index": (prefix_index, "prefix_index.png"),
    "trace_replay": (trace_replay, "trace_replay.png"),
    "groups": (group_ops, "groups.png"),
    "scheduler": (scheduler_steps, None),  # rows only
}
FIGURE_ORDER = (
    "engine_ops", "manager", "prefix_ops", "write_path", "block_table_traffic", "fragmentation",
    "prefix_index", "trace_replay", "groups",
)  # fmt: skip


def target_texts() -> dict[str, str]:
    """The targets as the text stored in host_bench.json."""
    return {key: target.text for key, target in TARGETS.items()}


def headline(result: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every section's headline rows at the configured headline contexts, in a fixed section order."""
    contexts = [int(c) for c in cfg["headline_contexts"]]
    rows: list[dict[str, Any]] = []
    for name, (module, _) in SECTIONS.items():
        section = result["sections"].get(name)
        if section:
            rows += module.headline_rows(section, contexts)
    return rows


def baseline_vs_guide(result: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM's costs measured in this run next to the scale they were expected to have (GUIDE)."""
    sections = result["sections"]
    top = max(int(c) for c in cfg["headline_contexts"])
    measured: dict[str, float | None] = dict.fromkeys(GUIDE)
    mgr = sections.get("manager")
    if mgr:
        for caching, key in (
            (False, "admission_free_caching_off_ms"),
            (True, "admission_free_caching_on_ms"),
        ):
            e = at(mgr["admission_free"], context_tokens=top, prefix_caching=caching)
            measured[key] = e["paged"]["median"] if e else None
        dec = [d["paged"]["median"] for d in mgr["decode_step"]]
        measured["decode_allocate_slots_us_per_request_step"] = min(dec) if dec else None
    wp = sections.get("write_path")
    if wp and wp["prefill_fit"].get("vllm_op"):
        longest = wp["per_position_at_longest_prefill_ns"]
        measured["vllm_op_per_position_ns"] = longest["vllm_op"]
        measured["vllm_op_fixed_us"] = wp["prefill_fit"]["vllm_op"]["fixed_us"]
        measured["memcpy_per_position_ns"] = longest["memcpy"]
    out: dict[str, Any] = {k: {"guide": list(GUIDE[k]), "measured": measured[k]} for k in GUIDE}
    for key in ("admission_free_caching_off_ms", "admission_free_caching_on_ms"):
        out[key]["context_tokens"] = top  # the guide is for 131072 tokens
    return out


def _where(function: str) -> str:
    """'name (path/file.py:line)' -> 'name (file.py)'."""
    name, _, rest = function.partition(" (")
    file = rest.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file and file != "~" else name


def profile_lines(result: dict[str, Any], top: int = 4) -> list[str]:
    """The functions with the most own time in each profiled manager operation (both sides)."""
    prof = result["sections"].get("profile")
    if not prof:
        return []
    lines = ["Where the manager's time goes (cProfile, share of own time):"]
    for key, value in prof.items():
        if not isinstance(value, dict) or "top" not in value:
            continue
        parts = [f"{_where(r['function'])} {100 * r['own_share']:.0f}%" for r in value["top"][:top]]
        lines.append(f"  {key}: " + ", ".join(parts))
    return lines


def plots(result: dict[str, Any], out_dir: Path) -> list[str]:
    """Draw every section's figure into ``out_dir``; returns the file names drawn."""
    made: list[str] = []
    for name in FIGURE_ORDER:
        section = result["sections"].get(name)
        if section:
            module, file_name = SECTIONS[name]
            module.plot(section, out_dir / file_name)
            made.append(file_name)
    return made


def figures(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Redraw the figures of a host-bench run into ``out_dir`` (default: the run directory)."""
    from harness.files import read_json

    out_dir = Path(out_dir) if out_dir is not None else Path(run_dir)
    result = read_json(Path(run_dir) / "host_bench.json")
    return [out_dir / name for name in plots(result, out_dir)]


