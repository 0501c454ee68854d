"""How much does harness.client itself cost per request? (a program, not a test)

Runs the client against the mock server (``python -m harness.serve.mock_server``, in a SEPARATE process so it
does not share the client's event loop or CPU accounting) with 128K-token prompts (~512 KB of text) at
zero server delay. The server stamps every chunk with its own ``perf_counter_ns`` (CLOCK_MONOTONIC, the
same clock as the client's on one Linux machine), so server events can be placed on the client's clock.

Definitions, per request (ms unless noted):

* ``dispatch_lag`` = sent - scheduled: how late the client handed the request to aiohttp.
* ``send_latency`` = written - scheduled: until aiohttp has passed the whole 512 KB body to the socket
  (the kernel took it, or the transport buffered the rest). JSON encoding is NOT in it: bodies are
  encoded before the run clock starts (its cost is reported apart as ``encode``).
* ``recv_lag`` = client arrival stamp of a chunk - the server's write stamp of that chunk: loopback plus
  the client's read wake-up (the client stamps a read before parsing it).
* ``overhead`` = send_latency + recv_lag of the first chunk: the latency the client adds to a TTFT
  (loopback included). THE HEADLINE, for the one-token series.
* ``cpu``: the client process's CPU time (user + sys, getrusage) during the timed run / requests; it
  includes the kernel's copy of the 512 KB body into the socket.
* ``raw_cpu``: the same for a minimal asyncio-streams client that writes the same pre-built HTTP request
  and reads until the end of the chunked response (the floor for any Python asyncio client), measured in
  the same repeat; ``cpu_over_raw`` = cpu - raw_cpu is what aiohttp and our parsing add.
* ``per_chunk_cpu_us``: (cpu of the 64-token streaming series - cpu of the one-token series) / 63, with a
  2 ms token delay so that each chunk is its own network read (the realistic, most expensive case);
  ``raw_per_chunk_cpu_us`` is the same for the raw client.

Series: ``one_token`` (1 output token, requests 30 ms apart, open loop), ``stream_64_coalesced`` (64
tokens at zero delay: the chunks arrive in a few reads), ``stream_64_2ms`` (64 tokens, 2 ms apart, requests
200 ms apart), ``burst_16`` (16 requests at the same instant). Each statistic is the median over a repeat's
requests; the summary gives the median / min / max of it over the repeats. PASS: the medians of
``overhead`` and of ``cpu_over_raw`` are both below 1 ms.

    .venv/bin/python -m benchmarks.client_overhead [--repeats 5] [--requests 20] [--realtime] [--no-pin]

By default the client and the mock server are pinned to different CPUs; ``--realtime`` runs both as
SCHED_FIFO so that other processes on a shared machine stay out of the numbers.

It writes ``results/client_overhead/<timestamp>.json`` (machine, versions, git commit, every statistic per
repeat and per request) and prints a summary; the exit status is 0 on PASS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.client import ClientConfig, execute, prepare
from harness.serve.environment import REPO, environment, git_state
from harness.serve.mock_server import parse_stamps

PROMPT_TOKENS = 131072
CHARS_PER_TOKEN = 4
LIMIT_MS = 1.0
PIN_CPUS: tuple[int, int] | None = None  # (client CPU, server CPU), set by --pin


@dataclass
class Req:
    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int


@dataclass
class Series:
    name: str
    max_tokens: int
    token_delay_s: float
    spacing_s: float  # open-loop gap between requests; 0 = one burst
    n_requests: int


def make_prompt(seed: int, n_chars: int) -> str:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kv", "cache", "range", "block", "token", "serve"]
    parts: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(words)
        parts.append(w)
        size += len(w) + 1
    return " ".join(parts)[:n_chars]


@contextmanager
def mock_server(token_delay_s: float) -> Iterator[str]:
    cmd = [sys.executable, "-m", "harness.serve.mock_server", "--port", "0", "--stamp-times",
           "--prompt-tokens", str(PROMPT_TOKENS), "--token-delay", str(token_delay_s)]
    if PIN_CPUS:  # client on one CPU, mock server on another: no wake-up preemption between the two
        cmd = ["taskset", "-c", str(PIN_CPUS[1]), *cmd]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"mock server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def raw_client(url: str, bodies: list[bytes], offsets: list[float]) -> float:
    """The floor: pre-built HTTP/1.1 requests on one keep-alive connection, read to the final chunk.
    Returns CPU ms per request."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    c0 = cpu_s()
    t0 = time.perf_counter()
    for body, off in zip(bodies, offsets, strict=True):
        delay = t0 + off - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        writer.writelines([f"{head}Content-Length: {len(body)}\r\n\r\n".encode(), body])
        buf = b""
        while not buf.endswith(b"\r\n0\r\n\r\n"):
            data = await reader.read(1 << 20)
            if not data:
                raise RuntimeError("raw client: server closed the connection")
            buf = buf[-16:] + data
    cpu_ms = (cpu_s() - c0) * 1e3 / len(bodies)
    writer.close()
    await writer.wait_closed()
    return cpu_ms


