"""In-server host CPU time per step, paged vs tagma, and what the instrumentation itself costs (a program).

For each backend, two server lifetimes on the tiny model: one with ``TAGMA_HOST_TIME_FILE`` set (the
instrumented one, whose per-step host time is reported) and one without (same everything else, telemetry
included). Each replays ``--requests`` concurrent prompts of about ``--prompt-tokens`` tokens with
``--output-tokens`` output tokens, after one warm-up request. Order: paged-on, tagma-on, tagma-off,
paged-off (ABBA over the instrumentation).

Reported per instrumented run: per-step mean / p50 / p99 of each component (overhead-corrected thread CPU
time, :mod:`harness.analysis.host_time`), busy steps and steps/s; per run: mean TPOT and output tokens/s
from the client. The instrumentation's own cost is estimated two ways: (a) TPOT with vs without (noisy on a
shared machine: read it as a rough bound), (b) the clock reads it makes per step times the measured cost of
one read, over the step's wall time.

    PYTHONPATH=$PWD flock /tmp/tagma-heavy.lock .venv/bin/python benchmarks/host_time_overhead.py

Writes ``results/host_time_overhead/<timestamp>.json`` (machine, versions, commit, every number).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis import host_time
from harness.client import run_requests
from harness.serve.environment import environment
from harness.serve.launcher import Server, ServerSpec
from tagma.contract import ENV_HOST_TIME_FILE, ENV_TELEMETRY_FILE, ENV_TELEMETRY_INTERVAL_S

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Req:  # what harness.client needs of a request
    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int


def build_prompts(model: Path, n: int, tokens: int, output: int, seed: int) -> list[Req]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n + 1):  # the first is the warm-up
        words: list[str] = []
        while True:
            words.extend(f"w{x}" for x in rng.integers(0, 100000, 256))
            ids = tok(" ".join(words))["input_ids"]
            if len(ids) >= tokens:
                text = tok.decode(ids[1:tokens] if ids[0] == tok.bos_token_id else ids[:tokens])
                break
        out.append(Req(i, text, len(tok(text)["input_ids"]), output))
    return out


def one_run(model: Path, backend: str, instrumented: bool, reqs: list[Req], work: Path) -> dict[str, Any]:
    run_dir = work / f"{backend}-{'on' if instrumented else 'off'}"
    run_dir.mkdir(parents=True)
    env = {
        ENV_TELEMETRY_FILE: str(run_dir / "tagma_telemetry.jsonl"),
        ENV_TELEMETRY_INTERVAL_S: "0.5",
    }
    if instrumented:
        env[ENV_HOST_TIME_FILE] = str(run_dir / host_time.BASE_NAME)
    spec = ServerSpec(model=str(model), backend=backend, max_model_len=8192, kv_cache_space_gib=1, env=env)
    warm, measured = reqs[:1], reqs[1:]
    with Server(spec, run_dir / "server.log") as server:
        asyncio.run(run_requests(server.base_url, str(model), warm, [0.0], max_concurrency=1, timeout_s=600))
        since = time.time_ns()
        results, duration = asyncio.run(run_requests(
            server.base_url, str(model), measured, [0.0] * len(measured), max_concurrency=len(measured),
            timeout_s=900,
        ))  # fmt: skip
        time.sleep(1.2)  # more than two flush intervals: every step is on disk
        failed = [r.error for r in results if not r.success]
        if failed:
            raise RuntimeError(f"{backend}: {failed[0]}")
        row: dict[str, Any] = {
            "backend": backend, "instrumented": instrumented, "duration_s": duration,
            "mean_tpot_ms": statistics.mean(r.tpot * 1000 for r in results),
            "mean_ttft_ms": statistics.mean(r.ttft * 1000 for r in results),
            "output_tokens_per_s": sum(r.completion_tokens or 0 for r in results) / duration,
            "prompt_tokens": [r.prompt_tokens for r in results],
        }  # fmt: skip
        if instrumented:
            run = host_time.load_run(run_dir)
            summary = host_time.summarize(run, since_ns=since)
            s = run.steps
            busy = (s["num_tokens"] > 0) & (s["end_ns"] >= since)
            reads = (2 * (s["kv_calls"] + s["update_kv_calls"] + s["outside_kv_calls"]) + 4)[busy]
            worker_reads = (4 + 2 * s["block_table_calls"])[busy] if run.aligned else np.zeros(busy.sum())
            c_s = run.timer_overhead_ns["scheduler"]
            c_w = run.timer_overhead_ns.get("worker", c_s)
            clock_ns = reads * c_s + worker_reads * c_w
            wall = s["execute_wall_ns"][busy] if run.aligned else None
            row.update(
                host_time=summary,
                steps_per_s=float(busy.sum()) / duration,
                clock_reads_per_step=float((reads + worker_reads).mean()),
                clock_ns_per_step=float(clock_ns.mean()),
                clock_share_of_execute_wall=float(clock_ns.sum() / wall.sum()) if wall is not None else None,
            )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "data" / "tiny-llama")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    reqs = build_prompts(args.model, args.requests, args.prompt_tokens, args.output_tokens, args.seed)
    order = [("paged", True), ("tagma", True), ("tagma", False), ("paged", False)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="host-time-") as tmp:
        for backend, instrumented in order:
            rows.append(one_run(args.model, backend, instrumented, reqs, Path(tmp)))
            r = rows[-1]
            state = "on " if instrumented else "off"
            print(f"{backend:5s} host_time={state} TPOT {r['mean_tpot_ms']:.2f} ms  "
                  f"out {r['output_tokens_per_s']:.1f} tok/s", flush=True)  # fmt: skip
    by = {(r["backend"], r["instrumented"]): r for r in rows}
    for backend in ("paged", "tagma"):
        on_run = by[(backend, True)]
        comps = on_run["host_time"]["components"]
        share = 100 * (on_run["clock_share_of_execute_wall"] or 0)
        print(f"\n{backend}: steps {on_run['host_time']['steps']}, "
              f"clock reads/step {on_run['clock_reads_per_step']:.1f} "
              f"({on_run['clock_ns_per_step'] / 1000:.1f} us/step, {share:.2f}% of execute wall)")
        for name, st in comps.items():
            print(f"  {name:28s} mean {st['mean_ns'] / 1000:8.1f} us  p50 {st['p50_ns'] / 1000:8.1f}  "
                  f"p99 {st['p99_ns'] / 1000:8.1f}  per req {st['per_request_ns'] / 1000:7.1f}")  # fmt: skip
        on, off = by[(backend, True)]["mean_tpot_ms"], by[(backend, False)]["mean_tpot_ms"]
        print(f"  TPOT on/off: {on:.2f} / {off:.2f} ms (ratio {on / off:.3f})")
    out_dir = REPO / "results" / "host_time_overhead"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    record = {"environment": environment(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": rows}
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
