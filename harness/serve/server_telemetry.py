"""Server telemetry sampled while a run is in flight.

Every `interval_s` a background thread records: vLLM's /metrics (KV cache usage, preemptions, prefix-cache
queries and hits, running and waiting requests), the resident memory of the server's whole process tree,
GPU memory where nvidia-smi exists, and the newest line of the tagma telemetry file (ranges per request,
fragmentation) when the server writes one (TAGMA_TELEMETRY_FILE).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psutil

VLLM_SERIES = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


def parse_prometheus(text: str, wanted: dict[str, str] = VLLM_SERIES) -> dict[str, float]:
    """Sum each wanted series over its label sets (one engine here, but be exact if there are more)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = wanted.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def last_json_line(path: Path | None) -> dict | None:
    """The newest complete JSON line of a file that another process appends to."""
    if path is None or not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().splitlines()
    for raw in reversed(lines):
        try:
            return json.loads(raw)
        except ValueError:
            continue  # a line being written right now
    return None


def tree_rss_bytes(pid: int) -> int | None:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def gpu_memory_used_mib() -> float | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout  # fmt: skip
        return sum(float(x) for x in out.split())
    except (subprocess.SubprocessError, ValueError):
        return None


class TelemetrySampler:
    """Samples until stopped; use as a context manager around a run."""

    def __init__(self, base_url: str, pid: int, interval_s: float = 1.0, tagma_file: Path | None = None):
        self.base_url = base_url
        self.pid = pid
        self.interval_s = interval_s
        self.tagma_file = tagma_file
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> TelemetrySampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()  # one last sample after the run

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> dict:
        row: dict = {"t_s": time.perf_counter() - self._t0}
        try:
            with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=5) as r:
                row.update(parse_prometheus(r.read().decode("utf-8", errors="replace")))
        except OSError as e:
            row["metrics_error"] = str(e)
        row["server_rss_bytes"] = tree_rss_bytes(self.pid)
        row["gpu_memory_used_mib"] = gpu_memory_used_mib()
        tagma = last_json_line(self.tagma_file)
        if tagma is not None:
            row["tagma"] = tagma
        self.samples.append(row)
        return row
