"""How `make test` shares the suite between two pytest-xdist workers (`-n 2 --dist loadfile`).

Most of the suite's time is vLLM servers starting (three Python processes importing vLLM, one after the
other, on one core) and tiny models decoding on one core, so two workers on a 2-core machine take about half
the wall time of one. Three rules keep that honest:
- a test file runs whole on one worker (its module fixtures start its servers once); a session fixture is
  per worker, so one that starts servers is made once for all workers under a file lock (``made_once``);
- the longest files start first (longest-processing-time-first), so the workers finish close together;
- each worker's vLLM servers bind their compute threads to a core of their own (VLLM_CPU_OMP_THREADS_BIND;
  vLLM's default binds every server to the same core), unless the environment already says where.
Without xdist (`pytest tests`, `make test-fast`) none of this applies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# Test files by wall time in `make test`, longest first: the order of CI's serial, compiled run of 03dd80d on
# a 2-core AMD EPYC (its pytest folders' times), checked against the two-worker eager run's --durations
# (2026-12-06). Files not listed are short and follow in collection order.
LONGEST_FIRST = (
    "tests/tagma/test_speculative_serving.py",
    "tests/tagma/test_window_serving.py",
    "tests/harness/test_bench_e2e.py",
    "tests/harness/test_faults.py",
    "tests/conformance/test_vllm_conformance.py",
    "tests/tagma/test_bf16_family_serving.py",
    "tests/harness/test_regime_findings.py",
    "tests/harness/test_slurm_cluster.py",
    "tests/tagma/test_server_equivalence.py",
    "tests/harness/test_soak.py",
    "tests/harness/test_inserver.py",
    "tests/harness/test_mooncake_workload.py",
    "tests/tagma/test_write_path_serving.py",
    "tests/tagma/test_host_time_real_managers.py",
    "tests/harness/test_dry_run.py",
    "tests/harness/test_cluster.py",
)
OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def worker() -> tuple[int, int] | None:
    """(this worker's index, the number of workers) under xdist, else None."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return None
    return int(name[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def bind_cores() -> None:
    """Give this worker's servers the cores ``index::count`` of the ones this process may run on."""
    w = worker()
    if w is None or OMP_BIND in os.environ:
        return
    index, count = w
    cores = sorted(os.sched_getaffinity(0))
    if count > len(cores):
        return  # more workers than cores: leave vLLM's own binding
    os.environ[OMP_BIND] = ",".join(str(c) for c in cores[index::count])


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """The listed files first, longest first; the rest keep their order (in place). xdist hands out whole
    files in this order when told not to reorder them (--no-loadscope-reorder)."""
    if worker() is None:
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(file_of(it), len(rank)))


@contextlib.contextmanager
def made_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder every worker of this run shares, and whether it still has to be made: the first worker to ask
    makes it while holding the lock (the others wait), then marks it done. Without xdist, a plain folder."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker() is not None else base  # xdist: the workers' folders sit side by side
    folder, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a worker that failed half-way left it
                folder.mkdir()
            yield folder, not done.exists()
            done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
