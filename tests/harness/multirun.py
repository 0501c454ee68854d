"""A Hydra multirun of an entry point through a submitit launcher (`+cluster=slurm` or `+cluster=local`), as a
user runs it, and the structure of what it wrote (file names, JSON keys; not values), to compare launchers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def slurm_overrides(partition: str, timeout_min: int = 10) -> list[str]:
    """configs/cluster/slurm.yaml asks for a GPU node with 16 CPUs and 128 GB; these fit a small CPU node."""
    return [
        f"hydra.launcher.partition={partition}", "hydra.launcher.gpus_per_node=0",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null",
        f"hydra.launcher.timeout_min={timeout_min}",
    ]  # fmt: skip


def run_multirun(
    entry: str,
    overrides: Sequence[str],
    *,
    cluster: str,
    sweep_dir: Path,
    launcher_overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600,
) -> str:
    """`python -m ENTRY --multirun +cluster=CLUSTER hydra.sweep.dir=SWEEP_DIR ...`; it must succeed.

    Returns its output. On failure the message has the output's tail and the jobs' submitit logs.
    """
    cmd = [sys.executable, "-m", entry, "--multirun", f"+cluster={cluster}", f"hydra.sweep.dir={sweep_dir}",
           *launcher_overrides, *overrides]  # fmt: skip
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(cmd)}: over {timeout_s:.0f} s\n{job_logs(sweep_dir)}") from exc
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{out[-3000:]}\n{job_logs(sweep_dir)}"
    return out


def job_logs(sweep_dir: Path, chars: int = 1500) -> str:
    """The tails of the jobs' submitit stdout/stderr logs."""
    parts = []
    for log in sorted((sweep_dir / ".submitit").glob("*/*_log.*")):
        parts.append(f"--- {log.relative_to(sweep_dir)}\n{log.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts)


def submitit_job_ids(sweep_dir: Path) -> list[str]:
    """The ids submitit gave the sweep's jobs (SLURM's `ARRAYID_TASK`, a local job's pid), from its logs."""
    return sorted(log.name.removesuffix("_log.out").rsplit("_", 1)[0]
                  for log in (sweep_dir / ".submitit").glob("*/*_log.out"))  # fmt: skip


def json_keys(obj: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (`a.b`, `a[].c`: list items merged), not its values."""
    keys: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            keys |= {path} | json_keys(value, path)
    elif isinstance(obj, list):
        for item in obj:
            keys |= json_keys(item, f"{prefix}[]")
    return keys


def tree_structure(root: Path, skip: Sequence[str] = (".submitit",)) -> dict[str, set[str] | None]:
    """Each file under root by relative path: a JSON file's key paths, None for any other file. Folders named
    in skip are left out (submitit's own folder is named after job ids)."""
    tree: dict[str, set[str] | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(part in skip for part in rel.parts):
            continue
        tree[str(rel)] = json_keys(json.loads(path.read_text())) if path.suffix == ".json" else None
    return tree
