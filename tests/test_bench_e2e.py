"""End to end: a very small A/B through real vLLM servers (paged and tagma) on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_small_ab_writes_a_complete_report(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cmd = [
        sys.executable, "-m", "harness.main",
        f"results_dir={tmp_path}", "run_id=e2e", "run=ci",
        "workload.name=e2e_small", "workload.num_requests=4", "workload.num_warmup=1",
        "workload.input_len={kind: uniform, low: 300, high: 900}",
        "workload.output_len={kind: fixed, value: 8}",
        "server.max_model_len=2048", "server.kv_cache_space_gib=1", "load.request_rate=4",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    root = tmp_path / "e2e"
    statuses = [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/status.json"))]
    assert [(s["backend"], s["status"]) for s in statuses] == [("paged", "ok"), ("tagma", "ok")]
    summary = json.loads((root / "summary.json").read_text())
    for backend in ("paged", "tagma"):
        s = summary["backends"][backend]
        assert s["completed"] == 4 and s["failed"] == 0
        assert s["total_output_tokens"] == 4 * 8  # ignore_eos: both generate exactly max_tokens
        assert s["p99_ttft_ms"] > 0
    metrics = {r["metric"] for r in summary["ab"]}
    assert {"mean_ttft_ms", "p99_e2el_ms", "output_throughput"} <= metrics
    tagma_tel = summary["telemetry"]["01-tagma"]
    assert tagma_tel["ranges_per_request_max"] is not None  # the tagma server reported its ranges
    report = (root / "report.md").read_text()
    assert "| mean_ttft_ms |" in report and "01 | tagma | ok" in report
    for name in ("config.yaml", "environment.json", "workload.json", "plots/latency_cdfs.png"):
        assert (root / name).exists(), name
    assert (tmp_path / "latest").resolve() == root.resolve()
    lengths = json.loads((root / "workload.json").read_text())["prompt_lengths"]
    assert all(300 <= n <= 900 for n in lengths)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # no server left behind
    # a second invocation with the same run_id resumes: no run is redone, the report is rebuilt
    recorded = {p: p.stat().st_mtime_ns for p in root.glob("runs/*/requests.jsonl")}
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in root.glob("runs/*/requests.jsonl")} == recorded
