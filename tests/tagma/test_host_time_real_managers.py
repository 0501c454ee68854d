"""Host time per step inside the server on the real classes: vLLM's and tagma's KV managers instrumented
identically (with the telemetry's contiguity measure), and (slow) real paged and tagma servers writing it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness.analysis import host_time as reader
from tagma.contract import (
    ENV_HOST_TIME_FILE,
    ENV_HOST_TIME_FLUSH_S,
    ENV_TELEMETRY_FILE,
    ENV_TELEMETRY_INTERVAL_S,
)
from tagma.probes import host_time_hooks as hooks

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------- real vLLM and tagma managers


def test_real_managers_instrumented_identically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from tagma.core.registry import build_kv_cache_manager
    from tests.tagma.twin import make_config, make_request, manager_kwargs

    monkeypatch.setenv(ENV_HOST_TIME_FILE, str(tmp_path / "host_time.jsonl"))
    monkeypatch.setenv(ENV_TELEMETRY_FILE, str(tmp_path / "telemetry.jsonl"))
    monkeypatch.setenv(ENV_TELEMETRY_INTERVAL_S, "0")
    methods = hooks.kv_manager_methods(KVCacheManager)
    assert {"allocate_slots", "free", "get_computed_blocks", "new_step_starts", "take_new_block_ids"} <= set(
        methods
    )
    monkeypatch.setattr(hooks, "KV_MANAGER_METHODS", methods)
    clocks = {}
    managers = {}
    for name, cls in (("paged", KVCacheManager), ("tagma", build_kv_cache_manager)):
        manager = cls(make_config(64), **manager_kwargs())
        clocks[name] = hooks.SchedulerClock()
        hooks.after_kv_manager_init(manager, clocks[name])
        managers[name] = manager
    paged, tagma = managers["paged"], managers["tagma"]
    assert paged.telemetry.policy == "paged" and tagma.telemetry.policy == "headroom"
    # the block-id reads of what either manager returns are the manager's time where the scheduler makes them
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks

    from tagma.core.range_manager import RangeBlocks

    for read in (KVCacheBlocks.get_block_ids, RangeBlocks.get_block_ids, RangeBlocks.blocks.fget):
        assert getattr(read, "_tagma_host_time_wrapped", False), read
    for manager in managers.values():
        assert set(methods) <= set(manager.__dict__)  # instance attributes: one timed layer each
        req = make_request("r", list(range(100)))
        computed, hit, _ = manager.get_computed_blocks(req)
        manager.allocate_slots(req, 100 - hit, hit, computed)
        manager.new_step_starts()
        manager.free(req)
    assert clocks["paged"].kv_calls == clocks["tagma"].kv_calls == [4, 0, 0]
    assert all(c.kv_ns[0] > 0 for c in clocks.values())
    lines = [json.loads(s) for s in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    by_policy = {ln["policy"]: ln for ln in lines}
    assert set(by_policy) == {"paged", "headroom"}
    for line in by_policy.values():  # contiguity measured by the same code on both
        assert line["live_requests"] == 1
        assert line["ranges_per_request"] == {"mean": 1.0, "p99": 1.0, "max": 1}
    assert "in_place_growths" in by_policy["headroom"] and "in_place_growths" not in by_policy["paged"]


def test_block_runs_incremental() -> None:
    from tagma.probes.telemetry import BlockRuns, runs_summary

    @dataclass
    class B:
        block_id: int
        is_null: bool = False

    runs = BlockRuns()
    table: dict[str, list[B]] = {"a": [B(7), B(8), B(9)], "b": [], "c": [B(3)]}
    assert runs.update(table) == [1, 1]  # "b" holds nothing: not live
    table["a"] += [B(3), B(4)]
    table["c"] += [B(4), B(10)]
    assert runs.update(table) == [2, 2]
    table["a"] = [B(20), B(21)]  # freed and allocated again: walked from the start
    assert runs.update(table) == [1, 2]
    # a window group's list: null blocks where it dropped blocks are not runs; as its start advances, the
    # first live block changes and the list is walked again
    window = {"w": [B(0, True), B(0, True), B(5), B(6)]}
    assert runs.update(window) == [1]
    window["w"] = [B(0, True), B(0, True), B(0, True), B(6), B(2)]
    assert runs.update(window) == [2]
    window["w"] = [B(0, True)] * 5
    assert runs.update(window) == []  # only null blocks: not live
    assert runs_summary([]) == {"mean": 0.0, "p99": 0.0, "max": 0}
    assert runs_summary([1] * 99 + [5]) == {"mean": 1.04, "p99": 1.0, "max": 5}


# ------------------------------------------------------------------------------- real servers (slow)


@pytest.mark.slow
def test_real_servers_write_host_time(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    import asyncio

    from harness.client import run_requests
    from harness.serve.launcher import ServerSpec, serving

    model = REPO / "data" / "tiny-llama"
    schemas = {}
    summaries = {}
    backends = ("paged", "tagma")
    specs = []
    for backend in backends:
        run_dir = tmp_path / backend
        run_dir.mkdir()
        env = {
            ENV_HOST_TIME_FILE: str(run_dir / "host_time.jsonl"),
            ENV_HOST_TIME_FLUSH_S: "0.2",
            ENV_TELEMETRY_FILE: str(run_dir / "tagma_telemetry.jsonl"),
            ENV_TELEMETRY_INTERVAL_S: "0.2",
        }
        spec = ServerSpec(model=str(model), backend=backend, max_model_len=2048, kv_cache_space_gib=1,
                          env=env)  # fmt: skip
        specs.append((spec, run_dir / "server.log"))
    with serving(specs) as servers:  # started together, driven one after the other
        for backend, server in zip(backends, servers, strict=True):
            run_dir = tmp_path / backend
            requests = _requests(4)
            results, _ = asyncio.run(run_requests(server.base_url, str(model), requests, [0.0] * 4,
                                                  max_concurrency=4, timeout_s=300))  # fmt: skip
            assert all(r.success for r in results), [r.error for r in results]
            time.sleep(0.6)  # more than one flush interval: every finished step is on disk
            run = reader.load_run(run_dir)
            assert run.backend == backend and run.aligned, run.files
            busy = run.steps["num_tokens"] > 0
            assert busy.sum() >= 8
            assert (run.steps["kv_manager_ns"][busy] > 0).all()
            assert (run.steps["worker_prepare_ns"][busy] > 0).all()
            assert (run.steps["block_table_ns"][busy] > 0).all()
            # vLLM's runner has every part: each is timed, and the parts fit inside the step's wall time
            assert (run.steps["attn_metadata_ns"][busy] > 0).all()
            assert (run.steps["forward_wall_ns"][busy] > 0).all()
            st = run.steps
            inside = (st["worker_prepare_ns"] + st["slot_mappings_ns"] + st["attn_metadata_ns"]
                      + st["preprocess_ns"] + st["forward_wall_ns"])  # fmt: skip
            assert (inside[busy] <= st["execute_wall_ns"][busy]).all()
            schemas[backend] = sorted(run.steps)
            summaries[backend] = reader.summarize(run)
            telemetry = [json.loads(s) for s in (run_dir / "tagma_telemetry.jsonl").read_text().splitlines()]
            assert max(t["peak_live_requests"] for t in telemetry) >= 1
            assert telemetry[-1]["policy"] == ("paged" if backend == "paged" else "headroom")
    assert schemas["paged"] == schemas["tagma"]
    assert set(summaries["paged"]["components"]) == set(summaries["tagma"]["components"])


@dataclass(frozen=True)
class _Req:  # what harness.client needs of a request
    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int


def _requests(n: int) -> list[_Req]:
    rng = np.random.default_rng(0)
    return [_Req(i, " ".join(f"w{x}" for x in rng.integers(0, 5000, 300)), 300, 16) for i in range(n)]
