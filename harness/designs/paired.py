"""The paired-interleaving design: both arms' servers up at once, every prompt sent to both seconds apart.

On a shared machine the dominant noise is slow drift between server lifetimes minutes apart (other tenants,
thermal and frequency state, the server's own warm-up); it is far larger than host-side effects. Here each
prompt goes to arm A, then (as soon as A has answered) to arm B, with the first arm alternating from pair
to pair (A B, B A, A B, ...), so both measurements of a pair are seconds apart and the order effect cancels.
Only one request is in flight at a time, so the idle server does not compete for the cores (closed loop,
concurrency 1; for concurrency > 1 use the ABBA design). ``run.repeats`` rounds each start a fresh pair of
servers, so server-lifetime effects also enter the comparison.

Each arm's requests.jsonl carries ``pair`` (the position of the pair in measurement order over all rounds),
``round`` and ``first`` (whether this arm went first in the pair).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
from tqdm import tqdm

from harness.client import ClientConfig, RequestResult, completions_url, encode_body, make_session, send_one
from harness.config import BenchConfig
from harness.files import read_json
from harness.runner import RunFailed, ServerRun, failure_reason, run_dir_name, run_is_done
from harness.serve.launcher import ServerError
from harness.serve.noise import pinned
from harness.workload.spec import Workload


def first_arm_of(pair: int) -> int:
    """0 (baseline first) for even pairs, 1 for odd ones: the order alternates pair by pair."""
    return pair % 2


async def replay_pairs(
    cfg: BenchConfig, urls: tuple[str, str], workload: Workload, pair0: int, bar: tqdm
) -> tuple[list[list[RequestResult]], list[float], list[list[tuple[int, int]]]]:
    """Send each request to both servers, one at a time. Returns per-arm results (request order), per-arm
    busy durations (the sum of that arm's request latencies: its share of the wall time) and per-arm wall
    windows (time_ns sent, done) of each request, which attribute in-server host time to requests."""
    config = ClientConfig()
    timeout = aiohttp.ClientTimeout(total=cfg.run.request_timeout_s)
    results: list[list[RequestResult]] = [[], []]
    walls: list[list[tuple[int, int]]] = [[], []]  # per request: wall time_ns when sent and when done
    busy = [0.0, 0.0]
    async with make_session(config) as session:
        t0 = time.perf_counter()
        for k, req in enumerate(workload.requests):
            body = encode_body(cfg.model.path, req, config)
            first = first_arm_of(pair0 + k)
            for arm in (first, 1 - first):
                res = RequestResult(index=req.index, scheduled_s=time.perf_counter() - t0,
                                    expected_prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens)
                start, wall_start = time.perf_counter(), time.time_ns()
                await send_one(session, completions_url(urls[arm]), body, res, t0, timeout, False)
                busy[arm] += time.perf_counter() - start
                results[arm].append(res)
                walls[arm].append((wall_start, time.time_ns()))
            bar.update(1)
    return results, busy, walls


def run_round(cfg: BenchConfig, workload: Workload, round_index: int) -> list[dict]:
    """One round: a fresh server per arm, both up, the whole workload replayed in pairs."""
    arms = cfg.arms
    indices = (2 * round_index, 2 * round_index + 1)
    runs = [ServerRun(cfg, arm, i, cfg.out_dir / "runs" / run_dir_name(i, arm))
            for arm, i in zip(arms, indices, strict=True)]
    pair0 = round_index * len(workload.requests)
    try:
        with contextlib.ExitStack() as stack:
            for run in runs:
                stack.enter_context(run)
            for run in runs:
                run.warm_up(workload)
            for run in runs:
                run.begin_replay()
            cores = runs[0].client_cores()
            if cores is not None:
                cores &= runs[1].client_cores() or cores
            desc = f"round {round_index} pairs"
            bar_ = tqdm(total=len(workload.requests), desc=desc, unit="pair", leave=False)
            with pinned(cores), bar_ as bar:
                results, busy, walls = asyncio.run(asyncio.wait_for(
                    replay_pairs(cfg, (runs[0].base_url, runs[1].base_url), workload, pair0, bar),
                    timeout=cfg.run.run_timeout_s))  # fmt: skip
            for a, run in enumerate(runs):
                extra = [{"pair": pair0 + k, "round": round_index, "first": first_arm_of(pair0 + k) == a,
                          "wall_start_ns": walls[a][k][0], "wall_end_ns": walls[a][k][1]}
                         for k in range(len(results[a]))]  # fmt: skip
                run.finish(results[a], busy[a], extra)
    except (ServerError, TimeoutError, RunFailed) as e:
        reason = failure_reason(cfg, e)
        return [run.write_status(reason) for run in runs]
    return [run.write_status() for run in runs]


def run_paired(cfg: BenchConfig, workload: Workload) -> list[dict]:
    """Every round of the paired design; a round whose two runs are both ok is skipped on resume."""
    statuses: list[dict] = []
    for r in tqdm(range(cfg.run.repeats), desc="paired rounds", unit="round"):
        dirs = [cfg.out_dir / "runs" / run_dir_name(2 * r + a, arm) for a, arm in enumerate(cfg.arms)]
        if all(run_is_done(d) for d in dirs):
            statuses += [read_json(d / "status.json") for d in dirs]
            continue
        round_statuses = run_round(cfg, workload, r)
        for s in round_statuses:
            if s["status"] != "ok":
                tqdm.write(f"round {r} {s['arm']} ({s['backend']}) FAILED: {s['reason'].splitlines()[0]}")
        statuses += round_statuses
    return statuses
