"""What else the machine was doing while a run was measured, read from /proc, and keeping the client off the
server's compute cores.

A run records, between the start and the end of its timed replay: the machine's CPU steal share (time the
hypervisor gave to other tenants), the involuntary context switches of the server's whole process tree
(how often the kernel took a core away from it), the server tree's CPU seconds, and the 1-minute load
average before its server started (anything of ours is stopped by then, so it is other tenants' load).
A run is flagged ``under_load`` when that load average or the steal share says the machine was busy.

vLLM for CPU binds its OpenMP compute threads to the cores it logs ("local_rank=0, core ids=[1]"); the
client process is pinned to the other cores for the replay only, so servers started later are not
confined by an inherited affinity mask. With ``run.pin_server_host`` the server's own host processes (the
API server and the engine core: every process of its tree but the model worker) are moved off those cores
too, so the worker's compute core runs nothing else of ours (:func:`pin_host_processes`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

STEAL_FLAG = 0.02  # a replay that lost more than 2% of CPU time to steal is flagged
_BOUND_CORES = re.compile(r"local_rank=\d+, core ids=\[([\d,\s]*)\]")


def cpu_times() -> tuple[float, float]:
    """(total, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    t = psutil.cpu_times()
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
    return total, float(getattr(t, "steal", 0.0))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_counters(pid: int) -> tuple[int, float]:
    """(involuntary context switches, CPU seconds) summed over a process and its descendants now."""
    switches, cpu = 0, 0.0
    for p in _tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            switches += p.num_ctx_switches().involuntary
            t = p.cpu_times()
            cpu += t.user + t.system
    return switches, cpu


@dataclass(frozen=True)
class NoiseRecord:
    loadavg_before: float  # 1-minute load average before the server started
    steal_fraction: float  # machine-wide steal / total CPU time over the replay
    server_involuntary_switches: int
    server_cpu_s: float
    replay_s: float
    under_load: bool

    def to_dict(self) -> dict:
        return asdict(self)


class NoiseProbe:
    """Counters at the start of a replay; :meth:`finish` returns the :class:`NoiseRecord` of the interval."""

    def __init__(self, server_pid: int, loadavg_before: float, quiet_loadavg: float) -> None:
        self.pid = server_pid
        self.loadavg_before = loadavg_before
        self.quiet_loadavg = quiet_loadavg
        self._cpu0 = cpu_times()
        self._tree0 = tree_counters(server_pid)
        self._t0 = time.monotonic()

    def finish(self) -> NoiseRecord:
        total1, steal1 = cpu_times()
        switches1, cpu1 = tree_counters(self.pid)
        d_total = total1 - self._cpu0[0]
        steal = (steal1 - self._cpu0[1]) / d_total if d_total > 0 else 0.0
        return NoiseRecord(
            loadavg_before=round(self.loadavg_before, 2),
            steal_fraction=round(steal, 4),
            server_involuntary_switches=max(0, switches1 - self._tree0[0]),
            server_cpu_s=round(max(0.0, cpu1 - self._tree0[1]), 3),
            replay_s=round(time.monotonic() - self._t0, 3),
            under_load=self.loadavg_before > self.quiet_loadavg or steal > STEAL_FLAG,
        )


def loadavg_1min() -> float:
    return os.getloadavg()[0]


def bound_cores(server_log: Path) -> set[int]:
    """The cores vLLM for CPU bound its compute threads to, from the server's log (empty: none logged)."""
    try:
        text = server_log.read_text(errors="replace")
    except FileNotFoundError:
        return set()
    cores: set[int] = set()
    for m in _BOUND_CORES.finditer(text):
        cores |= {int(x) for x in m.group(1).replace(",", " ").split()}
    return cores


def client_cores(busy: set[int]) -> set[int]:
    """The cores the client may use: those it may run on now, minus ``busy`` (all of them if none is left)."""
    allowed = os.sched_getaffinity(0)
    free = allowed - busy
    return free or allowed


def _threads(proc: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [t.id for t in proc.threads()]
    return []


def _set_threads(masks: dict[int, set[int]]) -> int:
    """Give each thread its mask; returns how many took it (a thread that ended meanwhile does not)."""
    done = 0
    for tid, cores in masks.items():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cores)
            done += 1
    return done


@contextlib.contextmanager
def pinned(cores: set[int] | None) -> Iterator[set[int]]:
    """Run the block with every thread of this process on ``cores`` (None: unchanged), the telemetry sampler's
    too (a mask set with pid 0 binds the calling thread only); each thread's old affinity comes back after."""
    before = os.sched_getaffinity(0)
    if not cores or cores == before:
        yield before
        return
    saved: dict[int, set[int]] = {}
    for tid in _threads(psutil.Process()):
        with contextlib.suppress(OSError):
            saved[tid] = os.sched_getaffinity(tid)
    _set_threads({tid: cores for tid in saved})
    try:
        yield cores
    finally:
        _set_threads(saved)


def pin_host_processes(server_pid: int, cores: set[int], worker_marker: str = "Worker") -> dict:
    """Move every thread of the server's host processes (the tree of ``server_pid`` but the model workers,
    whose name or command line holds ``worker_marker``) to ``cores``. Threads they start later inherit the
    mask. Returns what was done: the cores, the pinned processes' names and their thread count. A tree with
    no worker process (the model runs inside the engine core) is left as it is: its compute threads would
    move too."""

    def is_worker(proc: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return worker_marker in proc.name() or worker_marker in " ".join(proc.cmdline())
        return False

    tree = _tree(server_pid)
    hosts = [p for p in tree if not is_worker(p)]
    if len(hosts) == len(tree):
        return {"skipped": f"no process named {worker_marker!r} in the server's tree"}
    pinned_names: list[str] = []
    threads = 0
    for proc in hosts:
        with contextlib.suppress(psutil.Error):
            threads += _set_threads(dict.fromkeys(_threads(proc), cores))
            pinned_names.append(proc.name())
    return {"cores": sorted(cores), "processes": sorted(pinned_names), "threads": threads}
