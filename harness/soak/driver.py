"""The soak's run: both arms' servers up at once, every request of the plan sent to both, checked as it goes.

``run_soak`` starts the two servers (in parallel), takes each arm's idle state (placement telemetry and the
KV usage gauge after a few one-token probes), samples the engine cores' RSS while ``concurrency`` workers
send the plan's requests to both arms until ``duration_s`` is up, waits for both to drain, takes the idle
state again, and writes ``requests.jsonl``, ``summary.json`` and ``summary.md`` under the output folder.
Both servers are stopped on every path out (``Server`` also stops them when the interpreter exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

import tagma.contract as contract
from harness.client import make_connector
from harness.config import ARM_NAMES
from harness.serve.launcher import Server, ServerSpec, start_together
from harness.serve.server_telemetry import last_json_line, parse_prometheus, tree_rss_bytes
from harness.soak.client import send
from harness.soak.config import SoakConfig
from harness.soak.invariants import check_pair, outcome
from harness.soak.plan import TrafficConfig, TrafficPlan

PROBE_PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


@dataclass
class Arm:
    name: str
    backend: str
    server: Server
    telemetry: Path

    @property
    def label(self) -> str:
        return f"{self.name} ({self.backend})"


def server_spec(cfg: SoakConfig, backend: str, model: Path, telemetry: Path) -> ServerSpec:
    env = {
        contract.ENV_TELEMETRY_FILE: str(telemetry),
        contract.ENV_TELEMETRY_INTERVAL_S: f"{cfg.telemetry_interval_s:g}",
    }
    return ServerSpec(
        model=str(model),
        backend=backend,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        kv_cache_space_gib=cfg.kv_cache_space_gib,
        num_gpu_blocks_override=cfg.num_blocks,
        extra_args=cfg.extra_args,
        env=env,
        startup_timeout_s=cfg.startup_timeout_s,
    )


def start_arms(cfg: SoakConfig, model: Path, out_dir: Path, stack: contextlib.ExitStack) -> list[Arm]:
    """Both servers, started in parallel; each is stopped when ``stack`` closes, whatever happens."""
    arms = []
    for name, backend in zip(ARM_NAMES, cfg.backends, strict=True):
        d = out_dir / f"{name}-{backend}"
        d.mkdir(parents=True, exist_ok=True)
        tel = d / contract.PLACEMENT_TELEMETRY_FILE
        tel.unlink(missing_ok=True)
        server = Server(server_spec(cfg, backend, model, tel), d / "server.log")
        stack.callback(server.stop)
        arms.append(Arm(name, backend, server, tel))
    start_together([a.server for a in arms])
    return arms


def metrics(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        return parse_prometheus(r.read().decode("utf-8", errors="replace"))


def probe(base_url: str, model: str) -> None:
    """One single-token request: a scheduler step, so the gauge and the telemetry line are fresh."""
    body = json.dumps({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def idle_state(arm: Arm, model: str, interval_s: float) -> dict:
    """The arm at rest: three probes apart by more than the telemetry interval, then the gauge and the newest
    telemetry line (written at the start of the last probe's step, when no other request held blocks)."""
    for _ in range(3):
        probe(arm.server.base_url, model)
        time.sleep(interval_s + 0.3)
    state: dict = dict(metrics(arm.server.base_url))
    line = last_json_line(arm.telemetry) or {}
    state.update({k: line.get(k) for k in ("free_blocks", "num_blocks", "live_requests", "t")})
    return state


def wait_drained(arm: Arm, timeout_s: float) -> bool:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end and arm.server.alive():
        try:
            m = metrics(arm.server.base_url)
        except OSError:
            return False
        if not m.get("running") and not m.get("waiting"):
            return True
        time.sleep(0.5)
    return False


def engine_core_pid(server_pid: int) -> int | None:
    """The engine-core process of a vLLM server (its title or command line names EngineCore)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in psutil.Process(server_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                    return p.pid
    return None


class RssSampler:
    """Per arm, every ``interval_s``: the engine core's RSS and the whole server tree's."""

    def __init__(self, arms: list[Arm], interval_s: float) -> None:
        self.arms, self.interval_s = arms, interval_s
        self.samples: dict[str, list[tuple[float, int | None, int | None]]] = {a.name: [] for a in arms}
        self._pids = {a.name: engine_core_pid(a.server.proc.pid) if a.server.proc else None for a in arms}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-rss", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic() - self._t0
            for a in self.arms:
                core = self._pids[a.name]
                root = a.server.proc.pid if a.server.proc else None
                self.samples[a.name].append(
                    (t, tree_rss_bytes(core) if core else None, tree_rss_bytes(root) if root else None)
                )
            self._stop.wait(self.interval_s)


@dataclass
class Tally:
    """What the workers saw, by kind and by invariant."""

    sent: Counter = field(default_factory=Counter)
    statuses: dict = field(default_factory=lambda: defaultdict(Counter))  # kind -> "200/200" -> n
    violations: Counter = field(default_factory=Counter)  # violation class -> n
    examples: list = field(default_factory=list)  # the first violations, with their request
    near_ties: int = 0
    compared_tokens: int = 0
    crashed: list = field(default_factory=list)


def _violation_class(text: str) -> str:
    return text.split(":", 1)[0].split(" choice", 1)[0]


async def drive(cfg: SoakConfig, plan: TrafficPlan, arms: list[Arm], model: str, log_path: Path) -> Tally:
    """Send the plan's requests to both arms until the time or the request budget is spent."""
    tally, counter = Tally(), itertools.count()
    deadline = time.monotonic() + cfg.duration_s
    stop = asyncio.Event()
    with open(log_path, "w", encoding="utf-8") as log:
        async with aiohttp.ClientSession(connector=make_connector()) as session:

            async def worker() -> None:
                while time.monotonic() < deadline and not stop.is_set():
                    i = next(counter)
                    if i >= cfg.max_requests:
                        return
                    req = plan.request(i)
                    body = req.body(model)
                    a, b = await asyncio.gather(
                        *(
                            send(session, arm.server.base_url, body, req.abort_after, cfg.request_timeout_s)
                            for arm in arms
                        )
                    )
                    v = check_pair(req, a, b, cfg.tie_tol)
                    tally.sent[req.kind] += 1
                    tally.statuses[req.kind][f"{outcome(a)}/{outcome(b)}"] += 1
                    tally.near_ties += v.near_ties
                    tally.compared_tokens += v.compared_tokens
                    for text in v.violations:
                        tally.violations[_violation_class(text)] += 1
                        if len(tally.examples) < 50:
                            tally.examples.append({"index": i, "kind": req.kind, "violation": text})
                    log.write(
                        json.dumps(
                            {
                                "index": i,
                                "kind": req.kind,
                                "violations": v.violations,
                                "near_ties": v.near_ties,
                                ARM_NAMES[0]: a.to_dict(),
                                ARM_NAMES[1]: b.to_dict(),
                            }
                        )
                        + "\n"
                    )
                    dead = [arm.label for arm in arms if not arm.server.alive()]
                    if dead:
                        tally.crashed = dead
                        stop.set()

            await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    return tally


def run_soak(cfg: SoakConfig, model: Path, out_dir: Path) -> dict:
    """The whole soak; returns the summary (also written as summary.json and summary.md)."""
    from harness.soak.report import summarize, write_summary

    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    plan = TrafficPlan(TrafficConfig.from_dict(cfg.traffic, cfg.max_model_len, vocab))
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        arms = start_arms(cfg, model, out_dir, stack)
        startup = {a.name: a.server.startup_s for a in arms}
        idle = {a.name: idle_state(a, str(model), cfg.telemetry_interval_s) for a in arms}
        with RssSampler(arms, cfg.rss_interval_s) as rss:
            t_traffic = time.monotonic()
            tally = asyncio.run(drive(cfg, plan, arms, str(model), out_dir / "requests.jsonl"))
            traffic_s = time.monotonic() - t_traffic
        drained, alive = {}, {}
        for a in arms:
            alive[a.name] = a.server.alive()
            if alive[a.name] and wait_drained(a, cfg.drain_timeout_s):
                with contextlib.suppress(OSError):
                    drained[a.name] = idle_state(a, str(model), cfg.telemetry_interval_s)
            alive[a.name] = a.server.alive()
        logs = {a.name: a.server.log_text() for a in arms}
        labels = {a.name: a.label for a in arms}
    summary = summarize(
        cfg,
        plan,
        tally,
        idle=idle,
        drained=drained,
        alive=alive,
        rss=rss.samples,
        logs=logs,
        labels=labels,
        traffic_s=traffic_s,
        startup_s=startup,
        started=t0,
    )
    with open(out_dir / "rss.jsonl", "w", encoding="utf-8") as f:  # the series behind the RSS fits
        for name, samples in rss.samples.items():
            for t, core, root in samples:
                f.write(
                    json.dumps({"arm": name, "t_s": t, "engine_core_bytes": core, "server_bytes": root})
                    + "\n"
                )
    write_summary(out_dir, summary)
    return summary
