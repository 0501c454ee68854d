"""Run one group of the regime map: server lifetimes in ABBA order, each serving every cell of the group.

Layout of a group's directory (``<map dir>/<group>`` or ``<map dir>/<group>-aa`` for an A/A):
  group.json                                   the group, its cells, the arms, the profile
  rates.json                                   open cells' request rates, fixed once from the baseline's runs
  lifetimes/NN-<arm>-<backend>/aK/             one server process (attempt K of lifetime NN): server.log,
                                               host_time.*.jsonl, status.json
  lifetimes/warmup-<arm>-<backend>/aK/         an unmeasured lifetime before a call's first measured one
                                               (``warmup_lifetimes``): the first server of a job ran
                                               slower than the rest, so it takes that place unrecorded
  cells/<cell>/config.json, workload.json      the cell as a plain A/B run directory (what analysis reads)
  cells/<cell>/runs/NN-<arm>-<backend>/        the cell's segment of lifetime NN: requests.jsonl,
                                               summary.json, telemetry.jsonl, status.json (with the
                                               lifetime's host-time directory and the segment's time window)
Resume: a segment whose status is ok is never run again; a lifetime with segments left starts a new server
(a new attempt folder, so no earlier attempt's host-time files are touched). A server that dies fails the
segment it was serving with the reason and leaves the group's other segments of that lifetime to the next
attempt; the group goes on with the next lifetime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness.config import Arm, BenchConfig
from harness.designs.abba import abba_order, replay_workload, unmeasured_lifetime
from harness.designs.server_run import RunFailed, ServerRun, request_row, run_dir_name
from harness.files import read_json, write_json, write_jsonl
from harness.metrics import summarize
from harness.regime.cells import CellSpec, GroupSpec
from harness.serve.noise import loadavg_1min, pinned
from harness.workload.arrivals import LoadSpec
from harness.workload.lengths import LengthDist
from harness.workload.registry import build_workload
from harness.workload.spec import Workload, WorkloadSpec

__all__ = ["GroupRun", "segment_done"]

WARMUP_PROMPT_TOKENS = 256


def segment_done(seg_dir: Path) -> bool:
    status = seg_dir / "status.json"
    return status.exists() and read_json(status).get("status") == "ok"


def _cell_workload_spec(cell: CellSpec, max_model_len: int) -> WorkloadSpec:
    if cell.load == "trace":
        assert cell.trace is not None
        fields = {
            "name": f"regime-{cell.name}",
            "kind": "mooncake",
            "num_requests": cell.num_requests,
            "output_len": {"kind": "natural", "high": cell.output_tokens},
            "max_model_len": max_model_len,
            "seed": cell.seed,
            **{k: v for k, v in cell.trace.items() if k != "num_requests"},
        }
        return WorkloadSpec.from_dict(fields)
    return WorkloadSpec(
        name=f"regime-{cell.name}",
        num_requests=cell.num_requests,
        max_model_len=max_model_len,
        input_len=LengthDist("uniform", low=cell.prompt_low, high=cell.prompt_tokens),
        output_len=LengthDist("fixed", value=cell.output_tokens),
        seed=cell.seed,
    )


class GroupRun:
    """One group of one map, for one pair of arms (an A/B, or an A/A when both arms are one backend)."""

    def __init__(
        self,
        base: BenchConfig,
        group: GroupSpec,
        out_dir: Path,
        repeats: int,
        primary_metrics: tuple[str, ...],
        profile: str,
        warmup_lifetimes: int = 1,
    ) -> None:
        self.group, self.dir, self.repeats, self.profile = group, out_dir, repeats, profile
        self.warmup_lifetimes = warmup_lifetimes
        server = dataclasses.replace(
            base.server,
            max_model_len=group.max_model_len,
            kv_cache_space_gib=group.kv_cache_space_gib,
            extra_args=(*base.server.extra_args, *group.server_args()),
        )
        run = dataclasses.replace(
            base.run,
            design="abba",
            repeats=repeats,
            primary_metrics=primary_metrics or base.run.primary_metrics,
        )
        warm = WorkloadSpec(
            name="regime-warmup",
            num_requests=1,
            num_warmup=2,
            max_model_len=group.max_model_len,
            input_len=LengthDist("fixed", value=WARMUP_PROMPT_TOKENS),
            output_len=LengthDist("fixed", value=8),
            seed=10_000,
        )
        self.base = dataclasses.replace(
            base, server=server, run=run, workload=warm, load=LoadSpec(mode="closed", max_concurrency=1)
        )
        self.workloads: dict[str, Workload] = {}

    # ---- what each cell is
    def cell_config(self, cell: CellSpec, rate: float | None = None) -> BenchConfig:
        spec = _cell_workload_spec(cell, self.group.max_model_len)
        if cell.load == "closed":
            load = LoadSpec(mode="closed", max_concurrency=cell.concurrency, seed=cell.seed)
        elif cell.load == "open":
            load = LoadSpec(mode="open", request_rate=rate, seed=cell.seed)
        else:
            load = LoadSpec(mode="trace", seed=cell.seed)
        return dataclasses.replace(
            self.base, workload=spec, load=load, out_dir=self.dir / "cells" / cell.name
        )

    def cell_record(self, cell: CellSpec, cfg: BenchConfig) -> dict[str, Any]:
        """The cell's config.json: the keys a plain run's config.json has, plus the cell and its group."""
        return {
            "backends": list(cfg.backends),
            "model": dataclasses.asdict(cfg.model),
            "server": {**dataclasses.asdict(cfg.server), "extra_args": list(cfg.server.extra_args)},
            "workload": _plain(dataclasses.asdict(cfg.workload)),
            "load": dataclasses.asdict(cfg.load),
            "run": {**dataclasses.asdict(cfg.run), "primary_metrics": list(cfg.run.primary_metrics)},
            "regime": {
                "profile": self.profile,
                "group": self.group.name,
                "prefix_caching": self.group.prefix_caching,
                "cell": cell.to_dict(),
            },
        }

    # ---- preparation: every workload built before any server starts
    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json(
            self.dir / "group.json",
            {
                "profile": self.profile,
                "group": _plain(dataclasses.asdict(self.group)),
                "backends": list(self.base.backends),
                "repeats": self.repeats,
            },
        )
        tok, cache = self.base.model.tokenizer_dir, self.base.data_dir / "workloads"
        self.workloads["__warmup__"] = build_workload(self.base.workload, tok, cache)
        for cell in tqdm(self.group.cells, desc=f"{self.group.name}: workloads", unit="cell", leave=False):
            cfg = self.cell_config(cell, rate=1.0)
            wl = build_workload(cfg.workload, tok, cache)
            self.workloads[cell.name] = wl
            cell_dir = cfg.out_dir
            cell_dir.mkdir(parents=True, exist_ok=True)
            write_json(cell_dir / "config.json", self.cell_record(cell, cfg))
            write_json(
                cell_dir / "workload.json",
                {
                    "spec": _plain(dataclasses.asdict(cfg.workload)),
                    "provenance": wl.provenance,
                    "prompt_lengths": wl.prompt_lengths(),
                    "output_lengths": wl.output_lengths(),
                    "num_warmup": 0,
                    "from_cache": wl.from_cache,
                    "build_seconds": wl.build_seconds,
                },
            )

    # ---- open cells' rates
    def rate(self, cell: CellSpec) -> float | None:
        """The open cell's request rate: ``knee_fraction`` x the baseline arm's request throughput in the
        closed cell it names, from the earliest baseline segment that finished; fixed once found."""
        path = self.dir / "rates.json"
        rates = read_json(path) if path.exists() else {}
        if cell.name in rates:
            return float(rates[cell.name]["rate"])
        baseline = self.base.arms[0]
        runs = self.dir / "cells" / str(cell.rate_from) / "runs"
        for seg in sorted(runs.glob(f"*-{baseline.name}-{baseline.backend}")) if runs.exists() else ():
            if segment_done(seg):
                thr = float(read_json(seg / "summary.json")["request_throughput"])
                rates[cell.name] = {
                    "rate": thr * float(cell.knee_fraction or 0),
                    "from": str(seg.relative_to(self.dir)),
                    "closed_request_throughput": thr,
                    "knee_fraction": cell.knee_fraction,
                }
                write_json(path, rates)
                return float(rates[cell.name]["rate"])
        return None

    # ---- running
    def pending(self, index: int, arm: Arm) -> list[CellSpec]:
        name = run_dir_name(index, arm)
        return [c for c in self.group.cells if not segment_done(self.dir / "cells" / c.name / "runs" / name)]

    def run(self) -> list[dict[str, Any]]:
        """Every lifetime in ABBA order (skipping what is done). Returns every segment's status."""
        self.prepare()
        order = abba_order(self.repeats, *self.base.arms)
        todo = [(index, arm) for index, arm in enumerate(order) if self.pending(index, arm)]
        if todo:
            for _ in range(self.warmup_lifetimes):
                self.warmup_lifetime(todo[0][1])
        for index, arm in tqdm(todo, desc=f"{self.group.name}: lifetimes", unit="lifetime"):
            self.lifetime(index, arm)
        return [
            read_json(p)
            for c in self.group.cells
            for p in sorted((self.dir / "cells" / c.name / "runs").glob("*/status.json"))
        ]

    def warmup_lifetime(self, arm: Arm) -> None:
        """An unmeasured lifetime (:func:`harness.designs.abba.unmeasured_lifetime`) before this call's first
        measured one, serving the group's first closed cell once."""
        life_dir = _next_attempt(self.dir / "lifetimes" / f"warmup-{arm.name}-{arm.backend}")
        cell = next((c for c in self.group.cells if c.load == "closed"), None)
        workload = self.workloads[cell.name] if cell is not None else None
        replay_cfg = self.cell_config(cell) if cell is not None else self.base
        unmeasured_lifetime(
            self.base, arm, self.workloads["__warmup__"], workload, replay_cfg, life_dir,
            cell=cell.name if cell else None,
        )  # fmt: skip

    def lifetime(self, index: int, arm: Arm) -> None:
        life_dir = _next_attempt(self.dir / "lifetimes" / run_dir_name(index, arm))
        server = ServerRun(self.base, arm, index, life_dir)
        pending = self.pending(index, arm)
        failed: str | None = None
        try:
            with server:
                server.warm_up(self.workloads["__warmup__"])
                server.begin_replay()
                for cell in pending:
                    if failed is not None:
                        break
                    failed = self.segment(server, cell, index, arm, life_dir)
                if self.base.run.host_time and failed is None:
                    # the server writes host-time lines on its telemetry interval: one more line holds the
                    # last segment's final steps (stopped sooner, a short segment would have none)
                    time.sleep(self.base.run.telemetry_interval_s + 0.5)
                if server.sampler is not None:
                    server.sampler.__exit__(None, None, None)
                    server.sampler = None
        except Exception as e:  # noqa: BLE001 - a server that fails to start or dies: recorded, map goes on
            failed = f"{type(e).__name__}: {e}"
        write_json(
            life_dir / "status.json",
            {
                **server.status,
                "status": "failed" if failed else "ok",
                "reason": failed,
                "cells": [c.name for c in pending],
            },
        )

    def segment(self, server: ServerRun, cell: CellSpec, index: int, arm: Arm, life_dir: Path) -> str | None:
        """One cell's segment of a lifetime; returns a failure reason or None."""
        seg_dir = self.dir / "cells" / cell.name / "runs" / run_dir_name(index, arm)
        seg_dir.mkdir(parents=True, exist_ok=True)
        status: dict[str, Any] = {
            "arm": arm.name,
            "backend": arm.backend,
            "index": index,
            "status": "failed",
            "reason": None,
            "design": "abba",
            "cell": cell.name,
            "group": self.group.name,
            "lifetime_attempt": life_dir.name,
            "host_time_dir": os.path.relpath(life_dir, seg_dir),
            "loadavg_before": round(loadavg_1min(), 2),
        }
        rate = self.rate(cell) if cell.load == "open" else None
        if cell.load == "open" and rate is None:
            status["reason"] = f"no finished baseline segment of {cell.rate_from} to take the rate from"
            write_json(seg_dir / "status.json", status)
            return None  # not the server's fault: the lifetime goes on
        cfg = self.cell_config(cell, rate)
        wl = self.workloads[cell.name]
        status["replay_start_ns"] = time.time_ns()
        first_sample = len(server.sampler.samples) if server.sampler is not None else 0
        try:
            with (
                pinned(server.client_cores()),
                tqdm(
                    total=len(wl.requests),
                    leave=False,
                    unit="req",
                    desc=f"{index:02d} {arm.label} {cell.name}",
                ) as bar,
            ):
                results, duration = asyncio.run(replay_workload(cfg, server.base_url, wl, bar))
            status["replay_end_ns"] = time.time_ns()
            assert server.server is not None
            if server.server.died():
                raise RunFailed(f"{arm.label} server died during {cell.name}\n{server.server.log_tail()}")
        except (TimeoutError, RunFailed) as e:
            status["reason"] = str(e) or type(e).__name__
            write_json(seg_dir / "status.json", status)
            return status["reason"]
        write_jsonl(seg_dir / "requests.jsonl", [request_row(r) for r in results])
        summary = summarize(results, duration, cfg.run.slos)
        summary.update(arm=arm.name, backend=arm.backend, index=index, request_rate=rate)
        write_json(seg_dir / "summary.json", summary)
        samples = server.sampler.samples[first_sample:] if server.sampler is not None else []
        write_jsonl(seg_dir / "telemetry.jsonl", samples)
        status.update(
            status="ok",
            completed=summary["completed"],
            failed=summary["failed"],
            loadavg_after=round(loadavg_1min(), 2),
            duration_s=round(duration, 3),
        )
        write_json(seg_dir / "status.json", status)
        return None


def _next_attempt(root: Path) -> Path:
    """The folder of a lifetime's next attempt: ``root/aK``, K one past the attempts already there."""
    attempt = 1 + len(list(root.glob("a*"))) if root.exists() else 1
    return root / f"a{attempt}"


def _plain(x: Any) -> Any:
    """A JSON-ready copy (tuples as lists, paths as strings)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x
