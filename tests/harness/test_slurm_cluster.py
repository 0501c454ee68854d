"""`+cluster=slurm` against a real SLURM: a one-node cluster on this machine (tests/harness/slurm_cluster.py
starts and stops munged, slurmctld and slurmd), a small multirun through hydra-submitit-launcher's
SlurmLauncher, and the same multirun through `+cluster=local`: the results have the same structure (files,
JSON keys). Needs root and Debian's slurm-wlm (`make slurm-deps`). Without them it skips, except in CI
(CI=true), where it fails: CI installs them (.ci/run)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SMOKE_MAP_OVERRIDES
from tests.harness.multirun import run_multirun, slurm_overrides, submitit_job_ids, tree_structure
from tests.harness.slurm_cluster import LocalSlurm, local_slurm_cluster, unavailable_reason

# Two cells of the host bench's smoke size; one quick section (the imports take most of a job's ~30 s).
HOST_SMOKE = [
    "size=smoke", "point_latest=false", "native.enabled=false", "sections=[prefix_index]", "seed=0,1",
    "run_id=job${hydra:job.num}",
]  # fmt: skip


RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    reason = unavailable_reason()
    if reason:
        if in_ci():
            pytest.fail(f"CI runs the SLURM test: {reason}")
        pytest.skip(reason)
    with local_slurm_cluster() as cluster:
        yield cluster


def assert_ran_on_slurm(cluster: LocalSlurm, sweep_dir: Path, jobs: int) -> None:
    """The sweep's jobs are SLURM jobs of this cluster that completed in its partition."""
    job_ids = submitit_job_ids(sweep_dir)
    # several jobs go as one array (ARRAYID_TASK); a sweep of one job is a plain job (JOBID)
    assert len(job_ids) == jobs and all(re.fullmatch(r"\d+(_\d+)?", j) for j in job_ids), job_ids
    for job_id in job_ids:
        info = finished_job(cluster, job_id)
        assert "JobState=COMPLETED" in info and f"Partition={cluster.partition}" in info, info
        logged = rf"JobId={job_id}\(\d+\) done" if "_" in job_id else rf"JobId={job_id} done"
        assert re.search(logged, cluster.ctld_log.read_text()), f"{job_id} not in slurmctld's log"


def finished_job(cluster: LocalSlurm, job_id: str, timeout_s: float = 120.0) -> str:
    """`scontrol show job` once the job has left the running states. submitit returns as soon as the job has
    written its result, while its step may still be exiting (RUNNING, then COMPLETING)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = cluster.run("scontrol", "show", "job", job_id)
        state = re.search(r"JobState=(\w+)", info)
        if (state and state.group(1) not in RUNNING_STATES) or time.monotonic() > deadline:
            return info
        time.sleep(1.0)


@pytest.mark.slow
def test_host_smoke_multirun_through_slurm_matches_local(slurm: LocalSlurm, tmp_path: Path) -> None:
    for cluster in ("slurm", "local"):
        launcher = slurm_overrides(slurm.partition) if cluster == "slurm" else []
        try:
            run_multirun(
                "benchmarks.host.main", [*HOST_SMOKE, f"results_dir={tmp_path / cluster / 'host'}"],
                cluster=cluster, sweep_dir=tmp_path / cluster / "sweep", launcher_overrides=launcher,
                env=slurm.env if cluster == "slurm" else None, timeout_s=300,
            )  # fmt: skip
        except AssertionError as exc:  # the daemons' logs go with the cluster's folder
            raise AssertionError(f"{exc}\n{slurm.logs() if cluster == 'slurm' else ''}") from None
    assert_ran_on_slurm(slurm, tmp_path / "slurm" / "sweep", jobs=2)

    on_slurm, local = (tree_structure(tmp_path / c / "host") for c in ("slurm", "local"))
    assert {"job0/host_bench.json", "job1/host_bench.json"} <= set(local)
    assert on_slurm == local
    # Hydra's sweep folders: multirun.yaml and each job's log, the same either way.
    sweeps = [tree_structure(tmp_path / c / "sweep").keys() for c in ("slurm", "local")]
    assert sweeps[0] == sweeps[1] and {"multirun.yaml", "0/main.log", "1/main.log"} <= sweeps[0]


def _without_pids(tree: dict[str, set[str] | None]) -> dict[str, set[str] | None]:
    """A map's structure with the server processes' pids taken out of file names (host_time.<role>.<pid>)."""
    return {re.sub(r"\.\d+\.jsonl$", ".<pid>.jsonl", path): keys for path, keys in tree.items()}


@pytest.mark.slow
def test_regime_smoke_cells_through_slurm_match_local(
    slurm: LocalSlurm, tmp_path: Path, smoke_map: Path
) -> None:
    """The regime map's smoke group (one server lifetime per arm) as a SLURM job and as a local one (the
    session's run through `+cluster=local`, tests/conftest.py): the same map folder structure (lifetimes,
    cells' runs, group summary, host-time files)."""
    try:
        run_multirun(
            "harness.regime.main", [*SMOKE_MAP_OVERRIDES, f"map_dir={tmp_path / 'map'}"], cluster="slurm",
            sweep_dir=tmp_path / "sweep", launcher_overrides=slurm_overrides(slurm.partition, timeout_min=20),
            env=slurm.env, timeout_s=1200,
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{slurm.logs()}") from None
    assert_ran_on_slurm(slurm, tmp_path / "sweep", jobs=1)
    on_slurm, local = (_without_pids(tree_structure(d)) for d in (tmp_path / "map", smoke_map))
    assert (
        "prefix-on/group_summary.json" in local
        and "prefix-on/cells/mooncake/runs/01-candidate-tagma/status.json" in local
    )
    assert on_slurm == local
