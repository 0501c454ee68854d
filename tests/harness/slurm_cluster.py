"""A one-node SLURM cluster on 127.0.0.1 in a temporary directory, for tests/harness/test_slurm_cluster.py.

munged, slurmctld and slurmd run as child processes of this one (root; Debian's slurm-wlm 22.05, installed by
`make slurm-deps`), with their key, socket, config, state, spool and logs under one temporary directory and
ports picked free at start, so nothing system-wide is read or changed: clients find the cluster through the
SLURM_CONF in `LocalSlurm.env`. No cgroups (proctrack/linuxproc, task/none), no accounting (no slurmdbd).

    with local_slurm_cluster() as cluster:
        subprocess.run(["sbatch", "--wrap", "hostname"], env=cluster.env, check=True)

A developer can keep one up by hand: `python -m tests.harness.slurm_cluster` prints the SLURM_CONF to
export and stops the daemons on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Debian installs the daemons in /usr/sbin, which a non-login PATH may lack.
SBIN = ("/usr/sbin", "/sbin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
NODE = "localhost"
PARTITION = "tagma"

# sacct for a cluster without accounting (no slurmdbd here): submitit's SlurmInfoWatcher asks sacct for the
# state of jobs that have not written their result yet (e.g. one killed by the scheduler). slurmctld itself
# still knows a finished job for MinJobAge seconds, so squeue answers in sacct's --parsable2 format.
SACCT_SHIM = """#!/bin/sh
# sacct without accounting (tests/harness/slurm_cluster.py): the states slurmctld still holds, from squeue.
jobs=""
while [ $# -gt 0 ]; do
    case "$1" in
        -j|--jobs) jobs="$jobs${jobs:+,}$2"; shift 2 ;;
        *) shift ;;
    esac
done
echo "JobID|State|NodeList"
exec squeue --noheader --states=all --format='%i|%T|%N' ${jobs:+--jobs="$jobs"}
"""


def which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def unavailable_reason() -> str | None:
    """Why a local cluster cannot start here (None: it can)."""
    missing = [name for name in DAEMONS + CLIENTS if which(name) is None]
    if missing:
        return f"SLURM/munge binaries missing ({', '.join(missing)}): `make slurm-deps` installs them"
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (munged and slurmd run as root, slurmd starts jobs as users)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """This machine's node definition as slurmd detects it (CPUs, sockets, cores, RealMemory)."""
    try:
        out = subprocess.run([which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=30,
                             check=True).stdout  # fmt: skip
        words = [w for w in out.splitlines()[0].split() if not w.startswith("NodeName=")]
    except (subprocess.SubprocessError, OSError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
        words = [f"CPUs={os.cpu_count()}", f"RealMemory={mem_kb // 1024}"]
    return " ".join([f"NodeName={NODE}", "NodeAddr=127.0.0.1", *words, "State=UNKNOWN"])


def slurm_conf(root: Path, munge_socket: Path, ctld_port: int, slurmd_port: int, partition: str) -> str:
    return f"""# a one-node cluster for the tests (tests/harness/slurm_cluster.py)
ClusterName=tagma-test
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=600
{_node_line()}
PartitionName={partition} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class LocalSlurm:
    root: Path
    partition: str
    env: dict[str, str]  # os.environ plus SLURM_CONF and the PATH with the daemons and the sacct stand-in
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def ctld_log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    def run(self, *cmd: str, timeout: float = 30) -> str:
        """A SLURM client command against this cluster; its stdout."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=True).stdout  # fmt: skip

    def node_state(self) -> str:
        try:
            return self.run("sinfo", "--noheader", "--nodes", NODE, "--format=%t", timeout=10).strip()
        except (subprocess.SubprocessError, OSError):
            return ""

    def logs(self, lines: int = 30) -> str:
        """The tails of the daemons' logs, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def _start(cluster: LocalSlurm, name: str, *args: str) -> None:
    with open(cluster.root / "log" / f"{name}.out", "wb") as log:
        cluster.procs[name] = subprocess.Popen(
            [which(name) or name, *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=cluster.env, start_new_session=True,
        )  # fmt: skip


def _wait(what: str, ready, cluster: LocalSlurm, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [name for name, p in cluster.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not within {timeout_s:.0f} s"
            raise RuntimeError(f"local SLURM cluster: {what}: {why}\n{cluster.logs()}")
        time.sleep(0.2)


def _stop(cluster: LocalSlurm) -> None:
    """Cancel what is left in the queue, then stop slurmd, slurmctld and munged (in that order)."""
    if cluster.procs.get("slurmctld") and cluster.procs["slurmctld"].poll() is None:
        try:
            jobs = cluster.run("squeue", "--noheader", "--format=%A", timeout=10).split()
            if jobs:
                cluster.run("scancel", "--full", *jobs, timeout=10)
                deadline = time.monotonic() + 15
                while cluster.run("squeue", "--noheader", timeout=10).strip() and time.monotonic() < deadline:
                    time.sleep(0.5)
        except (subprocess.SubprocessError, OSError):
            pass
    for name in ("slurmd", "slurmctld", "munged"):
        proc = cluster.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=15)


@contextmanager
def local_slurm_cluster(
    partition: str = PARTITION, timeout_s: float = 60, keep: bool = False
) -> Iterator[LocalSlurm]:
    """Start munged, slurmctld and slurmd; yield once the node is idle; stop them and remove the directory
    (also when starting fails; keep=True leaves the directory, logs included)."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    # Not pytest's tmp_path: munged wants every directory above its socket world-executable, and a unix
    # socket's path must stay short.
    root = Path(tempfile.mkdtemp(prefix="tagma-slurm-"))
    with ExitStack() as stack:
        if not keep:
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        root.chmod(0o755)
        for sub in ("munge", "state", "spool", "log", "run", "bin"):
            (root / sub).mkdir(mode=0o755)
        (root / "key").mkdir(mode=0o700)
        key = root / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = root / "munge" / "munge.socket"
        conf = root / "slurm.conf"
        conf.write_text(slurm_conf(root, munge_socket, _free_port(), _free_port(), partition))
        (root / "plugstack.conf").write_text("")
        sacct = root / "bin" / "sacct"
        sacct.write_text(SACCT_SHIM)
        sacct.chmod(0o755)
        path = os.pathsep.join([str(root / "bin"), os.environ.get("PATH", ""), *SBIN])
        cluster = LocalSlurm(root, partition, {**os.environ, "SLURM_CONF": str(conf), "PATH": path})
        stack.callback(_stop, cluster)

        _start(cluster, "munged", "--foreground", f"--socket={munge_socket}", f"--key-file={key}",
               f"--log-file={root}/log/munged.log", f"--pid-file={root}/run/munged.pid",
               f"--seed-file={root}/munge/munged.seed")  # fmt: skip
        _wait("munged's socket", munge_socket.exists, cluster, timeout_s)
        _start(cluster, "slurmctld", "-D", "-i")
        _start(cluster, "slurmd", "-D", "-N", NODE)
        _wait(f"node {NODE} idle", lambda: cluster.node_state() == "idle", cluster, timeout_s)
        yield cluster


def main() -> None:
    with local_slurm_cluster(keep=True) as cluster:
        print(f"SLURM is up: export SLURM_CONF={cluster.env['SLURM_CONF']}  (partition {cluster.partition}; "
              f"logs in {cluster.root}/log). Ctrl-C stops it.", flush=True)  # fmt: skip
        try:
            while all(p.poll() is None for p in cluster.procs.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
