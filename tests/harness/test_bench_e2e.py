"""End to end: a very small A/B through real vLLM servers (paged and tagma) on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from harness.analysis import step_mix
from tests.harness.harness_run import run_harness

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_small_ab_writes_a_complete_report(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    overrides = (
        "run=ci", "load=poisson",
        "workload.name=e2e_small", "workload.num_requests=4", "workload.num_warmup=1",
        "workload.input_len={kind: uniform, low: 300, high: 900}",
        "workload.output_len={kind: fixed, value: 8}",
        "server.max_model_len=2048", "server.kv_cache_space_gib=1", "load.request_rate=4",
    )  # fmt: skip
    summary = run_harness(tmp_path, "e2e", *overrides)
    root = tmp_path / "e2e"
    statuses = [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/status.json"))]
    assert [(s["arm"], s["backend"], s["status"]) for s in statuses] == [
        ("baseline", "paged", "ok"), ("candidate", "tagma", "ok")]
    assert all(s["noise"]["server_cpu_s"] > 0 and "under_load" in s["noise"] for s in statuses)
    for arm in ("baseline", "candidate"):
        s = summary["arms"][arm]
        assert s["completed"] == 4 and s["failed"] == 0
        assert s["total_output_tokens"] == 4 * 8  # ignore_eos: both generate exactly max_tokens
        assert s["p99_ttft_ms"] > 0
    metrics = {r["metric"] for r in summary["ab"]}
    assert {"mean_ttft_ms", "p99_e2el_ms", "output_throughput"} <= metrics
    tagma_tel = summary["telemetry"]["01-candidate-tagma"]
    assert tagma_tel["ranges_per_request_max"] is not None  # the tagma server reported its ranges
    report = (root / "report.md").read_text()
    assert "| mean_ttft_ms |" in report and "01 | candidate (tagma) | ok" in report
    assert report.splitlines()[2].startswith("**Resolution")
    for name in ("config.yaml", "environment.json", "workload.json", "plots/latency_cdfs.png"):
        assert (root / name).exists(), name
    assert (tmp_path / "latest").resolve() == root.resolve()
    lengths = json.loads((root / "workload.json").read_text())["prompt_lengths"]
    assert all(300 <= n <= 900 for n in lengths)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # no server left behind
    # a second invocation with the same run_id resumes: no run is redone, the report is rebuilt
    recorded = {p: p.stat().st_mtime_ns for p in root.glob("runs/*/requests.jsonl")}
    run_harness(tmp_path, "e2e", *overrides, timeout_s=600)
    assert {p: p.stat().st_mtime_ns for p in root.glob("runs/*/requests.jsonl")} == recorded


@pytest.mark.slow
def test_real_paired_aa_gives_no_verdict(tmp_path: Path) -> None:
    """An A/A through two live paged servers (paired design): the method must not invent a difference."""
    summary = run_harness(
        tmp_path, "aa",
        "run=ci", "backends=[paged,paged]", "run.design=paired",
        "load=serial",
        "workload.name=aa_small", "workload.num_requests=12", "workload.num_warmup=1",
        "workload.input_len={kind: uniform, low: 300, high: 900}",
        "workload.output_len={kind: fixed, value: 8}",
        "server.max_model_len=2048", "server.kv_cache_space_gib=1",
    )  # fmt: skip
    assert summary["kind"] == "A/A" and summary["design"] == "paired"
    rows = {r["metric"]: r for r in summary["ab"]}
    assert rows["mean_ttft_ms"]["samples"] == 12
    for row in summary["ab"]:
        assert row["verdict"] in ("parity", "inconclusive", "descriptive", "n/a"), row
    lines = (tmp_path / "aa" / "runs" / "00-baseline-paged" / "requests.jsonl").read_text().splitlines()
    requests = [json.loads(line) for line in lines]
    assert [r["pair"] for r in requests] == list(range(12))
    assert [r["first"] for r in requests] == [k % 2 == 0 for k in range(12)]  # the order alternates
    # the forward's split by step mix reads the same run: one lifetime pair, every busy step keyed
    mix = step_mix.from_run_dir(tmp_path / "aa")
    assert mix.pairs == 1 and mix.row("all").steps_baseline > 12 and mix.row("prefill").steps_candidate >= 12
    assert 0 < mix.row("all").equal_steps < 10 and mix.row("all").matched_share > 0


@pytest.mark.slow
def test_shipped_128k_cpu_config_starts_a_server(tmp_path: Path) -> None:
    """The CPU 128K config, its context resolved from the tiny model, brings a server up (start-up only)."""
    from harness.designs.server_run import server_spec
    from harness.main import resolve_context
    from harness.serve.launcher import Server
    from tests.harness.test_config import _compose

    model = REPO / "data" / "tiny-llama"
    cfg = resolve_context(_compose("server=cpu_128k", "workload=sharegpt_128k_cpu", f"model.path={model}"))
    assert cfg.server.max_model_len == 131072
    with Server(server_spec(cfg, cfg.arms[1], tmp_path), tmp_path / "server.log") as server:
        assert server.healthy() and server.kv_capacity_tokens and server.kv_capacity_tokens >= 131072
