"""One server lifetime recorded in one run directory, shared by the designs (harness.designs).

Layout of a run directory:
  config.yaml, config.json, environment.json, workload.json   what was asked and on what
  runs/NN-<arm>-<backend>/server.log                           the server's own log
  runs/NN-<arm>-<backend>/requests.jsonl                       one line per request (times, tokens, errors)
  runs/NN-<arm>-<backend>/telemetry.jsonl                      /metrics, memory and tagma telemetry over time
  runs/NN-<arm>-<backend>/host_time.jsonl                      in-server CPU time per scheduler step
  runs/NN-<arm>-<backend>/summary.json                         metrics of this run (vllm bench serve's keys +)
  runs/NN-<arm>-<backend>/status.json                          ok | failed, the reason, noise; written last
An arm is ``baseline`` or ``candidate`` (an A/A gives both the same backend). Re-running with the same run
directory skips the runs whose status is ok (resume); failed ones are retried. A server that dies or hangs
fails its run with the reason, and the remaining runs go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import tagma.contract as contract
from harness.client import RequestResult, run_requests
from harness.config import Arm, BenchConfig
from harness.files import read_json, write_json, write_jsonl
from harness.metrics import summarize
from harness.serve.launcher import Server, ServerError, ServerSpec
from harness.serve.noise import (
    NoiseProbe,
    NoiseRecord,
    bound_cores,
    client_cores,
    loadavg_1min,
    pin_host_processes,
)
from harness.serve.server_telemetry import TelemetrySampler
from harness.workload.spec import Workload


class RunFailed(RuntimeError):
    pass


def run_dir_name(index: int, arm: Arm) -> str:
    return f"{index:02d}-{arm.name}-{arm.backend}"


def request_row(r: RequestResult) -> dict:
    row = dataclasses.asdict(r)
    row.pop("text", None)
    ms = lambda x: None if x is None else x * 1000.0  # noqa: E731
    row.update(ttft_ms=ms(r.ttft), tpot_ms=ms(r.tpot), e2el_ms=ms(r.e2el), itl_ms=[x * 1000.0 for x in r.itl])
    return row


def server_spec(cfg: BenchConfig, arm: Arm, run_dir: Path) -> ServerSpec:
    s = cfg.server
    env = {
        **s.env,
        contract.ENV_TELEMETRY_FILE: str(run_dir / contract.PLACEMENT_TELEMETRY_FILE),
        contract.ENV_TELEMETRY_INTERVAL_S: f"{cfg.run.telemetry_interval_s:g}",
        # the host-time records are flushed as often (run.telemetry_interval_s says so: see finish())
        contract.ENV_HOST_TIME_FLUSH_S: f"{cfg.run.telemetry_interval_s:g}",
    }
    if cfg.run.host_time:
        env[contract.ENV_HOST_TIME_FILE] = str(run_dir / contract.HOST_TIME_FILE)
        if cfg.run.host_time_groups:
            env[contract.ENV_HOST_TIME_GROUPS] = "1"
    return ServerSpec(
        model=cfg.model.path,
        backend=arm.backend,
        dtype=cfg.model.dtype or s.dtype,
        max_model_len=s.max_model_len,
        kv_cache_space_gib=s.kv_cache_space_gib,
        num_gpu_blocks_override=s.num_gpu_blocks_override,
        extra_args=(*s.extra_args, *cfg.model.server_args),
        env=env,
        startup_timeout_s=s.startup_timeout_s,
        dry_run=s.dry_run,
    )


def run_is_done(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    return status.exists() and read_json(status).get("status") == "ok"


class ServerRun:
    """One server lifetime recorded in one run directory: start, warm up, sample telemetry, write results.

    Used as a context manager; the server is always stopped on exit. ``finish`` writes requests.jsonl,
    telemetry.jsonl and summary.json; ``status`` is written by the caller through :meth:`write_status`.
    """

    def __init__(self, cfg: BenchConfig, arm: Arm, index: int, run_dir: Path) -> None:
        self.cfg, self.arm, self.index, self.dir = cfg, arm, index, run_dir
        self.status: dict = {"arm": arm.name, "backend": arm.backend, "index": index, "status": "failed",
                             "reason": None, "design": cfg.run.design}  # fmt: skip
        self.server: Server | None = None
        self.sampler: TelemetrySampler | None = None
        self.probe: NoiseProbe | None = None

    def __enter__(self) -> ServerRun:
        self.dir.mkdir(parents=True, exist_ok=True)
        # A retried run starts clean: the server appends to these, and a second server's files would mix in.
        for stale in [*self.dir.glob("host_time.*.jsonl"), self.dir / contract.PLACEMENT_TELEMETRY_FILE]:
            stale.unlink(missing_ok=True)
        self.status["loadavg_before"] = round(loadavg_1min(), 2)
        self.server = Server(server_spec(self.cfg, self.arm, self.dir), self.dir / "server.log")
        self.server.start()
        bound = bound_cores(self.dir / "server.log")
        self.status.update(startup_s=self.server.startup_s, kv_capacity_tokens=self.server.kv_capacity_tokens,
                           enforce_eager=self.server.spec.enforce_eager,
                           bound_cores=sorted(bound))  # fmt: skip
        if self.cfg.run.pin_server_host and self.server.proc is not None:
            cores = client_cores(bound)
            if bound and cores != bound:  # else there is no other core to move the host processes to
                self.status["host_pinned"] = pin_host_processes(self.server.proc.pid, cores)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sampler is not None:
            self.sampler.__exit__(None, None, None)
        if self.server is not None:
            self.server.stop()

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return self.server.base_url

    def warm_up(self, workload: Workload) -> None:
        if not workload.warmup:
            return
        results, _ = asyncio.run(
            run_requests(
                self.base_url, self.cfg.model.path, workload.warmup, [0.0] * len(workload.warmup),
                max_concurrency=1, timeout_s=self.cfg.run.request_timeout_s,
            )
        )  # fmt: skip
        failed = [r for r in results if not r.success]
        if failed:
            raise RunFailed(f"{self.arm.label} warm-up failed: {failed[0].error_kind}: {failed[0].error}")

    def begin_replay(self) -> None:
        """Start telemetry sampling and the noise counters (after warm-up)."""
        assert self.server is not None and self.server.proc is not None
        self.sampler = TelemetrySampler(
            self.base_url, self.server.proc.pid, self.cfg.run.telemetry_interval_s,
            self.dir / contract.PLACEMENT_TELEMETRY_FILE,
        )  # fmt: skip
        self.sampler.__enter__()
        self.status["replay_start_ns"] = time.time_ns()
        self.probe = NoiseProbe(
            self.server.proc.pid, self.status["loadavg_before"], self.cfg.run.quiet_loadavg
        )

    def finish(
        self, results: list[RequestResult], duration: float, extra_rows: list[dict] | None = None
    ) -> None:
        """Stop sampling, check the server survived, write the run's files (status stays for the caller)."""
        assert self.server is not None and self.sampler is not None and self.probe is not None
        noise: NoiseRecord = self.probe.finish()
        if self.cfg.run.host_time:  # the server flushes host-time records on its telemetry interval
            time.sleep(self.cfg.run.telemetry_interval_s + 0.5)
        self.sampler.__exit__(None, None, None)
        samples, self.sampler = self.sampler.samples, None
        if self.server.died():
            raise RunFailed(f"{self.arm.label} server died mid-run\n{self.server.log_tail()}")
        rows = [request_row(r) for r in results]
        for row, extra in zip(rows, extra_rows or [{}] * len(rows), strict=True):
            row.update(extra)
        write_jsonl(self.dir / "requests.jsonl", rows)
        write_jsonl(self.dir / "telemetry.jsonl", samples)
        summary = summarize(results, duration, self.cfg.run.slos)
        summary.update(arm=self.arm.name, backend=self.arm.backend, index=self.index,
                       kv_capacity_tokens=self.server.kv_capacity_tokens)  # fmt: skip
        write_json(self.dir / "summary.json", summary)
        self.status.update(status="ok", completed=summary["completed"], failed=summary["failed"],
                           noise=noise.to_dict())  # fmt: skip

    def client_cores(self) -> set[int] | None:
        if not self.cfg.run.pin_client:
            return None
        return client_cores(bound_cores(self.dir / "server.log"))

    def write_status(self, reason: str | None = None) -> dict:
        if reason is not None:
            self.status.update(status="failed", reason=reason)
        self.status["loadavg_after"] = round(loadavg_1min(), 2)
        write_json(self.dir / "status.json", self.status)
        return self.status


def failure_reason(cfg: BenchConfig, err: BaseException) -> str:
    if isinstance(err, ServerError):
        return f"server: {err}"
    if isinstance(err, TimeoutError):
        return f"run exceeded run_timeout_s={cfg.run.run_timeout_s:.0f} s (server hung?)"
    return str(err)
