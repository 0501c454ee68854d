"""Multi-node sweeps go through hydra-submitit-launcher, selected by `+cluster=slurm` (or `+cluster=local`):
the Slurm config composes onto each entry point, and a multirun on submitit's local executor finishes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.files import read_json

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config_name", ["bench", "rate_sweep", "host_bench"])
@pytest.mark.parametrize(("cluster", "launcher"), [("slurm", "SlurmLauncher"), ("local", "LocalLauncher")])
def test_cluster_override_selects_submitit(config_name: str, cluster: str, launcher: str) -> None:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name=config_name, overrides=[f"+cluster={cluster}"], return_hydra_config=True)
    target = f"hydra_plugins.hydra_submitit_launcher.submitit_launcher.{launcher}"
    assert cfg.hydra.launcher._target_ == target
    if cluster == "slurm":
        assert cfg.hydra.launcher.nodes == 1 and cfg.hydra.launcher.gpus_per_node == 1


def test_submitit_local_launcher_runs_a_multirun(tmp_path: Path) -> None:
    """Two jobs of the host bench's smoke size through submitit's local executor (no scheduler needed)."""
    cmd = [
        sys.executable, "-m", "benchmarks.host.main", "--multirun", "+cluster=local", "size=smoke",
        f"results_dir={tmp_path / 'host'}", "run_id=job${hydra:job.num}", "point_latest=false",
        "native.enabled=false", "sections=[manager]", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, timeout=600, capture_output=True)
    for job in (0, 1):
        result = read_json(tmp_path / "host" / f"job{job}" / "host_bench.json")
        assert result["config"]["seed"] == job and result["checks"]["manager_outcomes_identical"]
    assert (tmp_path / "sweep" / ".submitit").is_dir()