async def one_repeat(url: str, s: Series, prompt: str, seed: int, with_raw: bool) -> dict[str, Any]:
    cfg = ClientConfig(keep_text=True)
    reqs = [Req(i, f"{seed}-{i} " + prompt, PROMPT_TOKENS, s.max_tokens) for i in range(s.n_requests)]
    offsets = [i * s.spacing_s for i in range(s.n_requests)]
    warm = prepare("mock", reqs[:2], [0.0, s.spacing_s], cfg)
    await execute(url, warm, config=cfg)  # warm code paths and the server
    t = time.perf_counter()
    run = prepare("mock", reqs, offsets, cfg)
    encode_ms = (time.perf_counter() - t) * 1e3 / s.n_requests
    raw_bodies = list(run.bodies)
    c0 = cpu_s()
    results, duration = await execute(url, run, config=cfg, timeout_s=60)
    cpu_ms = (cpu_s() - c0) * 1e3 / s.n_requests
    raw_cpu_ms = await raw_client(url, raw_bodies, offsets) if with_raw else None
    del raw_bodies
    assert run.t0 is not None
    per_req: list[dict[str, float]] = []
    for r in results:
        if not r.success or r.text is None or r.sent_s is None or r.written_s is None:
            raise RuntimeError(f"request {r.index} failed: {r.error}")
        stamps = parse_stamps(r.text)
        assert len(stamps) == len(r.chunk_times)
        writes = [w / 1e9 - run.t0 for _, _, w in stamps]
        recv = [(c - w) * 1e3 for c, w in zip(r.chunk_times, writes, strict=True)]
        send = (r.written_s - r.scheduled_s) * 1e3
        per_req.append({
            "dispatch_lag": (r.sent_s - r.scheduled_s) * 1e3,
            "send_latency": send,
            "recv_lag_first": recv[0],
            "recv_lag_median": float(np.median(recv)),
            "overhead": send + recv[0],
            "client_ttft": (r.ttft or 0.0) * 1e3,
        })
    summary = {k: float(np.median([p[k] for p in per_req])) for k in per_req[0]}
    out: dict[str, Any] = {"cpu": cpu_ms, "encode": encode_ms, "duration_s": duration,
                           "max_dispatch_lag": max(p["dispatch_lag"] for p in per_req),
                           "max_send_latency": max(p["send_latency"] for p in per_req), **summary}
    if raw_cpu_ms is not None:
        out |= {"raw_cpu": raw_cpu_ms, "cpu_over_raw": cpu_ms - raw_cpu_ms}
    return out | {"per_request": per_req}


def across(repeats: list[dict[str, Any]], key: str) -> dict[str, float]:
    v = [r[key] for r in repeats]
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


async def run_series(s: Series, repeats: int, prompt: str) -> dict[str, Any]:
    out = []
    with mock_server(s.token_delay_s) as url:
        for k in range(repeats):
            out.append(await one_repeat(url, s, prompt, seed=k, with_raw=s.spacing_s > 0))
    keys = [k for k in out[0] if k != "per_request"]
    return {"config": s.__dict__, "stats": {k: across(out, k) for k in keys}, "repeats": out}


