"""One A/B serve run: for each repeat in ABBA order, start a server, warm it up, replay the workload, record.

Layout of a run directory:
  config.yaml, environment.json, workload.json          what was asked and on what
  runs/NN-<backend>/server.log                           the server's own log
  runs/NN-<backend>/requests.jsonl                       one line per request (times, tokens, errors)
  runs/NN-<backend>/telemetry.jsonl                      /metrics, memory and tagma telemetry over time
  runs/NN-<backend>/summary.json                         metrics of this run (vllm bench serve's keys +)
  runs/NN-<backend>/status.json                          ok | failed with the reason; written last
Re-running with the same run directory skips the runs whose status is ok (resume); failed ones are retried.
A server that dies or hangs fails its run with the reason, and the remaining runs go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from tqdm import tqdm

from harness.ab import abba_order
from harness.arrivals import arrival_offsets
from harness.client import RequestResult, run_requests
from harness.config import BenchConfig
from harness.files import read_json, write_json, write_jsonl
from harness.launcher import Server, ServerError, ServerSpec
from harness.metrics import summarize
from harness.server_telemetry import TelemetrySampler
from harness.workload import Workload
from tagma.contract import ENV_TELEMETRY_FILE, ENV_TELEMETRY_INTERVAL_S, PLACEMENT_TELEMETRY_FILE


class RunFailed(RuntimeError):
    pass


def request_row(r: RequestResult) -> dict:
    row = dataclasses.asdict(r)
    row.pop("text", None)
    ms = lambda x: None if x is None else x * 1000.0  # noqa: E731
    row.update(ttft_ms=ms(r.ttft), tpot_ms=ms(r.tpot), e2el_ms=ms(r.e2el), itl_ms=[x * 1000.0 for x in r.itl])
    return row


def server_spec(cfg: BenchConfig, backend: str, run_dir: Path) -> ServerSpec:
    s = cfg.server
    env = {
        **s.env,
        ENV_TELEMETRY_FILE: str(run_dir / PLACEMENT_TELEMETRY_FILE),
        ENV_TELEMETRY_INTERVAL_S: f"{cfg.run.telemetry_interval_s:g}",
    }
    return ServerSpec(
        model=cfg.model.path,
        backend=backend,
        dtype=s.dtype,
        max_model_len=s.max_model_len,
        kv_cache_space_gib=s.kv_cache_space_gib,
        num_gpu_blocks_override=s.num_gpu_blocks_override,
        extra_args=s.extra_args,
        env=env,
        startup_timeout_s=s.startup_timeout_s,
    )


def run_is_done(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    return status.exists() and read_json(status).get("status") == "ok"


async def _replay(cfg: BenchConfig, server: Server, workload: Workload, bar: tqdm) -> tuple[list, float]:
    offsets = arrival_offsets(len(workload.requests), cfg.load)
    return await asyncio.wait_for(
        run_requests(
            server.base_url,
            cfg.model.path,
            workload.requests,
            offsets,
            max_concurrency=cfg.load.max_concurrency if cfg.load.mode == "closed" else None,
            timeout_s=cfg.run.request_timeout_s,
            progress=lambda _r: bar.update(1),
        ),
        timeout=cfg.run.run_timeout_s,
    )


def _warm_up(cfg: BenchConfig, server: Server, workload: Workload) -> None:
    if not workload.warmup:
        return
    results, _ = asyncio.run(
        run_requests(
            server.base_url, cfg.model.path, workload.warmup, [0.0] * len(workload.warmup),
            max_concurrency=1, timeout_s=cfg.run.request_timeout_s,
        )
    )  # fmt: skip
    failed = [r for r in results if not r.success]
    if failed:
        raise RunFailed(f"warm-up failed: {failed[0].error_kind}: {failed[0].error}")


def run_one(cfg: BenchConfig, backend: str, index: int, workload: Workload, run_dir: Path) -> dict:
    """One server lifetime. Returns its status dict (also written to status.json, last)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    status: dict = {"backend": backend, "index": index, "status": "failed", "reason": None}
    status["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    try:
        with Server(server_spec(cfg, backend, run_dir), run_dir / "server.log") as server:
            status.update(startup_s=server.startup_s, kv_capacity_tokens=server.kv_capacity_tokens)
            _warm_up(cfg, server, workload)
            assert server.proc is not None
            sampler = TelemetrySampler(
                server.base_url, server.proc.pid, cfg.run.telemetry_interval_s,
                run_dir / PLACEMENT_TELEMETRY_FILE,
            )  # fmt: skip
            desc = f"run {index:02d} {backend}"
            with sampler, tqdm(total=len(workload.requests), desc=desc, unit="req", leave=False) as bar:
                results, duration = asyncio.run(_replay(cfg, server, workload, bar))
            if not server.alive():
                raise RunFailed(f"server died mid-run\n{server.log_tail()}")
            write_jsonl(run_dir / "requests.jsonl", [request_row(r) for r in results])
            write_jsonl(run_dir / "telemetry.jsonl", sampler.samples)
            summary = summarize(results, duration, cfg.run.slos)
            summary.update(backend=backend, index=index, kv_capacity_tokens=server.kv_capacity_tokens)
            write_json(run_dir / "summary.json", summary)
            status.update(status="ok", completed=summary["completed"], failed=summary["failed"])
    except ServerError as e:
        status["reason"] = f"server: {e}"
    except TimeoutError:
        status["reason"] = f"run exceeded run_timeout_s={cfg.run.run_timeout_s:.0f} s (server hung?)"
    except RunFailed as e:
        status["reason"] = str(e)
    status["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json(run_dir / "status.json", status)
    return status


def run_ab(cfg: BenchConfig, workload: Workload) -> list[dict]:
    """Every repeat of both backends in ABBA order; skips runs already done in cfg.out_dir."""
    order = abba_order(cfg.run.repeats, *cfg.backends)
    statuses = []
    for index, backend in enumerate(tqdm(order, desc="A/B runs", unit="run")):
        run_dir = cfg.out_dir / "runs" / f"{index:02d}-{backend}"
        if run_is_done(run_dir):
            statuses.append(read_json(run_dir / "status.json"))
            continue
        status = run_one(cfg, backend, index, workload, run_dir)
        if status["status"] != "ok":
            tqdm.write(f"run {index:02d} {backend} FAILED: {status['reason'].splitlines()[0]}")
        statuses.append(status)
    return statuses
