"""The report from run files, and a sweep that resumes without redoing finished runs (no servers here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import report, runner
from harness.arrivals import LoadSpec
from harness.config import BenchConfig, ModelConfig, RunConfig, ServerConfig
from harness.files import read_json, write_json, write_jsonl
from harness.workload import LengthDist, WorkloadSpec


def _cfg(out: Path, repeats: int = 2) -> BenchConfig:
    return BenchConfig(
        model=ModelConfig(name="m", path="/nowhere"),
        server=ServerConfig(max_model_len=4096),
        workload=WorkloadSpec(
            name="w", num_requests=3, input_len=LengthDist("fixed", value=100),
            output_len=LengthDist("fixed", value=8), max_model_len=4096,
        ),  # fmt: skip
        load=LoadSpec(mode="open", request_rate=1.0),
        run=RunConfig(repeats=repeats, n_boot=200),
        out_dir=out,
        data_dir=out / "data",
    )


def _fake_run(root: Path, index: int, backend: str, scale: float, n: int = 40) -> None:
    d = root / "runs" / f"{index:02d}-{backend}"
    rng = np.random.default_rng(index)
    rows = []
    for i in range(n):
        ttft = 100.0 * (1 + i % 5) * scale * rng.normal(1, 0.01)
        itl = list(10.0 * scale * rng.normal(1, 0.01, size=7))
        rows.append({"index": i, "success": True, "ttft_ms": ttft, "tpot_ms": float(np.mean(itl)),
                     "itl_ms": itl, "e2el_ms": ttft + sum(itl)})  # fmt: skip
    write_jsonl(d / "requests.jsonl", rows)
    write_jsonl(d / "telemetry.jsonl", [
        {"t_s": 0.0, "kv_cache_usage": 0.1, "server_rss_bytes": 2**30},
        {"t_s": 1.0, "kv_cache_usage": 0.5, "server_rss_bytes": 2**31, "prefix_cache_queries": 10,
         "prefix_cache_hits": 0, "preemptions": 0,
         "tagma": {"live_requests": 3, "ranges_per_request": {"mean": 1.0, "p99": 1.0, "max": 1},
                   "peak_ranges_per_request": 1, "in_place_growths": 5, "new_ranges": 3, "evictions": 0,
                   "external_fragmentation": 0.0}},
    ])  # fmt: skip
    write_json(d / "summary.json", {"completed": n, "failed": 0, "output_throughput": 100.0 / scale,
                                    "request_throughput": 1.0 / scale, "mean_ttft_ms": 300.0 * scale})
    write_json(d / "status.json", {"backend": backend, "index": index, "status": "ok", "reason": None,
                                   "startup_s": 60.0, "kv_capacity_tokens": 100000})  # fmt: skip


def _meta(root: Path) -> None:
    write_json(root / "config.json", {"model": {"name": "m"}, "load": {"mode": "open"},
                                      "backends": ["paged", "tagma"]})
    write_json(root / "environment.json", {
        "cpu": "cpu", "cpu_count": 2, "gpus": [], "packages": {"vllm": "0.32.0", "torch": "2.13"},
        "git": {"commit": "abc", "dirty": False}})
    provenance = {"sharegpt": {"source": "s", "sha256": "ff", "conversations": 7}}
    write_json(root / "workload.json", {"spec": {"name": "w"}, "provenance": provenance,
                                        "prompt_lengths": [100, 120, 140], "output_lengths": [8, 8, 8]})


def test_report_finds_the_slowdown_and_writes_everything(tmp_path: Path) -> None:
    _meta(tmp_path)
    for index, backend in enumerate(["paged", "tagma", "tagma", "paged"]):
        _fake_run(tmp_path, index, backend, scale=1.25 if backend == "tagma" else 1.0)
    write_json(tmp_path / "runs" / "04-paged" / "status.json",
               {"backend": "paged", "index": 4, "status": "failed", "reason": "server: exited with code 1"})
    md = report.write_report(tmp_path, n_boot=200).read_text()
    summary = read_json(tmp_path / "summary.json")
    ab = {r["metric"]: r for r in summary["ab"]}
    assert ab["mean_ttft_ms"]["ratio"] == pytest.approx(1.25, rel=0.02)
    assert ab["mean_ttft_ms"]["verdict"] == "slower"
    assert ab["output_throughput"]["verdict"] == "lower"
    assert summary["backends"]["paged"]["repeats_ok"] == 2
    assert summary["telemetry"]["01-tagma"]["ranges_per_request_max"] == 1
    assert "s, 7 complete conversations recovered" in md
    assert "| mean_ttft_ms |" in md and "failed: `server: exited with code 1`" in md
    for png in ("latency_cdfs", "ab_ratios", "per_run", "kv_usage", "prompt_lengths"):
        assert (tmp_path / "plots" / f"{png}.png").stat().st_size > 1000
    json.dumps(summary, allow_nan=False)  # no NaN anywhere


def test_report_with_one_repeat_gives_ratios_without_run_level_verdicts(tmp_path: Path) -> None:
    _meta(tmp_path)
    _fake_run(tmp_path, 0, "paged", scale=1.0)
    _fake_run(tmp_path, 1, "tagma", scale=1.25)
    report.write_report(tmp_path, n_boot=200)
    ab = {r["metric"]: r for r in read_json(tmp_path / "summary.json")["ab"]}
    assert ab["output_throughput"]["ci_low"] is None and ab["output_throughput"]["verdict"].startswith("n/a")
    assert ab["mean_ttft_ms"]["verdict"] == "slower"  # per-request samples still give an interval
    assert (tmp_path / "plots" / "ab_ratios.png").exists()


def test_resume_skips_finished_runs_and_retries_failed_ones(tmp_path: Path, monkeypatch) -> None:
    calls: list[tuple[int, str]] = []

    def fake_run_one(cfg, backend, index, workload, run_dir):  # type: ignore[no-untyped-def]
        calls.append((index, backend))
        status = {"backend": backend, "index": index, "status": "ok" if index != 2 else "failed",
                  "reason": None if index != 2 else "server died mid-run"}  # fmt: skip
        write_json(run_dir / "status.json", status)
        return status

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    cfg = _cfg(tmp_path, repeats=2)
    for index, backend in enumerate(["paged", "tagma", "tagma", "paged"]):
        (tmp_path / "runs" / f"{index:02d}-{backend}").mkdir(parents=True, exist_ok=True)
    statuses = runner.run_ab(cfg, workload=None)  # type: ignore[arg-type]
    assert calls == [(0, "paged"), (1, "tagma"), (2, "tagma"), (3, "paged")]  # a failure does not stop it
    assert [s["status"] for s in statuses] == ["ok", "ok", "failed", "ok"]
    calls.clear()
    runner.run_ab(cfg, workload=None)  # type: ignore[arg-type]
    assert calls == [(2, "tagma")]  # only the failed run is redone