def machine() -> dict[str, Any]:
    """harness.serve.environment's record of the machine, plus how this process is scheduled and pinned."""
    policies = {os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}
    policy = policies.get(os.sched_getscheduler(0), "SCHED_OTHER")
    env = environment()
    return {**env, "cpus": env["cpu_count"], "loadavg_before": os.getloadavg(),
            "scheduling": f"{policy}, nice {os.nice(0)}", "pinned_cpus_client_server": PIN_CPUS}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    host = machine()
    prompt = make_prompt(0, PROMPT_TOKENS * CHARS_PER_TOKEN)
    series = [
        Series("one_token", max_tokens=1, token_delay_s=0.0, spacing_s=0.03, n_requests=args.requests),
        Series("stream_64_coalesced", max_tokens=64, token_delay_s=0.0, spacing_s=0.03,
               n_requests=args.requests),
        Series("stream_64_2ms", max_tokens=64, token_delay_s=0.002, spacing_s=0.2,
               n_requests=max(4, args.requests // 2)),
        Series("burst_16", max_tokens=1, token_delay_s=0.0, spacing_s=0.0, n_requests=16),
    ]
    out = {s.name: await run_series(s, args.repeats, prompt) for s in series}
    one = out["one_token"]["stats"]
    def per_chunk_us(key: str) -> dict[str, float]:
        pairs = zip([r[key] for r in out["one_token"]["repeats"]],
                    [r[key] for r in out["stream_64_2ms"]["repeats"]], strict=True)
        return across([{"x": (b - a) / 63 * 1e3} for a, b in pairs], "x")

    headline = {
        "overhead_ms_per_request": one["overhead"],
        "send_latency_ms": one["send_latency"],
        "dispatch_lag_ms": one["dispatch_lag"],
        "recv_lag_first_ms": one["recv_lag_first"],
        "recv_lag_ms_streamed": out["stream_64_2ms"]["stats"]["recv_lag_median"],
        "cpu_ms_per_request": one["cpu"],
        "raw_cpu_ms_per_request": one["raw_cpu"],
        "cpu_over_raw_ms": one["cpu_over_raw"],
        "per_chunk_cpu_us": per_chunk_us("cpu"),
        "raw_per_chunk_cpu_us": per_chunk_us("raw_cpu"),
        "encode_ms_off_path": one["encode"],
        "burst_16_max_send_latency_ms": out["burst_16"]["stats"]["max_send_latency"],
        "limit_ms": LIMIT_MS,
    }
    headline["pass"] = bool(one["overhead"]["median"] < LIMIT_MS and one["cpu_over_raw"]["median"] < LIMIT_MS)
    return {"benchmark": "client_overhead", "definitions": __doc__, "machine": host, "git": git_state(),
            "prompt_tokens": PROMPT_TOKENS, "prompt_chars": len(prompt), "repeats": args.repeats,
            "headline": headline, "series": out}


def print_summary(res: dict[str, Any], path: Path) -> None:
    h = res["headline"]

    def fmt(d: dict[str, float], unit: str = "ms") -> str:
        return f"median {d['median']:.3f} {unit} (min {d['min']:.3f}, max {d['max']:.3f})"

    m = res["machine"]
    print(f"client overhead, {res['prompt_tokens']}-token prompts ({res['prompt_chars']} chars), "
          f"{res['repeats']} repeats, {m['cpu']} x{m['cpus']}, load {m['loadavg_before'][0]:.2f}, "
          f"{m['scheduling']}, pinned {m['pinned_cpus_client_server']}")
    print(f"  OVERHEAD per request (send + recv lag): {fmt(h['overhead_ms_per_request'])}")
    print(f"    scheduled -> body written to socket:  {fmt(h['send_latency_ms'])}")
    print(f"    of which scheduled -> sent (dispatch): {fmt(h['dispatch_lag_ms'])}")
    print(f"    first chunk: server write -> client:  {fmt(h['recv_lag_first_ms'])}")
    print(f"  chunk recv lag, 2 ms token delay:       {fmt(h['recv_lag_ms_streamed'])}")
    print(f"  client CPU per request (1 token):       {fmt(h['cpu_ms_per_request'])}")
    print(f"    raw asyncio-streams floor:            {fmt(h['raw_cpu_ms_per_request'])}")
    print(f"    client over the floor:                {fmt(h['cpu_over_raw_ms'])}")
    print(f"  per-chunk CPU (one read per chunk):     {fmt(h['per_chunk_cpu_us'], 'us')}")
    print(f"    raw asyncio-streams floor:            {fmt(h['raw_per_chunk_cpu_us'], 'us')}")
    print(f"  burst of 16: slowest send latency       {fmt(h['burst_16_max_send_latency_ms'])}")
    print(f"  JSON encode (before the clock starts):  {fmt(h['encode_ms_off_path'])}")
    for name, s in res["series"].items():
        st = s["stats"]
        print(f"  [{name}] cpu {st['cpu']['median']:.3f} ms/req, send {st['send_latency']['median']:.3f}, "
              f"recv_lag {st['recv_lag_first']['median']:.3f}, "
              f"client ttft {st['client_ttft']['median']:.3f} ms")
    print(f"  {'PASS' if h['pass'] else 'FAIL'}: < {h['limit_ms']} ms per request -> {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "client_overhead")
    p.add_argument("--realtime", action="store_true",
                   help="run client and mock server as SCHED_FIFO (Linux, root): keeps other processes' CPU "
                        "load out of the numbers on a shared machine")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin the client and the mock server to different CPUs (pinned by default: "
                        "on a small machine the server's wake-ups otherwise preempt the client in mid-send)")
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) >= 2:
        global PIN_CPUS
        PIN_CPUS = (cpus[0], cpus[-1])
        os.sched_setaffinity(0, {PIN_CPUS[0]})
    if args.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # inherited by the mock server
    res = asyncio.run(main_async(args))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1, allow_nan=False))
    print_summary(res, path)
    return 0 if res["headline"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
