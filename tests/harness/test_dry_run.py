"""`server.dry_run`: the whole harness path (config -> launcher -> workload -> client -> metrics -> report)
with the mock server in place of vLLM, and `make bench-gpu DRY_RUN=1` taking the GPU profile through it on a
machine without a GPU. A dry run says so in its report and summary, and a regime map refuses one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import from_mapping
from harness.regime.main import run_job
from harness.report import DRY_RUN_LINE
from harness.serve.launcher import ServerSpec, server_command
from tests.harness.harness_run import REPO, run_harness

CONFIGS = REPO / "configs"


def test_a_dry_run_server_is_the_mock_server() -> None:
    cmd = server_command(ServerSpec(model="m", backend="tagma", dry_run=True), 4321)
    assert cmd[1:5] == ["-m", "harness.serve.mock_server", "--port", "4321"]
    assert "tagma.serve" in server_command(ServerSpec(model="m", backend="tagma"), 4321)[2]


def test_a_regime_map_refuses_a_dry_run(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="bench", overrides=[f"repo_dir={REPO}", "server.dry_run=true"])
    bench = from_mapping(OmegaConf.to_container(cfg, resolve=True))
    assert bench.server.dry_run
    with pytest.raises(ValueError, match="server.dry_run runs the mock server"):
        run_job(bench, None, "any", tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def _dry_report(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dry_run"] is True
    assert (run_dir / "report.md").read_text().splitlines()[2] == DRY_RUN_LINE
    for arm in ("baseline", "candidate"):
        assert summary["arms"][arm]["repeats_ok"] >= 1 and summary["arms"][arm]["failed"] == 0, arm
    return summary


@pytest.mark.slow
def test_the_main_job_runs_end_to_end_against_the_mock(tmp_path: Path) -> None:
    summary = run_harness(tmp_path, "dry", "server.dry_run=true", "workload.num_requests=3",
                          "workload.num_warmup=1", "run.repeats=1", timeout_s=600)  # fmt: skip
    assert summary == _dry_report(tmp_path / "dry")
    rows = [json.loads(line) for line in (tmp_path / "dry" / "runs" / "00-baseline-paged" / "requests.jsonl")
            .read_text().splitlines()]  # fmt: skip
    assert len(rows) == 3 and all(r["success"] for r in rows)
    assert all(r["expected_prompt_tokens"] > 10_000 for r in rows)  # the main job's 16K prompts were sent


@pytest.mark.slow
def test_bench_gpu_dry_run_goes_past_the_missing_gpu_to_both_reports(tmp_path: Path) -> None:
    from tests.harness.test_gpu_preflight import _checkpoint

    model = _checkpoint(tmp_path, "llama31-shaped")
    args = (f"workload.num_requests=2 workload.num_warmup=0 run.repeats=1 data_dir={tmp_path / 'data'} "
            f"results_dir={tmp_path / 'serve'}")  # fmt: skip
    done = subprocess.run(
        ["make", "--no-print-directory", "bench-gpu", f"MODEL={model}", "DRY_RUN=1", f"ARGS={args}",
         f"DRY_OUT={tmp_path / 'gpu'}"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every check without a GPU passed; stopping here" in done.stderr
    runs = sorted(p for p in (tmp_path / "serve").iterdir() if p.is_dir() and not p.is_symlink())
    assert [p.name.rsplit("-", 1)[-1] for p in runs] == ["sharegpt_16k", "sharegpt_128k"]
    for run in runs:
        _dry_report(run)
    kernel_runs = sorted(p.name.split("-dryrun-")[0] for p in (tmp_path / "gpu").iterdir())
    assert kernel_runs == ["decode-step", "kernels"]
