"""Noise records from /proc and keeping the client off the server's compute cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.serve.noise import NoiseProbe, bound_cores, client_cores, pinned, tree_counters

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
