"""Noise records from /proc and keeping the client off the server's compute cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.serve.noise import (
    NoiseProbe,
    bound_cores,
    client_cores,
    pin_host_processes,
    pinned,
    tree_counters,
)

# What vLLM for CPU logs about its OpenMP binding (vllm/utils/ompmultiprocessing.py), as seen here.
BINDING_LOG = """INFO 12-03 08:01:02 [ompmultiprocessing.py:185] OpenMP thread binding info:
\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False
\tlocal_world_size=1, reserve_cpu_num=1
\tlocal_rank=0, core ids=[1]
\treserved_cpus=[0]
"""


def test_bound_cores_are_read_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(BINDING_LOG)
    assert bound_cores(log) == {1}
    log.write_text(BINDING_LOG.replace("core ids=[1]", "core ids=[2, 3]"))
    assert bound_cores(log) == {2, 3}
    assert bound_cores(tmp_path / "missing.log") == set()


def test_client_cores_leave_the_bound_ones_free_but_never_none() -> None:
    allowed = os.sched_getaffinity(0)
    some = min(allowed)
    assert client_cores({some}) == (allowed - {some} or allowed)
    assert client_cores(set(allowed)) == allowed  # nothing left: stay where we are


def test_pinned_restores_the_affinity() -> None:
    before = os.sched_getaffinity(0)
    with pinned({min(before)}) as cores:
        assert os.sched_getaffinity(0) == {min(before)} == cores
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def test_pinned_moves_every_thread_of_the_process_and_brings_each_back() -> None:
    """A thread started before the block (the telemetry sampler) is pinned too."""
    import threading

    before = os.sched_getaffinity(0)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert other.native_id is not None
        with pinned({min(before)}):
            assert os.sched_getaffinity(other.native_id) == {min(before)}
        assert os.sched_getaffinity(other.native_id) == before
    finally:
        stop.set()
        other.join(timeout=5)


def test_probe_counts_a_busy_process_tree() -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        probe = NoiseProbe(child.pid, loadavg_before=0.1, quiet_loadavg=0.5)
        time.sleep(0.4)
        switches, cpu = tree_counters(child.pid)
        record = probe.finish()
    finally:
        child.wait(timeout=10)
    assert record.server_cpu_s > 0.1 and cpu > 0.1 and switches >= 0
    assert 0.0 <= record.steal_fraction < 1.0 and record.replay_s >= 0.4
    assert not record.under_load or record.steal_fraction > 0.02
    loaded = NoiseProbe(os.getpid(), loadavg_before=3.0, quiet_loadavg=0.5).finish()
    assert loaded.under_load and loaded.loadavg_before == 3.0


def _tree_with_worker(worker: bool) -> subprocess.Popen:
    """A parent (the 'API server') whose child is named a model worker by its argument, or not."""
    # the name is joined in the child's argv only: the parent's own command line must not hold it
    name = "'VLLM-Work' + 'er'" if worker else "'EngineCore'"
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', {name}]); time.sleep(30)"  # noqa: E501
    parent = subprocess.Popen([sys.executable, "-c", child])
    deadline = time.monotonic() + 10
    while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return parent


def _stop(parent: subprocess.Popen) -> None:
    for p in psutil.Process(parent.pid).children(recursive=True):
        p.kill()
    parent.kill()
    parent.wait(timeout=10)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to move processes between")
def test_host_processes_leave_the_workers_core_and_the_worker_stays() -> None:
    allowed = os.sched_getaffinity(0)
    host_cores = {max(allowed)}
    parent = _tree_with_worker(worker=True)
    try:
        done = pin_host_processes(parent.pid, host_cores)
        worker = psutil.Process(parent.pid).children()[0]
        assert done["cores"] == sorted(host_cores) and done["threads"] >= 1 and len(done["processes"]) == 1
        assert os.sched_getaffinity(parent.pid) == host_cores  # every thread of the host process
        assert all(os.sched_getaffinity(t.id) == host_cores for t in psutil.Process(parent.pid).threads())
        assert os.sched_getaffinity(worker.pid) == allowed  # the worker is left where vLLM put it
    finally:
        _stop(parent)


def test_a_tree_without_a_worker_is_left_alone() -> None:
    """The model would run inside the engine core: moving it would move the compute threads too."""
    allowed = os.sched_getaffinity(0)
    parent = _tree_with_worker(worker=False)
    try:
        done = pin_host_processes(parent.pid, {max(allowed)})
        assert "skipped" in done
        assert all(os.sched_getaffinity(p.pid) == allowed for p in psutil.Process(parent.pid).children())
        assert os.sched_getaffinity(parent.pid) == allowed
    finally:
        _stop(parent)
